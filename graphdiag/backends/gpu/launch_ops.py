"""The launch primitives of the lowering: a launch's parameter record packed once, and the two lowered op
kinds that issue launches (one launch; launches sharing a pool scratch buffer)."""

from __future__ import annotations

from ...ir.arena import TENSOR_SIZE
from ...ir.dtypes import QK8_0, GGMLType
from ...ir.tensor import Tensor
from .. import abi
from ..drivers.base import Driver, Launch
from ..geometry import geometry_of_bytes
from .descriptors import DescriptorTable
from .pool import TempPool

# the kernel-name suffix of each weight type
W_SUFFIX = {GGMLType.F32: "f32", GGMLType.F16: "f16", GGMLType.Q8_0: "q8_0"}
# the file's weight types (kernels/mmvq.cu): their MUL_MAT follows ggml's dispatch (_lower_x_mul_mat)
X_SUFFIX = {GGMLType.Q4_0: "q4_0", GGMLType.Q5_0: "q5_0", GGMLType.Q5_1: "q5_1", GGMLType.Q4_K: "q4_k",
            GGMLType.Q5_K: "q5_k", GGMLType.Q6_K: "q6_k", GGMLType.BF16: "bf16", GGMLType.Q2_K: "q2_k",
            GGMLType.Q3_K: "q3_k", GGMLType.Q4_1: "q4_1", GGMLType.IQ4_NL: "iq4_nl", GGMLType.IQ4_XS: "iq4_xs",
            GGMLType.MXFP4: "mxfp4"}
W_SUFFIX.update(X_SUFFIX)


def pack_launch(d: "DescriptorTable | None", name: str, tensors: list[Tensor | None], ip=(), fp=(),
                scratch=()) -> Launch:
    """One launch; `scratch`: (slot, type, ne, nb) of each descriptor that describes pool scratch (address 0
    until the op runs and takes a buffer)."""
    buf = bytearray(abi.KPARAMS.itemsize)
    slot = 0
    if d is None:
        for t in tensors:
            if t is not None:
                abi.set_desc_from_struct(buf, slot, t.arena.mem, t.idx * TENSOR_SIZE)
            slot += 1
    else:
        refs = []
        for t in tensors:
            if t is not None:
                d.write(buf, slot, t.idx)
                refs.append((slot, t.idx))
            slot += 1
        # the descriptors this launch takes from structs (scratch, written next, takes its slot's place)
        taken = {sc[0] for sc in scratch}
        d.described.append(tuple(r for r in refs if r[0] not in taken))
    for slot_, type_, ne, nb in scratch:
        abi.set_desc_bytes(buf, slot_, 0, type_, ne, nb)
    abi.set_scalars_bytes(buf, ip, fp)
    grid, block, shmem = geometry_of_bytes(name, buf)     # geometry read from the bytes, before the record
    return Launch(name, grid, block, abi.params_from_bytes(buf), shmem)


class KernelOp:
    """One prepared launch."""

    __slots__ = ("launch", "n_launches", "ready")

    def __init__(self, launch: Launch):
        self.launch = launch
        self.n_launches = 1
        self.ready = False

    def prepare(self, driver: Driver) -> None:
        driver.prepare(self.launch)
        self.ready = True

    def run(self, driver: Driver, stream, pool: TempPool) -> None:
        driver.launch(stream, self.launch)


class ScratchLaunchesOp:
    """Launches sharing one scratch buffer taken from the pool around them: `slots[i]` lists the (descriptor,
    byte offset) pairs of launches[i] that point into the buffer (re-packed only when the pool hands out
    another buffer)."""

    __slots__ = ("launches", "slots", "nbytes", "addr", "n_launches", "ready")

    def __init__(self, launches: list[Launch], slots: list[int], nbytes: int):
        self.launches, self.slots, self.nbytes, self.addr = launches, slots, nbytes, 0
        self.n_launches = len(launches)
        self.ready = False

    def prepare(self, driver: Driver) -> None:
        for launch in self.launches:
            driver.prepare(launch)
        self.ready = True

    def _take(self, driver: Driver, pool: TempPool) -> tuple[int, int]:
        """A buffer from the pool, the launches re-packed if it is not the one they point into."""
        addr, size = pool.alloc(self.nbytes)
        if addr != self.addr:
            self._repack(driver, addr)
        return addr, size

    def _repack(self, driver: Driver, addr: int) -> None:
        for launch, places in zip(self.launches, self.slots):
            for slot, off in places:
                launch.params["t"][slot]["data"] = addr + off
            driver.prepare(launch)
        self.addr = addr

    def run(self, driver: Driver, stream, pool: TempPool) -> None:
        addr, size = self._take(driver, pool)
        for launch in self.launches:
            driver.launch(stream, launch)
        pool.free(addr, size)

    def stage(self, driver: Driver, pool: TempPool, run: list) -> None:
        """run() for an eager run of launches (CaptureLoop.run_eager): the buffer taken and handed back
        around appending the launches to `run`, which the backend launches before the pool frees or
        flushes anything on the device (TempPool.before_flush), so no launch is made after its buffer went.
        A cached buffer that fits is taken and handed back in one call (TempPool.reuse)."""
        addr = pool.reuse(self.nbytes)
        if addr is not None:
            if addr != self.addr:
                self._repack(driver, addr)
            run.extend(self.launches)
            return
        addr, size = self._take(driver, pool)
        run.extend(self.launches)
        pool.free(addr, size)


def q8_1_scratch(x: Tensor, name: str) -> tuple[tuple, tuple, int]:
    """(ne, nb, bytes) of x quantised to Q8_1 blocks in contiguous pool scratch (quantize_q8_1's output);
    `name`: the kernel that will read it (named where x cannot be quantised)."""
    if x.type != GGMLType.F32 or x.ne[0] % QK8_0:
        raise NotImplementedError(f"{name}: x must be F32 with rows of whole 32-blocks")
    nbk = x.ne[0] // QK8_0
    b = abi.Q8_1_BYTES
    nb = (b, b * nbk, b * nbk * x.ne[1], b * nbk * x.ne[1] * x.ne[2])
    return x.ne, nb, nb[3] * x.ne[3]


def quantized_x_op(d: "DescriptorTable | None", name: str, tensors: list[Tensor | None], x_slot: int, ip=(),
                   fp=()) -> ScratchLaunchesOp:
    """quantize_q8_1 of x (tensors[x_slot]) into pool scratch, then kernel `name` reading it in that slot:
    two launches, as ggml's mmvq (quantize_row_q8_1_cuda, then the mat-vec)."""
    ne, nb, nbytes = q8_1_scratch(tensors[x_slot], name)
    quant = pack_launch(d, "quantize_q8_1", [None, tensors[x_slot]], scratch=[(0, abi.Q8_1, ne, nb)])
    kernel = pack_launch(d, name, tensors, ip=ip, fp=fp, scratch=[(x_slot, abi.Q8_1, ne, nb)])
    return ScratchLaunchesOp([quant, kernel], [((0, 0),), ((x_slot, 0),)], nbytes)
