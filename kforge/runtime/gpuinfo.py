"""Find out what GPU we run on: name, architecture, SMs, memory, L2, the limits a kernel plans
around (shared memory, registers, threads, clocks, unified memory), and the measured copy rate.

The copy rate (a large device-to-device copy, read + write bytes over time) is the memory floor
every timing is held against; it is measured once per process and device.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from kforge.core.gpu import GpuInfo
from kforge.errors import KforgeError

# Bytes copied to measure the copy rate: far beyond any L2, small beside any datacenter GPU.
COPY_BYTES = 512 << 20


def require_cuda() -> None:
    """Raise a clear KforgeError unless cuda.core is installed and PyTorch sees a CUDA GPU."""
    try:
        import cuda.core  # noqa: F401 - only whether it imports
    except ImportError:
        raise KforgeError("cuda-core is not installed: the GPU evaluator needs it "
                          "(pip install 'kforge[cuda]')") from None
    import torch

    if not torch.cuda.is_available():
        raise KforgeError("no CUDA GPU is visible to PyTorch (torch.cuda.is_available() is "
                          "False): the GPU evaluator needs one")


def arch_name(major: int, minor: int) -> str:
    """Compute capability to an NVRTC architecture: (9, 0) -> ``sm_90``, (12, 1) -> ``sm_121``."""
    return f"sm_{major}{minor}"


def measure_copy_bandwidth(index: int = 0, nbytes: int = COPY_BYTES, reps: int = 10,
                           rounds: int = 3) -> float:
    """Device-to-device copy rate of GPU ``index`` in GB/s, counting bytes read and written: the
    fastest of ``rounds`` rounds of ``reps`` copies (other work on the GPU only slows a round)."""
    import torch

    device = torch.device("cuda", index)
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = max(1 << 20, min(nbytes, free // 4)) // 4 * 4
    with torch.cuda.device(index):
        src = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        seconds = float("inf")
        for _ in range(rounds):
            start.record()
            for _ in range(reps):
                dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = min(seconds, start.elapsed_time(end) / 1e3 / reps)
    del src, dst
    return 2 * nbytes / seconds / 1e9


# GpuInfo field <- (driver attribute without its CU_DEVICE_ATTRIBUTE_ prefix, unit divisor)
_ATTRIBUTES: dict[str, tuple[str, int]] = {
    "smem_per_block_kb": ("MAX_SHARED_MEMORY_PER_BLOCK", 1024),
    "smem_per_block_optin_kb": ("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", 1024),
    "smem_per_sm_kb": ("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", 1024),
    "regs_per_sm": ("MAX_REGISTERS_PER_MULTIPROCESSOR", 1),
    "regs_per_block": ("MAX_REGISTERS_PER_BLOCK", 1),
    "max_threads_per_sm": ("MAX_THREADS_PER_MULTIPROCESSOR", 1),
    "max_blocks_per_sm": ("MAX_BLOCKS_PER_MULTIPROCESSOR", 1),
    "sm_clock_mhz": ("CLOCK_RATE", 1000),  # reported in kHz
    "mem_clock_mhz": ("MEMORY_CLOCK_RATE", 1000),
    "bus_width_bits": ("GLOBAL_MEMORY_BUS_WIDTH", 1),
    "integrated": ("INTEGRATED", 1),
    "pageable_memory_access": ("PAGEABLE_MEMORY_ACCESS", 1),
    "cluster_launch": ("CLUSTER_LAUNCH", 1),
    "tensor_maps": ("TENSOR_MAP_ACCESS_SUPPORTED", 1),
}
_FLAGS = {"integrated", "pageable_memory_access", "cluster_launch", "tensor_maps"}


def device_limits(attribute: Callable[[str], int | None]) -> dict:
    """GpuInfo's limit fields from ``attribute`` (a driver attribute's value by name, None where
    this driver lacks it); a missing one keeps its default."""
    limits: dict = {}
    for field, (name, divisor) in _ATTRIBUTES.items():
        value = attribute(name)
        if value is None:
            continue
        if field in _FLAGS:
            limits[field] = bool(value)
        elif divisor == 1024:
            limits[field] = value / divisor
        else:
            limits[field] = value // divisor
    return limits


def driver_attribute(index: int) -> Callable[[str], int | None]:
    """Reads device attributes of GPU ``index`` through the CUDA driver; None for an attribute
    this driver or binding does not have."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return lambda name: None
    (err,) = driver.cuInit(0)
    err_dev, device = driver.cuDeviceGet(index)
    if err != driver.CUresult.CUDA_SUCCESS or err_dev != driver.CUresult.CUDA_SUCCESS:
        return lambda name: None

    def attribute(name: str) -> int | None:
        key = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}", None)
        if key is None:
            return None
        err, value = driver.cuDeviceGetAttribute(key, device)
        return int(value) if err == driver.CUresult.CUDA_SUCCESS else None

    return attribute


def driver_version() -> str:
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if err != driver.CUresult.CUDA_SUCCESS:
            return ""
        return f"{version // 1000}.{version % 1000 // 10}"
    except Exception:  # an old or absent binding: the version is only informative
        return ""


def start_cuda(index: int = 0) -> None:
    """PyTorch's CUDA state and GPU ``index``'s context made now: seconds of host work (the
    driver, the libraries, the allocator), apart from the copy rate's short measurement."""
    require_cuda()
    import torch

    if index < torch.cuda.device_count():
        torch.cuda.mem_get_info(index)


@cache
def detect_gpu(index: int = 0) -> GpuInfo:
    """The GPU at ``index`` (among the visible ones), with its copy rate measured now."""
    require_cuda()
    import torch

    if index >= torch.cuda.device_count():
        raise KforgeError(f"there is no GPU {index}: {torch.cuda.device_count()} visible")
    props = torch.cuda.get_device_properties(index)
    l2 = getattr(props, "L2_cache_size", 0)
    return GpuInfo(
        name=props.name,
        arch=arch_name(props.major, props.minor),
        sm_count=props.multi_processor_count,
        memory_gb=round(props.total_memory / (1 << 30), 1),
        l2_mb=round(l2 / (1 << 20), 1),
        bandwidth_gbs=round(measure_copy_bandwidth(index), 1),
        driver=driver_version(),
        torch=torch.__version__,
        index=index,
        **device_limits(driver_attribute(index)),
    )
