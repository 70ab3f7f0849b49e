"""The counter-based weight generator shared by kernels/rng.cu and its numpy twin (bit-identical).

Element i of tensor `index` under `seed` is a pure function of (seed, index, i), so a device fills a tensor
in any order and the host reproduces any part of it:

    key   = mix64(seed * GOLDEN + index + 1)                 splitmix64's finaliser, one stream per tensor
    z     = mix64(key + (i + 1) * GOLDEN)                    (uint64, wrapping)
    c     = sum of z's four 16-bit lanes - 2 * 65535         integer in [-131070, 131070]
    value = f32(c) * mul + add                               two IEEE-rounded f32 operations, no FMA

`c` is an Irwin-Hall(4) draw: mean 0, standard deviation IH_STD, nearly normal (tails cut at 3.46 sigma),
so `mul = f32(scale / IH_STD)` gives values of standard deviation `scale` around `add`. The conversion uses
only exact integer work, an exact int->float conversion and correctly rounded f32 multiply and add, so CUDA
(with __fmul_rn / __fadd_rn, which NVRTC never contracts) and numpy agree to the bit. Storing as F16 rounds to
nearest even on both; Q8_0 quantises each 32-block as `memory.quantize_q8_0` does.
"""

from __future__ import annotations

import numpy as np

from ..parallel import over_spans

GOLDEN = 0x9E3779B97F4A7C15
M1, M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
LANE_CENTRE = 2 * 65535
IH_STD = float(np.sqrt((65536.0 ** 2 - 1) / 3.0))   # std of the sum of four uniform 16-bit lanes
MASK64 = (1 << 64) - 1
CHUNK = 1 << 20   # elements drawn at a time by one host thread (temporaries ~20 bytes each: ~20 MB a thread)


def mix64_int(z: int) -> int:
    """splitmix64's finaliser on a Python int (the per-tensor key; the kernel computes the same)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    return z ^ (z >> 31)


def stream_key(seed: int, index: int) -> int:
    """The 64-bit key of tensor `index` under `seed` (seed taken modulo 2**64)."""
    return mix64_int((seed & MASK64) * GOLDEN + index + 1)


def seed_words(seed: int) -> tuple[int, int]:
    """(low, high) 32-bit halves of the seed as signed int32 (the kernel's ip[0], ip[1])."""
    s = seed & MASK64
    lo, hi = s & 0xFFFFFFFF, s >> 32
    return tuple(int(np.array(w, np.uint32).view(np.int32)) for w in (lo, hi))


def multiplier(scale: float) -> np.float32:
    """The f32 `mul` giving values of standard deviation `scale`."""
    return np.float32(scale / IH_STD)


def centred_lanes(key: int, first: int, n: int) -> np.ndarray:
    """c for elements first .. first+n-1 of the stream `key`, as int32. The mix runs in place with one
    temporary, and the four 16-bit lanes are read through a uint16 view of z (their sum is the same in any
    lane order): about half the time of masking and shifting each lane out."""
    with np.errstate(over="ignore"):
        z = np.arange(first + 1, first + n + 1, dtype=np.uint64)
        z *= np.uint64(GOLDEN)
        z += np.uint64(key)
        t = z >> np.uint64(30)
        z ^= t
        z *= np.uint64(M1)
        np.right_shift(z, np.uint64(27), out=t)
        z ^= t
        z *= np.uint64(M2)
        np.right_shift(z, np.uint64(31), out=t)
        z ^= t
    lanes = z.view(np.uint16).reshape(n, 4)
    c = lanes[:, 0].astype(np.int32)
    c += lanes[:, 1]
    c += lanes[:, 2]
    c += lanes[:, 3]
    c -= np.int32(LANE_CENTRE)
    return c


def draw_f32(seed: int, index: int, n: int, mul: np.float32, add: np.float32) -> np.ndarray:
    """The n float32 values of tensor `index` (flat, ggml element order), drawn in chunks over the host's
    cores (each element a pure function of its index: the same bits on any number of threads)."""
    key = stream_key(seed, index)
    out = np.empty(n, np.float32)
    mul, add = np.float32(mul), np.float32(add)

    def span(a: int, b: int) -> None:
        x = out[a:b]
        np.multiply(centred_lanes(key, a, b - a), mul, out=x, dtype=np.float32)   # exact int -> f32, then f32 *
        x += add
    over_spans(n, CHUNK, span)
    return out
