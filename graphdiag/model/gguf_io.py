"""GGUF model files: a llama-architecture file read into graphdiag's model, and a preset written as one.

Reading (`open_gguf`) takes the hyper-parameters from the metadata with llama.cpp's defaults for absent keys
(`llama.rope.freq_base` 10 000, `llama.attention.layer_norm_rms_epsilon` 1e-5, `head_count_kv` = head_count)
and checks every tensor graphdiag's llama graph needs — present, of the shape the metadata implies and of a
type graphdiag computes — before anything is built; the tensor data stays memory-mapped (the `gguf`
package's reader) and is viewed, not copied, in the host layout the rest of graphdiag uses (numpy axes
outermost first; Q8_0 as ggml's 34-byte blocks). Writing (`export_gguf`) stores a preset's seeded weights
with the metadata and an SPM vocabulary (`<unk>`, `<s>`, `</s>`, the 256 byte tokens, then placeholder
pieces) that llama.cpp's loader accepts, so graphdiag and llama.cpp can run the identical model.

Supported here: architecture `llama` (Mistral-style files included), tensor types F32, F16 and Q8_0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import UsageError
from ..ir.dtypes import Q8_0_BLOCK, GGMLType
from .presets import ModelConfig

SUPPORTED_ARCHS = ("llama",)
N_CTX_MAX = 4096                 # KV cells graphdiag gives a file's model (its context length if smaller)
TYPES = {0: GGMLType.F32, 1: GGMLType.F16, 8: GGMLType.Q8_0}     # GGUF tensor type -> graphdiag's
N_SPECIAL = 3 + 256              # <unk> <s> </s> and the byte tokens of the exported vocabulary


@dataclass
class GgufModel:
    """A validated llama GGUF: its config, every tensor's type and (numpy) shape, and the file."""

    path: Path
    cfg: ModelConfig
    types: dict[str, GGMLType] = field(default_factory=dict)
    arch: str = "llama"
    n_bytes: int = 0             # tensor data bytes

    @property
    def main_type(self) -> GGMLType:
        """The type most of the mat-mul weights (by count) are in: what the model reports as its weight type."""
        by: dict[GGMLType, int] = {}
        for name, t in self.types.items():
            if not name.endswith("norm.weight"):
                by[t] = by.get(t, 0) + 1
        return max(by, key=by.get) if by else GGMLType.F32


def _reader(path: Path):
    try:
        from .gguf_reader import FastGGUFReader as GGUFReader     # the library's, arrays read in one piece
    except ImportError:
        raise UsageError("reading a GGUF file needs the gguf package (pip install gguf)") from None
    try:
        return GGUFReader(path, "r")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such model file") from None
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise UsageError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


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
    path = Path(path_str)
    r = _reader(path)
    arch = _value(r, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UsageError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    cfg = _config(path, r, arch)
    infos = {t.name: t for t in r.tensors}
    types, n_bytes = {}, 0
    for name, ne, norm in expected_tensors(cfg):
        t = infos.get(name)
        if t is None:
            raise UsageError(f"{path}: tensor {name} is missing (a {arch} model of {cfg.n_layer} layers needs it)")
        got = tuple(int(x) for x in t.shape)
        while len(got) > len(ne) and got[-1] == 1:
            got = got[:-1]
        if got != ne:
            raise UsageError(f"{path}: tensor {name} has shape {list(got)}, expected {list(ne)} from the metadata")
        gt = TYPES.get(int(t.tensor_type))
        if gt is None or (norm and gt != GGMLType.F32):
            raise UsageError(f"{path}: tensor {name} is {t.tensor_type.name}, which graphdiag does not compute "
                             f"(supported: {'F32' if norm else 'F32, F16, Q8_0'})")
        if t.data_offset + t.n_bytes > len(r.data):
            raise UsageError(f"{path}: tensor {name} runs past the end of the file (truncated?)")
        types[name] = gt
        n_bytes += int(t.n_bytes)
    return GgufModel(path, cfg, types, arch, n_bytes)


def _config(path: Path, r, arch: str) -> ModelConfig:
    def need(key: str) -> int:
        v = _value(r, f"{arch}.{key}")
        if not isinstance(v, (int, np.integer)) or v <= 0:
            raise UsageError(f"{path}: metadata {arch}.{key} is missing or not a positive integer")
        return int(v)
    n_embd, n_head = need("embedding_length"), need("attention.head_count")
    n_head_kv = int(_value(r, f"{arch}.attention.head_count_kv", n_head))
    vocab = _value(r, "tokenizer.ggml.tokens")
    emb = next((t for t in r.tensors if t.name == "token_embd.weight"), None)
    n_vocab = len(vocab) if vocab else (int(emb.shape[1]) if emb is not None and len(emb.shape) > 1 else 0)
    if n_embd % n_head or n_head % max(n_head_kv, 1) or n_vocab <= 0:
        raise UsageError(f"{path}: inconsistent metadata (n_embd {n_embd}, heads {n_head}, kv heads {n_head_kv}, "
                         f"vocab {n_vocab})")
    head_dim = n_embd // n_head
    for key in ("attention.key_length", "attention.value_length", "rope.dimension_count"):
        v = _value(r, f"{arch}.{key}")
        if v is not None and int(v) != head_dim:
            raise UsageError(f"{path}: {arch}.{key} = {v} differs from n_embd / n_head = {head_dim}, which "
                             f"graphdiag's {arch} graph assumes")
    n_ctx = min(int(_value(r, f"{arch}.context_length", N_CTX_MAX)), N_CTX_MAX)
    return ModelConfig(path.stem, need("block_count"), n_embd, n_head, n_head_kv, need("feed_forward_length"),
                       n_vocab, rope_base=float(_value(r, f"{arch}.rope.freq_base", 10000.0)),
                       norm_eps=float(_value(r, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)), n_ctx=n_ctx)


def expected_tensors(cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(name, ggml ne, is a norm) of every weight graphdiag's llama graph reads, in its creation order."""
    d, dkv, f = cfg.n_embd, cfg.n_embd_kv, cfg.n_ff
    yield "token_embd.weight", (d, cfg.n_vocab), False
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", (d,), True
        for name, ne in (("attn_q", (d, d)), ("attn_k", (d, dkv)), ("attn_v", (d, dkv)), ("attn_output", (d, d))):
            yield p + name + ".weight", ne, False
        yield p + "ffn_norm.weight", (d,), True
        for name, ne in (("ffn_gate", (d, f)), ("ffn_up", (d, f)), ("ffn_down", (f, d))):
            yield p + name + ".weight", ne, False
    yield "output_norm.weight", (d,), True
    yield "output.weight", (d, cfg.n_vocab), False


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
                self._r = _reader(self.g.path)
                self._by = {t.name: t for t in self._r.tensors}
            t = self._by[name]
            got = t.data
            if self.g.types[name] == GGMLType.Q8_0:          # (rows, bytes) -> (rows, blocks) of block_q8_0
                got = got.view(Q8_0_BLOCK)
            self._cache[name] = got
        return got

    draw = __getitem__              # what loading asks of a model's host weights

    def __iter__(self) -> Iterator[str]:
        return iter(self.g.types)

    def __len__(self) -> int:
        return len(self.g.types)

    def __contains__(self, name) -> bool:
        return name in self.g.types


def export_gguf(model, out: str | Path, name: str) -> int:
    """Write `model` (a preset with values: Model.host) as a llama GGUF at `out`; returns the file's bytes."""
    from gguf import GGMLQuantizationType, GGUFWriter, TokenType
    cfg = model.cfg
    if cfg.is_moe:
        raise UsageError(f"export-gguf writes dense llama models; {cfg.name} is a MoE preset")
    out = Path(out)
    w = GGUFWriter(str(out), "llama")
    w.add_name(f"graphdiag {name} ({model.wtype.name}, seed {model.seed})")
    write_shape(w, cfg)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_file_type({GGMLType.F32: 0, GGMLType.F16: 1, GGMLType.Q8_0: 7}[model.wtype])
    tokens, types = _vocab(cfg.n_vocab, TokenType)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for n, _, _ in expected_tensors(cfg):
        a = model.host[n]
        if a.dtype == Q8_0_BLOCK:
            w.add_tensor(n, np.ascontiguousarray(a).view(np.uint8), raw_dtype=GGMLQuantizationType.Q8_0)
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
    """The hyper-parameters llama.cpp's loader needs, under the writer's architecture."""
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)


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
    r = _reader(Path(path))
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
