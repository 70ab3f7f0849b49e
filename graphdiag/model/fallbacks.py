"""Which of a preset's weights llama.cpp's quantizer would store in another type than --wtype, said in a line;
and the types a model's weights are stored in, counted."""

from __future__ import annotations

from ..ir.dtypes import block_size


def fallback_note(model) -> str:
    """One line naming the preset weights stored in llama.cpp's fallback type ('' when none), e.g.
    'Q4_K weights with rows no multiple of 256 fell back as llama.cpp's quantizer does: blk.0-3.ffn_down
    (1408 wide) -> Q5_0'."""
    if not model.fallbacks:
        return ""
    groups: dict[tuple[str, int, str], list[str]] = {}
    by_name = {t.name: t for t in model.tensors()}
    for name, t in model.fallbacks.items():
        parts = name.split(".")
        layer, stem = (parts[1], ".".join(parts[2:-1])) if parts[0] == "blk" else ("", ".".join(parts[:-1]))
        groups.setdefault((stem, by_name[name].ne[0], t.name), []).append(layer)
    items = []
    for (stem, ne0, to), layers in groups.items():
        where = f"blk.{_span(layers)}.{stem}" if layers[0] else stem
        items.append(f"{where} ({ne0} wide) -> {to}")
    what = model.mix.label if getattr(model, "mix", None) else model.wtype.name
    return (f"{what} weights with rows no multiple of {block_size(model.wtype)} fell back as "
            f"llama.cpp's quantizer does: " + ", ".join(items))


def type_counts(types) -> str:
    """'Q3_K ×14, Q4_K ×6, Q6_K ×1': each type but F32 (norms, router) with its tensor count, most first."""
    n: dict[str, int] = {}
    for t in types:
        n[t.name] = n.get(t.name, 0) + 1
    quant = sorted(((k, c) for k, c in n.items() if k != "F32"), key=lambda x: (-x[1], x[0]))
    return ", ".join(f"{k} ×{c}" for k, c in quant) or "F32"


def mix_summary(model) -> str:
    """A preset in a llama.cpp ftype mix: 'q3_k_m: Q3_K ×14, Q4_K ×6, ...' over its weights ('' otherwise)."""
    if getattr(model, "mix", None) is None:
        return ""
    return f"{model.mix.name}: " + type_counts(t.type for t in model.tensors() if not t.name.startswith("cache_"))


def _span(layers: list[str]) -> str:
    """'0-3' for consecutive layer numbers, else them comma-separated."""
    n = sorted(int(x) for x in layers)
    return f"{n[0]}-{n[-1]}" if len(n) > 1 and n == list(range(n[0], n[-1] + 1)) else ",".join(map(str, n))
