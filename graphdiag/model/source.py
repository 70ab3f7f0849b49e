"""Where a run's model comes from: a preset's name, or the path of a GGUF file (model/gguf_io.py)."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from .presets import ModelConfig, get_preset, weight_type


def is_file(name: str) -> bool:
    return str(name).endswith(".gguf")


def model_config(name: str) -> ModelConfig:
    """The preset called `name`, or the config of the GGUF file at `name` (every tensor checked)."""
    return _file(name).cfg if is_file(name) else get_preset(name)


def _file(name: str):
    """The validated GGUF file at path `name` (model/gguf_io.GgufModel)."""
    from .gguf_io import open_gguf
    return open_gguf(str(Path(name).resolve()))


def prompt_ids(name: str, text: str) -> list[int]:
    """`text` as token ids through the vocabulary of the GGUF file at `name` (model/tokenize.py)."""
    from .tokenize import file_vocab, tokenize
    path = Path(name).resolve()
    st = path.stat()
    return tokenize(file_vocab(str(path), (st.st_size, st.st_mtime_ns)), text)


def check_wtype(name: str, wtype: str, wtype_source: str) -> None:
    """--wtype chooses a preset's weight type; a file's weights have their own types."""
    if is_file(name) and wtype_source not in ("default", ""):
        raise UsageError(f"--wtype {wtype} chooses a preset's weight type; {name} has its own types (drop --wtype)")


def build_model(name: str, wtype: str, seed: int = 0, with_data: bool = True):
    """The Model of a preset (seeded weights) or of a GGUF file (its weights, memory-mapped)."""
    from .weights import create_file_model, create_model
    if is_file(name):
        return create_file_model(_file(name), with_data)
    return create_model(get_preset(name), weight_type(wtype), seed=seed, with_data=with_data)
