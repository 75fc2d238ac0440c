"""What kforge knows about a GPU: the fingerprint stored with a session and shown in prompts.

The limits a kernel author plans around (shared memory, registers, threads per SM, clocks) are read
from the driver where the GPU is found; fingerprints stored before they were read keep their zero
defaults and are shown without them. What an architecture offers (tensor-core generation, clusters,
bulk asynchronous copies) follows from its compute capability alone (``arch_features``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.schema import Record


def memory_of(device_type: str) -> str:
    """The memory a device's tensors live in, as a message names it."""
    return "GPU memory" if device_type == "cuda" else "host memory"


@dataclass(frozen=True)
class GpuInfo(Record):
    """A GPU's fingerprint; ``from_dict``/``to_dict`` are the codec's (``kforge.core.schema``)."""

    name: str
    arch: str  # "sm_90", "sm_121"
    sm_count: int = 0
    memory_gb: float = 0.0
    l2_mb: float = 0.0
    bandwidth_gbs: float | None = None  # measured device-to-device copy rate (read + write)
    driver: str = ""
    torch: str = ""
    index: int = 0
    # Limits read from the driver (0: not known)
    smem_per_block_kb: float = 0.0  # without opting in
    smem_per_block_optin_kb: float = 0.0  # the most a block may opt into
    smem_per_sm_kb: float = 0.0
    regs_per_sm: int = 0  # 32-bit registers
    regs_per_block: int = 0
    max_threads_per_sm: int = 0
    max_blocks_per_sm: int = 0
    sm_clock_mhz: int = 0  # peak SM clock
    mem_clock_mhz: int = 0  # peak memory clock
    bus_width_bits: int = 0  # memory bus width
    integrated: bool = False  # shares one physical memory with the CPU (GB10, Jetson)
    pageable_memory_access: bool = False  # kernels may read plain host memory coherently
    cluster_launch: bool = False  # thread block clusters
    tensor_maps: bool = False  # TMA tensor maps (cp.async.bulk.tensor)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.arch})"

    @property
    def peak_bandwidth_gbs(self) -> float | None:
        """The memory's theoretical rate (double data rate over the bus), where known."""
        if not self.mem_clock_mhz or not self.bus_width_bits:
            return None
        return 2 * self.mem_clock_mhz * 1e6 * self.bus_width_bits / 8 / 1e9

    @property
    def features(self) -> tuple[str, ...]:
        return arch_features(self.arch)



def compute_capability(arch: str) -> tuple[int, int] | None:
    """``sm_90`` -> (9, 0), ``sm_121`` -> (12, 1); None for anything else (``none``)."""
    digits = arch.removeprefix("sm_")
    if not arch.startswith("sm_") or not digits.isdigit() or len(digits) < 2:
        return None
    return int(digits[:-1]), int(digits[-1])


def arch_features(arch: str) -> tuple[str, ...]:
    """What a kernel compiled for ``arch`` by NVRTC (the plain target, not ``sm_90a``) can use
    beyond plain CUDA: tensor-core instructions and data types, asynchronous copies, clusters."""
    cc = compute_capability(arch)
    if cc is None:
        return ()
    major = cc[0]
    found: list[str] = []
    if cc >= (8, 0):
        found.append("tensor cores through mma.sync (fp16, bf16, tf32, int8; "
                     + ("fp8 e4m3/e5m2 too" if cc >= (8, 9) else "no fp8") + ")")
        found.append("cp.async global->shared copies (sm_80+)")
    elif cc >= (7, 0):
        found.append("tensor cores through mma.sync / wmma (fp16)")
    if major == 9:
        found.append("Hopper: thread block clusters (__cluster_dims__) with distributed shared "
                     "memory, 1-D bulk async copies (cp.async.bulk) with mbarriers; wgmma and "
                     "setmaxnreg need sm_90a, which the plain sm_90 target does not enable; "
                     "TMA tensor copies need a CUtensorMap, which a launch plan cannot pass")
    elif major == 10:
        found.append("Blackwell datacenter: clusters, bulk async copies; tcgen05 and tensor "
                     "memory need sm_100a, which the plain target does not enable")
    elif major >= 12:
        found.append("Blackwell (consumer/GB10): clusters, bulk async copies, mma.sync with fp8 "
                     "and block-scaled fp4; no wgmma or tcgen05")
    return tuple(found)


# The stand-in used where no GPU was found (CPU-only tests and sessions browsed offline).
NO_GPU = GpuInfo(name="no GPU", arch="none")
