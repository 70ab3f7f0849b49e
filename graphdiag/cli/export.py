"""`graphdiag export-gguf`: a preset written as a GGUF file (llama, qwen2, qwen3, gemma3; a MoE preset as llama
or qwen3moe) that llama.cpp loads."""

from __future__ import annotations

import click


class _ExportCommand(click.Command):
    """--help ends with the presets and architectures export-gguf takes, read from their registries (imported
    only for --help: they load numpy, which every other command line would pay for)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from ..model.arch import supported
        from ..model.presets import PRESETS
        formatter.write_paragraph()
        formatter.write_text(f"Models (--model): {', '.join(PRESETS)}. Architectures (--arch): {supported()}.")


@click.command("export-gguf", cls=_ExportCommand)
@click.option("--model", default="tiny", show_default=True,
              help="Preset (listed below; moe-tiny is written as llama's MoE, whose router normalises its "
                   "weights; qwen3moe-tiny as qwen3moe; gpt-oss-tiny as gpt-oss).")
@click.option("--wtype", default="f16", show_default=True,
              help="Weight type of the mat-mul weights and the embedding (f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, "
                   "q5_1, iq4_nl, iq4_xs, q3_k, q4_k, q5_k, q6_k; a K-quant or IQ4_XS falls back where rows are no "
                   "multiple of 256, as llama.cpp's), or llama.cpp's mix of one: q2_k (its Q2_K), q3_k_m, q4_k_s, "
                   "q4_k_m, q5_k_s, q5_k_m (Q4_K_M, ...), mxfp4_moe (MXFP4_MOE: MXFP4 experts, Q8_0 elsewhere).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, 2**31 - 1),
              help="The seed of the preset's weights (as `run --seed`).")
@click.option("--arch", default=None,
              help="Architecture to write the preset's shapes as (listed below; a MoE preset: llama, qwen3moe or "
                   "gpt-oss, a dense one: not qwen3moe or gpt-oss).  [default: the preset's own: gemma3 for "
                   "gemma3-tiny, qwen3moe for qwen3moe-tiny, gpt-oss for gpt-oss-tiny, else llama]")
@click.argument("out", type=click.Path(dir_okay=False, writable=True))
def export_gguf(model: str, wtype: str, seed: int, arch: str | None, out: str) -> None:
    """Write preset MODEL (graphdiag's seeded weights, a vocabulary of placeholder pieces: SPM for llama,
    byte-level BPE for the others) as a GGUF of architecture ARCH at OUT, so `graphdiag run --model OUT` and
    llama.cpp run the identical model."""
    from ..errors import UsageError
    from ..model.gguf_io import export_config
    from ..model.gguf_io import export_gguf as write
    from ..model.presets import weight_type
    from ..model.fallbacks import fallback_note, mix_summary
    from ..model.weights import create_model

    if not out.endswith(".gguf"):
        raise UsageError(f"{out}: the output's name must end in .gguf (that is how --model tells a file)")
    if arch is None:
        from ..model.presets import get_preset
        arch = get_preset(model).arch
    cfg = export_config(model, arch)
    m = create_model(cfg, weight_type(wtype), seed=seed)
    n = write(m, out, model)
    what = f"{m.mix.label} ({mix_summary(m).partition(': ')[2]})" if m.mix else m.wtype.name
    click.echo(f"wrote {out}: {model} as {arch} ({cfg.n_layer} layers, n_embd {cfg.n_embd}, vocab {cfg.n_vocab}), "
               f"{what} weights from seed {seed}, {n:,} bytes")
    if m.fallbacks:
        click.echo(fallback_note(m))
