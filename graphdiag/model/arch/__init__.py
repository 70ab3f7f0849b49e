"""The architectures graphdiag builds, one module each: the registry `ARCHS` (general.architecture -> module).

Each module gives, for its architecture as llama.cpp 0c1e57098 builds it:
  NAME                 the GGUF `general.architecture` value
  ROPE_TYPE            ggml's rope mode for it (llama_model_rope_type: NORM for llama, NEOX for qwen2/qwen3/qwen3moe/
                       gemma3/gpt-oss)
  EXPERTS              the cfg.is_moe values its graph can express: (False,) dense only, (True,) experts only
                       (qwen3moe), (False, True) either (llama); EXPERT_FF_KEY, where experts are possible, is
                       the key a file gives their width under (llama: feed_forward_length)
  config(meta)         the ModelConfig from a file's metadata (common.Meta), llama.cpp's defaults for absent keys,
                       refusing (UsageError, one line) what graphdiag's graph of it does not compute
  tensors(cfg)         the persistent weights (common.TensorSpec: name, ne, kind, field) in creation order: what
                       a file must hold (each checked up front) and what a preset of that arch is made of
  preset(cfg)          a preset's shapes as this architecture (export-gguf --arch)
  Builder              the graph builder (a model/graph_context.GraphContext subclass: upstream's ops, order,
                       names, views)
  Reference            the independent numpy forward (a model/reference_base.ReferenceBase subclass)
The modules use only those public interfaces; this registry sits above them, and model/build.py and
model/reference.py (which pick a model's builder and oracle) above it.
Adding an architecture (gemma3: model/arch/gemma3.py) is one such module and one entry in ARCHS.
"""

from __future__ import annotations

from types import ModuleType

from ...errors import UsageError
from . import gemma3, gpt_oss, llama, qwen2, qwen3, qwen3moe

ARCHS: dict[str, ModuleType] = {m.NAME: m for m in (llama, qwen2, qwen3, qwen3moe, gemma3, gpt_oss)}


def supported() -> str:
    """'llama, qwen2, qwen3, ...': the architectures graphdiag builds, for messages."""
    return ", ".join(ARCHS)


def get_arch(name: str) -> ModuleType:
    """The module of architecture `name`; UsageError naming the supported ones otherwise."""
    try:
        return ARCHS[name]
    except KeyError:
        raise UsageError(f"architecture {name!r} is not supported (supported: {supported()})") from None
