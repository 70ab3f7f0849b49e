"""GGUF model files: a file read into graphdiag's model, and a preset written as one.

Reading (`open_gguf`) dispatches on `general.architecture` to the architecture's module (model/arch/: llama,
qwen2, qwen3, qwen3moe, gemma3, gpt-oss), which takes the hyper-parameters from the metadata with llama.cpp's defaults
for absent keys (`rope.freq_base` 10 000, `head_count_kv` = head_count, `key_length` = n_embd / n_head, ...)
and lists the tensors its graph reads; each is checked — present, of the shape the metadata implies and of a
type graphdiag computes — before anything is built; the tensor data stays memory-mapped (the `gguf`
package's reader) and is viewed, not copied, in the host layout the rest of graphdiag uses (numpy axes
outermost first; a block type as records of ggml's block, graphdiag.quants.BLOCK_DTYPE). Writing
(`export_gguf`) stores a preset's seeded weights with the metadata and a vocabulary (SPM for llama: `<unk>`,
`<s>`, `</s>`, the 256 byte tokens, then placeholder pieces; byte-level BPE for the others) that llama.cpp's
loader accepts, so graphdiag and llama.cpp can run the identical model.

Supported here: the architectures of model/arch/ (llama incl. Mistral-style files, qwen2, qwen3, qwen3moe,
gemma3, gpt-oss), tensor types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K and
Q6_K, and MXFP4 (TYPES).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import UsageError
from ..ir.dtypes import GGMLType, block_size, row_size
from ..quants import BLOCK_DTYPE, type_of
from .presets import ModelConfig, swa_pattern

# GGUF tensor type -> graphdiag's (the same numbers: ggml's enum)
TYPES = {int(t): t for t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0,
                             GGMLType.Q5_1, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q2_K,
                             GGMLType.Q3_K, GGMLType.Q4_1, GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4)}
# llama_ftype of a file whose mat-mul weights are all of one type (general.file_type; K-quants as their _M mix,
# Q2_K as MOSTLY_Q2_K and Q3_K as MOSTLY_Q3_K_S, the mostly-Q3_K one); a preset in a mix writes its own ftype
FILE_TYPE = {GGMLType.F32: 0, GGMLType.F16: 1, GGMLType.Q4_0: 2, GGMLType.Q8_0: 7, GGMLType.Q5_0: 8,
             GGMLType.Q5_1: 9, GGMLType.Q4_K: 15, GGMLType.Q5_K: 17, GGMLType.Q6_K: 18, GGMLType.BF16: 32,
             GGMLType.Q2_K: 10, GGMLType.Q3_K: 11, GGMLType.Q4_1: 3, GGMLType.IQ4_NL: 25, GGMLType.IQ4_XS: 30}
N_SPECIAL = 3 + 256              # <unk> <s> </s> and the byte tokens of the exported vocabulary


@dataclass
class GgufModel:
    """A validated llama GGUF: its config, every tensor's type and (numpy) shape, and the file."""

    path: Path
    cfg: ModelConfig
    types: dict[str, GGMLType] = field(default_factory=dict)
    arch: str = "llama"
    n_bytes: int = 0             # tensor data bytes
    n_elements: int = 0          # weights (elements of every tensor)
    n_ctx_train: int = 0         # {arch}.context_length as the file has it (cfg.n_ctx: at most N_CTX_MAX)

    @property
    def main_type(self) -> GGMLType:
        """The type most of the mat-mul weights (by count) are in: what the model reports as its weight type."""
        by: dict[GGMLType, int] = {}
        for name, t in self.types.items():
            if not name.endswith("norm.weight"):
                by[t] = by.get(t, 0) + 1
        return max(by, key=by.get) if by else GGMLType.F32


def read_gguf(path: Path):
    """The file's reader (metadata and tensor infos read, data memory-mapped); UsageError, one line, for a file
    the gguf package cannot read: missing, truncated, corrupt (general.alignment 0, a tensor named twice...)."""
    try:
        from .gguf_reader import FastGGUFReader as GGUFReader     # the library's, arrays read in one piece
    except ImportError:
        raise UsageError("reading a GGUF file needs the gguf package (pip install gguf)") from None
    try:
        return GGUFReader(path, "r")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such model file") from None
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise UsageError(f"{path}: not a readable GGUF file, truncated or corrupt ({type(e).__name__}: {e})") from None


def _value(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except (ValueError, IndexError, TypeError):
        return default


def open_gguf(path_str: str) -> GgufModel:
    """The file's config and tensor types, every needed tensor checked; UsageError naming what is wrong.
    Read once per file version: the checks are redone when the file's size or modification time changes."""
    try:
        st = Path(path_str).stat()
    except OSError:
        st = None
    return _open(path_str, (st.st_size, st.st_mtime_ns) if st is not None else None)


@lru_cache(maxsize=8)
def _open(path_str: str, version) -> GgufModel:
    from .arch import get_arch, supported
    from .arch.common import Meta
    path = Path(path_str)
    r = read_gguf(path)
    arch = _value(r, "general.architecture")
    if not isinstance(arch, str) or arch not in _archs():
        raise UsageError(f"{path}: architecture {arch!r} is not supported (supported: {supported()})")
    infos = {t.name: t for t in r.tensors}
    shape_of = lambda n: tuple(int(x) for x in infos[n].shape) if n in infos else None
    mod = get_arch(arch)
    cfg = mod.config(Meta(path, arch, lambda k, d=None: _value(r, k, d), set(infos), shape_of))
    types, n_bytes, n_elements = {}, 0, 0
    for spec in mod.tensors(cfg):
        types[spec.name] = _check_tensor(path, arch, cfg, spec, infos.get(spec.name), len(r.data))
        n_bytes += int(infos[spec.name].n_bytes)
        n_elements += int(infos[spec.name].n_elements)
    n_ctx_train = _value(r, f"{arch}.context_length", cfg.n_ctx)
    return GgufModel(path, cfg, types, arch, n_bytes, n_elements, int(n_ctx_train))


def _archs() -> dict:
    from .arch import ARCHS
    return ARCHS


def _arch(name: str):
    from .arch import get_arch
    return get_arch(name)


def _check_tensor(path: Path, arch: str, cfg: ModelConfig, spec, t, n_data: int) -> GGMLType:
    """The type of the file's tensor `spec` describes; UsageError naming it if it is missing, of another shape,
    of a type graphdiag does not compute, or past the end of the file."""
    name, ne = spec.name, spec.ne
    if t is None:
        raise UsageError(f"{path}: tensor {name} is missing (a {arch} model of {cfg.n_layer} layers needs it)")
    got = tuple(int(x) for x in t.shape)
    while len(got) > len(ne) and got[-1] == 1:
        got = got[:-1]
    if got != ne:
        raise UsageError(f"{path}: tensor {name} has shape {list(got)}, expected {list(ne)} from the metadata")
    gt = TYPES.get(int(t.tensor_type))
    if gt is None or (spec.f32_only and gt != GGMLType.F32):
        raise UsageError(f"{path}: tensor {name} is {t.tensor_type.name}, which graphdiag does not compute "
                         f"(supported: {'F32' if spec.f32_only else ', '.join(x.name for x in TYPES.values())})")
    _check_bytes(path, name, gt, ne, int(t.n_bytes))
    if t.data_offset + t.n_bytes > n_data:
        raise UsageError(f"{path}: tensor {name} runs past the end of the file (truncated?)")
    return gt


def _check_bytes(path: Path, name: str, t: GGMLType, ne: tuple[int, ...], n_bytes: int) -> None:
    """A tensor's rows must hold whole blocks of its type, and its data the bytes its shape implies."""
    if ne[0] % block_size(t):
        raise UsageError(f"{path}: tensor {name} is {t.name} with rows of {ne[0]} elements, no multiple of its "
                         f"{block_size(t)}-element block")
    want = row_size(t, ne[0]) * int(np.prod(ne[1:], dtype=np.int64))
    if n_bytes != want:
        raise UsageError(f"{path}: tensor {name} holds {n_bytes:,} bytes; {t.name} of shape {list(ne)} is {want:,}")


def expected_tensors(cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(name, ggml ne, F32 only) of every weight graphdiag's graph of cfg.arch reads, in its creation order."""
    from .arch import get_arch
    for spec in get_arch(cfg.arch).tensors(cfg):
        yield spec.name, spec.ne, spec.f32_only


class FileWeights(Mapping):
    """name -> the file's tensor as graphdiag's host array (a memory-mapped view: nothing is copied)."""

    def __init__(self, g: GgufModel):
        self.g = g
        self._r = None
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.g.types:
            raise KeyError(name)
        got = self._cache.get(name)
        if got is None:
            if self._r is None:
                self._r = read_gguf(self.g.path)
                self._by = {t.name: t for t in self._r.tensors}
            t = self._by[name]
            got, dt = t.data, BLOCK_DTYPE[self.g.types[name]]
            if dt.names:                 # (rows, bytes) -> (rows, blocks) of the type's block records
                got = got.view(np.uint8).view(dt)
            self._cache[name] = got
        return got

    draw = __getitem__              # what loading asks of a model's host weights

    def __iter__(self) -> Iterator[str]:
        return iter(self.g.types)

    def __len__(self) -> int:
        return len(self.g.types)

    def __contains__(self, name) -> bool:
        return name in self.g.types


def export_config(preset: str, arch: str) -> ModelConfig:
    """Preset `preset`'s shapes as architecture `arch` (what export-gguf writes); UsageError where the
    architecture cannot express the preset: a MoE preset as qwen2, qwen3 or gemma3 (llama.cpp's have no experts),
    a dense one as qwen3moe (which has only experts)."""
    from .arch import get_arch
    from .presets import get_preset
    cfg, mod = get_preset(preset), get_arch(arch)
    _check_experts(cfg, arch, preset)
    return mod.preset(cfg)


def _check_experts(cfg: ModelConfig, arch: str, name: str) -> None:
    """UsageError unless architecture `arch` (its EXPERTS) can express `cfg`'s experts or their absence."""
    from .arch import ARCHS, get_arch
    if cfg.is_moe in get_arch(arch).EXPERTS:
        return
    able = ", ".join(n for n, m in ARCHS.items() if cfg.is_moe in m.EXPERTS)
    what = "has no experts" if cfg.is_moe else "has experts only"
    raise UsageError(f"export-gguf cannot write {'MoE' if cfg.is_moe else 'dense'} preset {name} as {arch}: "
                     f"llama.cpp's {arch} {what} (use --arch {able})")


def export_gguf(model, out: str | Path, name: str) -> int:
    """Write `model` (a preset with values: Model.host) as a GGUF of its architecture (cfg.arch) at `out`;
    returns the file's bytes. llama gets an SPM vocabulary, the others a byte-level BPE one (model/bpe_vocab.py).
    A MoE preset is written as llama's MoE (Mixtral-style: expert_count, expert_used_count, the expert stacks
    blk.N.ffn_gate_inp / ffn_gate_exps / ffn_up_exps / ffn_down_exps), which llama.cpp builds with its router
    weights normalised (model/arch/llama.py), or as qwen3moe (the same stacks, the experts' width as
    expert_feed_forward_length: model/arch/qwen3moe.py)."""
    from gguf import GGMLQuantizationType, GGUFWriter, TokenType
    cfg = model.cfg
    _check_experts(cfg, cfg.arch, name)
    out = Path(out)
    w = GGUFWriter(str(out), cfg.arch)
    mix = getattr(model, "mix", None)
    w.add_name(f"graphdiag {name} ({mix.label if mix else model.wtype.name}, seed {model.seed})")
    write_shape(w, cfg)
    w.add_file_type(mix.ftype if mix else FILE_TYPE[model.wtype])
    if cfg.arch == "llama":
        _write_spm_vocab(w, cfg.n_vocab, TokenType)
    else:
        from .bpe_vocab import write_bpe_vocab
        write_bpe_vocab(w, cfg.n_vocab)
    for n, _, _ in expected_tensors(cfg):
        a = model.host[n]
        if a.dtype.names:            # blocks written as their bytes, typed for the reader
            w.add_tensor(n, np.ascontiguousarray(a).view(np.uint8),
                         raw_dtype=GGMLQuantizationType(int(type_of(a))))
        else:
            w.add_tensor(n, np.ascontiguousarray(a))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        w.close()
    return out.stat().st_size


def write_shape(w, cfg: ModelConfig) -> None:
    """The hyper-parameters llama.cpp's loader needs, under the writer's architecture (key_length and
    value_length only where head_dim is not n_embd / n_head, as the converters write them). A MoE config's
    experts: their count, the count used per token, and their FFN width under the architecture's
    EXPERT_FF_KEY: feed_forward_length for llama (what its loader sizes the expert stacks by; the Mixtral
    converter writes it so), expert_feed_forward_length for qwen3moe (which then needs no
    feed_forward_length: written only where the config has a dense width)."""
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    widths = {"feed_forward_length": cfg.n_ff} if cfg.n_ff else {}
    if cfg.is_moe:                    # llama's key is feed_forward_length itself: the experts' width wins
        widths[_arch(cfg.arch).EXPERT_FF_KEY] = cfg.n_ff_exp
    for key, n in widths.items():
        w.add_uint32(f"{cfg.arch}.{key}", n)
    if cfg.is_moe:
        w.add_expert_count(cfg.n_expert)
        w.add_expert_used_count(cfg.n_expert_used)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    if cfg.n_embd_head:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    _write_window(w, cfg)
    _write_yarn(w, cfg)


def _write_yarn(w, cfg: ModelConfig) -> None:
    """gpt-oss's YaRN, as its converter writes it: rope.scaling.type yarn, .factor, .original_context_length."""
    factor = getattr(cfg, "yarn_factor", 0.0)
    if factor <= 0:
        return
    from gguf import RopeScalingType
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(factor)
    w.add_rope_scaling_orig_ctx_len(cfg.yarn_orig_ctx)


def _write_window(w, cfg: ModelConfig) -> None:
    """The sliding window (Gemma 3, gpt-oss), as their converters write it: attention.sliding_window,
    rope.freq_base_swa, and the pattern only where it is not the architecture's default (its SWA_PATTERN:
    gpt-oss 2, else llama.cpp's 6; an absent window means none, on both sides: models/gemma3.cpp,
    arch/gemma3.py)."""
    n_swa = getattr(cfg, "n_swa", 0)
    if n_swa <= 0:
        return
    w.add_sliding_window(n_swa)
    w.add_rope_freq_base_swa(cfg.rope_base_swa)
    default = getattr(_arch(cfg.arch), "SWA_PATTERN", None)
    if tuple(cfg.swa_layers) != tuple(swa_pattern(cfg.n_layer, *(() if default is None else (default,)))):
        w.add_sliding_window_pattern([bool(x) for x in cfg.swa_layers])


def _write_spm_vocab(w, n_vocab: int, TokenType) -> None:
    """The SPM tokenizer fields of _vocab's pieces: unk 0, bos 1, eos 2."""
    tokens, types = _vocab(n_vocab, TokenType)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def _vocab(n_vocab: int, TokenType) -> tuple[list[str], list[int]]:
    """An SPM vocabulary of n_vocab pieces llama.cpp loads: <unk> <s> </s>, the byte tokens, placeholders."""
    if n_vocab < N_SPECIAL + 1:
        raise UsageError(f"a vocabulary of {n_vocab} tokens has no room for the {N_SPECIAL} special and byte tokens")
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, *([TokenType.BYTE] * 256)]
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    types += [TokenType.NORMAL] * (n_vocab - len(types))
    return tokens, [int(t) for t in types]


def detokenizer(path: str | Path):
    """ids -> text through the file's vocabulary, as llama.cpp's token_to_piece joins pieces: SPM ("llama":
    "▁" is a space, <0xNN> a byte) and byte-level BPE ("gpt2": each character stands for one byte); None for
    a file with another tokenizer or none. Exact for the pieces; special tokens print as their text."""
    r = read_gguf(Path(path))
    kind, pieces = _value(r, "tokenizer.ggml.model"), _value(r, "tokenizer.ggml.tokens")
    if not pieces or kind not in ("llama", "gpt2"):
        return None
    table = [_spm_bytes(p) for p in pieces] if kind == "llama" else [_bpe_bytes(p) for p in pieces]

    def text(ids) -> str:
        return b"".join(table[i] for i in ids if 0 <= i < len(table)).decode("utf-8", "replace")
    return text


def _spm_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace("\u2581", " ").encode("utf-8")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable bytes stand for themselves, the others for 256 + n."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    extra = iter(range(256, 512))
    return {chr(b if b in keep else next(extra)): b for b in range(256)}


_BYTES = _byte_decoder()


def _bpe_bytes(piece: str) -> bytes:
    try:
        return bytes(_BYTES[c] for c in piece)
    except KeyError:
        return piece.encode("utf-8")
