"""Hardware counters of a candidate's kernels: time, DRAM bytes and throughput, achieved occupancy
and SM throughput per launch, read with CUPTI's range profiler.

Each kernel of one call is a range of its own (auto ranges); the call is made once per pass the
metrics need (user replay), with its memory prepared outside the ranges so that only the plan's
launches are measured. CUPTI is reached through ctypes: ``libcupti`` comes from the
``nvidia-cuda-cupti`` wheel (the one PyTorch's CUDA wheels install), the CUDA toolkit, or the
library path, and a copy the process has loaded already is preferred.

Counters are often unavailable: the driver may restrict them to administrators
(``NVreg_RestrictProfilingToAdminUsers``), another profiler may hold them, the GPU may be
virtualized. Every such case ends as a ``CounterReport`` whose ``note`` says why, never as an
exception.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from kforge.core.outcome import CounterFigures, LaunchCounters

TOOL = "CUPTI range profiler"

# What is measured, by the name kforge uses, and CUPTI's metrics that give it, best first (chips
# name some counters differently).
METRICS: dict[str, tuple[str, ...]] = {
    "duration_ns": ("gpu__time_duration.sum",),
    "dram_read_bytes": ("dram__bytes_read.sum", "dram__bytes_op_read.sum"),
    "dram_write_bytes": ("dram__bytes_write.sum", "dram__bytes_op_write.sum"),
    "dram_peak_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                      "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "sm_peak_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct",),
}

# CUptiResult codes that say counters cannot be read here, with what to tell the user.
INSUFFICIENT_PRIVILEGES = 35
_WHY = {
    INSUFFICIENT_PRIVILEGES: "not permitted: the driver restricts GPU performance counters to "
                             "administrators (NVreg_RestrictProfilingToAdminUsers=1); run as root "
                             "or load the nvidia module with NVreg_RestrictProfilingToAdminUsers=0",
    27: "not supported on this GPU or driver",
    33: "not supported on a virtualized GPU",
    36: "another profiler (the older CUPTI profiler API) already holds the counters",
    39: "another profiler (Nsight Systems or Compute?) already holds CUPTI",
    42: "not supported on a CMP (mining) GPU",
}


@dataclass(frozen=True)
class KernelCounters:
    """One launch's counters, by the names of ``METRICS`` (those this GPU has)."""

    kernel: str
    values: dict[str, float]

    @property
    def dram_gbs(self) -> float | None:
        """Achieved DRAM bandwidth (bytes read and written over the kernel's time)."""
        moved = self.values.get("dram_read_bytes", 0.0) + self.values.get("dram_write_bytes", 0.0)
        ns = self.values.get("duration_ns")
        return moved / ns if ns and moved else None


@dataclass(frozen=True)
class CounterReport:
    """The counters of one call's launches in order, or ``note``: why there are none."""

    kernels: tuple[KernelCounters, ...] = ()
    note: str = ""
    tool: str = TOOL
    passes: int = 0

    @property
    def ok(self) -> bool:
        return bool(self.kernels)

    def figures(self) -> CounterFigures:
        """The report as an outcome keeps it."""
        return CounterFigures(self.tool, self.note, self.passes if self.kernels else 0, tuple(
            LaunchCounters(k.kernel, **k.values, dram_gbs=k.dram_gbs or None)
            for k in self.kernels))


def unavailable(why: str) -> CounterReport:
    return CounterReport(note=f"counters not available: {why}")


class CuptiError(Exception):
    """A CUPTI call failed; ``code`` is its CUptiResult."""

    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call} failed: {text}" + (f" (CUptiResult {code})" if code else ""))
        self.call = call
        self.code = code


def explain(error: CuptiError) -> str:
    """Why counters cannot be read, for a report's note."""
    return _WHY.get(error.code, str(error))


# ----- the library -----


def _loaded_cupti() -> str | None:
    """The libcupti this process has loaded already (PyTorch's profiler loads one)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "/libcupti.so" in path:
            return path
    return None


def find_cupti() -> str | None:
    """libcupti: one already loaded, the nvidia-cuda-cupti wheel's, the toolkit's, or the one
    the library path finds."""
    if loaded := _loaded_cupti():
        return loaded
    try:
        import nvidia  # the namespace the CUDA wheels install into

        for root in getattr(nvidia, "__path__", []):
            for pattern in ("*/lib/libcupti.so*", "cuda_cupti/lib/libcupti.so*"):
                for path in sorted(Path(root).glob(pattern)):
                    return str(path)
    except ImportError:
        pass
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            for path in sorted(Path(home).glob("extras/CUPTI/lib64/libcupti.so*")):
                return str(path)
    return ctypes.util.find_library("cupti")


# ----- CUPTI's parameter structs (cupti_target.h, cupti_profiler_target.h,
# cupti_profiler_host.h, cupti_range_profiler.h); each starts with structSize and pPriv. Each is
# declared as the oldest CUPTI kforge meets has it (13.0, PyTorch's cu130 wheels): a newer CUPTI
# takes an older struct by its structSize, an older one refuses a larger struct
# (CUPTI_ERROR_INVALID_PARAMETER), so fields added since are left out, kforge setting none of
# them: GetCounterAvailability's bAllowDeviceLevelCounters (13.1), Host_Initialize's
# pSinglePassMetricSetName (13.2, PM sampling only), RangeProfiler_Enable's cacheControlMode -----

_P = ctypes.c_void_p
_SIZE = ctypes.c_size_t


def _params(name: str, fields: Sequence[tuple[str, Any]]) -> type[ctypes.Structure]:
    return type(name, (ctypes.Structure,), {
        "_fields_": [("structSize", _SIZE), ("pPriv", _P), *fields]})


def struct_size(struct: type[ctypes.Structure]) -> int:
    """CUPTI_PROFILER_STRUCT_SIZE: up to the end of the last field, without trailing padding."""
    name, kind = struct._fields_[-1][:2]
    return getattr(struct, name).offset + ctypes.sizeof(kind)


STRUCTS: dict[str, type[ctypes.Structure]] = {s.__name__: s for s in (
    _params("CUpti_Device_GetChipName_Params", [("deviceIndex", _SIZE), ("pChipName", _P)]),
    _params("CUpti_Profiler_Initialize_Params", []),
    _params("CUpti_Profiler_DeInitialize_Params", []),
    _params("CUpti_Profiler_GetCounterAvailability_Params", [
        ("ctx", _P), ("counterAvailabilityImageSize", _SIZE), ("pCounterAvailabilityImage", _P)]),
    _params("CUpti_Profiler_Host_Initialize_Params", [
        ("profilerType", ctypes.c_int), ("pChipName", _P), ("pCounterAvailabilityImage", _P),
        ("pHostObject", _P)]),
    _params("CUpti_Profiler_Host_Deinitialize_Params", [("pHostObject", _P)]),
    _params("CUpti_Profiler_Host_GetBaseMetrics_Params", [
        ("pHostObject", _P), ("metricType", ctypes.c_int), ("ppMetricNames", _P),
        ("numMetrics", _SIZE)]),
    _params("CUpti_Profiler_Host_ConfigAddMetrics_Params", [
        ("pHostObject", _P), ("ppMetricNames", _P), ("numMetrics", _SIZE)]),
    _params("CUpti_Profiler_Host_GetConfigImageSize_Params", [
        ("pHostObject", _P), ("configImageSize", _SIZE)]),
    _params("CUpti_Profiler_Host_GetConfigImage_Params", [
        ("pHostObject", _P), ("configImageSize", _SIZE), ("pConfigImage", _P)]),
    _params("CUpti_Profiler_Host_GetNumOfPasses_Params", [
        ("configImageSize", _SIZE), ("pConfigImage", _P), ("numOfPasses", _SIZE)]),
    _params("CUpti_Profiler_Host_EvaluateToGpuValues_Params", [
        ("pHostObject", _P), ("pCounterDataImage", _P), ("counterDataImageSize", _SIZE),
        ("rangeIndex", _SIZE), ("ppMetricNames", _P), ("numMetrics", _SIZE),
        ("pMetricValues", _P)]),
    _params("CUpti_RangeProfiler_Enable_Params", [("ctx", _P), ("pRangeProfilerObject", _P)]),
    _params("CUpti_RangeProfiler_Disable_Params", [("pRangeProfilerObject", _P)]),
    _params("CUpti_RangeProfiler_GetCounterDataSize_Params", [
        ("pRangeProfilerObject", _P), ("pMetricNames", _P), ("numMetrics", _SIZE),
        ("maxNumOfRanges", _SIZE), ("maxNumRangeTreeNodes", ctypes.c_uint32),
        ("counterDataSize", _SIZE)]),
    _params("CUpti_RangeProfiler_CounterDataImage_Initialize_Params", [
        ("pRangeProfilerObject", _P), ("counterDataSize", _SIZE), ("pCounterData", _P)]),
    _params("CUpti_RangeProfiler_SetConfig_Params", [
        ("pRangeProfilerObject", _P), ("configSize", _SIZE), ("pConfig", _P),
        ("counterDataImageSize", _SIZE), ("pCounterDataImage", _P), ("range", ctypes.c_int),
        ("replayMode", ctypes.c_int), ("maxRangesPerPass", _SIZE),
        ("numNestingLevels", ctypes.c_uint16), ("minNestingLevel", ctypes.c_uint16),
        ("passIndex", _SIZE), ("targetNestingLevel", ctypes.c_uint16)]),
    _params("CUpti_RangeProfiler_Start_Params", [("pRangeProfilerObject", _P)]),
    _params("CUpti_RangeProfiler_Stop_Params", [
        ("pRangeProfilerObject", _P), ("passIndex", _SIZE), ("targetNestingLevel", _SIZE),
        ("isAllPassSubmitted", ctypes.c_uint8)]),
    _params("CUpti_RangeProfiler_DecodeData_Params", [
        ("pRangeProfilerObject", _P), ("numOfRangeDropped", _SIZE)]),
    _params("CUpti_RangeProfiler_GetCounterDataInfo_Params", [
        ("pCounterDataImage", _P), ("counterDataImageSize", _SIZE), ("numTotalRanges", _SIZE)]),
)}

# Enum values (cupti_profiler_target.h, cupti_profiler_host.h)
RANGE_PROFILER = 0  # CUPTI_PROFILER_TYPE_RANGE_PROFILER
AUTO_RANGE = 1  # CUPTI_AutoRange
USER_REPLAY = 3  # CUPTI_UserReplay
METRIC_TYPES = (0, 1, 2)  # counter, ratio, throughput


class Cupti:
    """libcupti through ctypes: ``call(function, struct name, **fields)`` fills a parameter
    struct, calls, raises CuptiError on failure and returns the struct."""

    def __init__(self, path: str) -> None:
        folder = Path(path).parent
        for helper in ("libnvperf_host.so", "libnvperf_target.so"):  # loaded by CUPTI by name
            if (folder / helper).exists():
                ctypes.CDLL(str(folder / helper), mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)

    def call(self, function: str, struct: str, **fields: Any) -> ctypes.Structure:
        kind = STRUCTS[struct]
        params = kind(structSize=struct_size(kind), **fields)
        code = getattr(self.lib, function)(ctypes.byref(params))
        if code:
            raise CuptiError(function, code, self.result_text(code))
        return params

    def result_text(self, code: int) -> str:
        text = ctypes.c_char_p()
        try:
            self.lib.cuptiGetResultString(code, ctypes.byref(text))
        except AttributeError:
            return "CUPTI error"
        return (text.value or b"CUPTI error").decode(errors="replace")


def _strings(names: Sequence[str]) -> ctypes.Array:
    return (ctypes.c_char_p * len(names))(*[n.encode() for n in names])


def current_context() -> int:
    """The calling thread's CUDA context (PyTorch's primary context once it ran on the GPU)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise CuptiError("cuCtxGetCurrent", 0, "no NVIDIA driver (libcuda.so.1)") from None
    ctx = ctypes.c_void_p()
    if cuda.cuCtxGetCurrent(ctypes.byref(ctx)) or not ctx.value:
        raise CuptiError("cuCtxGetCurrent", 0, "no current CUDA context")
    return ctx.value


@dataclass
class _Host:
    """A profiler host object for one GPU, the metrics it supports and their config image."""

    handle: int
    chip: str
    metrics: dict[str, str]  # kforge name -> CUPTI metric
    config: ctypes.Array
    passes: int
    keep: list = field(default_factory=list)  # buffers CUPTI points into


def prepare_counters(device: int) -> None:
    """CUPTI's set-up for ``device`` done now, where the calling thread has a CUDA context: host
    work (the library, the chip's metrics and their config image; no kernel runs) that the first
    measurement then finds made. Without a context nothing is done, and nothing is remembered."""
    with contextlib.suppress(CuptiError):
        current_context()
        _session(device)


@cache
def _session(device: int) -> tuple[Cupti, _Host] | str:
    """CUPTI loaded and initialised for ``device`` once per process (its chip, the counters it
    makes available, the config image of the metrics it supports), or why it cannot be."""
    try:
        return _start(device)
    except FileNotFoundError as exc:
        return str(exc)
    except CuptiError as exc:
        return explain(exc)
    except OSError as exc:
        return f"libcupti could not be loaded: {exc}"


def _start(device: int) -> tuple[Cupti, _Host]:
    path = find_cupti()
    if path is None:
        raise FileNotFoundError("libcupti not found: pip install nvidia-cuda-cupti")
    ctx = current_context()
    cupti = Cupti(path)
    cupti.call("cuptiProfilerInitialize", "CUpti_Profiler_Initialize_Params")
    chip_ptr = cupti.call("cuptiDeviceGetChipName", "CUpti_Device_GetChipName_Params",
                          deviceIndex=device).pChipName
    chip = ctypes.string_at(chip_ptr).decode()
    size = cupti.call("cuptiProfilerGetCounterAvailability",
                      "CUpti_Profiler_GetCounterAvailability_Params",
                      ctx=ctx).counterAvailabilityImageSize
    availability = (ctypes.c_uint8 * size)()
    cupti.call("cuptiProfilerGetCounterAvailability",
               "CUpti_Profiler_GetCounterAvailability_Params", ctx=ctx,
               counterAvailabilityImageSize=size,
               pCounterAvailabilityImage=ctypes.addressof(availability))
    chip_name = ctypes.create_string_buffer(chip.encode())
    handle = cupti.call("cuptiProfilerHostInitialize", "CUpti_Profiler_Host_Initialize_Params",
                        profilerType=RANGE_PROFILER, pChipName=ctypes.addressof(chip_name),
                        pCounterAvailabilityImage=ctypes.addressof(availability)).pHostObject
    base: set[str] = set()
    for metric_type in METRIC_TYPES:
        listed = cupti.call("cuptiProfilerHostGetBaseMetrics",
                            "CUpti_Profiler_Host_GetBaseMetrics_Params", pHostObject=handle,
                            metricType=metric_type)
        names = ctypes.cast(listed.ppMetricNames, ctypes.POINTER(ctypes.c_char_p))
        base |= {names[i].decode() for i in range(listed.numMetrics)}
    metrics = supported_metrics(base)
    if not metrics:
        raise CuptiError("cuptiProfilerHostGetBaseMetrics", 0,
                         f"none of kforge's metrics is known on chip {chip}")
    names_array = _strings(list(metrics.values()))
    cupti.call("cuptiProfilerHostConfigAddMetrics", "CUpti_Profiler_Host_ConfigAddMetrics_Params",
               pHostObject=handle, ppMetricNames=ctypes.addressof(names_array),
               numMetrics=len(metrics))
    size = cupti.call("cuptiProfilerHostGetConfigImageSize",
                      "CUpti_Profiler_Host_GetConfigImageSize_Params",
                      pHostObject=handle).configImageSize
    config = (ctypes.c_uint8 * size)()
    cupti.call("cuptiProfilerHostGetConfigImage", "CUpti_Profiler_Host_GetConfigImage_Params",
               pHostObject=handle, configImageSize=size, pConfigImage=ctypes.addressof(config))
    passes = cupti.call("cuptiProfilerHostGetNumOfPasses",
                        "CUpti_Profiler_Host_GetNumOfPasses_Params", configImageSize=size,
                        pConfigImage=ctypes.addressof(config)).numOfPasses
    return cupti, _Host(handle, chip, metrics, config, passes,
                        keep=[availability, chip_name, names_array])


def supported_metrics(base: set[str]) -> dict[str, str]:
    """For each kforge name, the first of its CUPTI metrics whose base metric the chip lists."""
    chosen = {}
    for name, candidates in METRICS.items():
        for metric in candidates:
            if metric.split(".")[0] in base:
                chosen[name] = metric
                break
    return chosen


def measure_counters(prepare: Callable[[], Any], launch: Callable[[Any], Any],
                     kernels: Sequence[str], sync: Callable[[], Any],
                     device: int = 0) -> CounterReport:
    """Counters of each of ``kernels`` (the launches of one call, in order). ``prepare()`` makes
    a call's memory ready outside the measured ranges; ``launch(prepared)`` makes the launches;
    ``sync()`` waits for the GPU. Never raises: a failure is the report's note."""
    session = _session(device)
    if isinstance(session, str):
        return unavailable(session)
    cupti, host = session
    try:
        return _measure(cupti, host, prepare, launch, kernels, sync)
    except CuptiError as exc:
        return unavailable(explain(exc))
    except Exception as exc:  # counters are informative only: the verdict stands without them
        return unavailable(f"measuring failed: {type(exc).__name__}: {exc}")


def _measure(cupti: Cupti, host: _Host, prepare: Callable[[], Any],
             launch: Callable[[Any], Any], kernels: Sequence[str],
             sync: Callable[[], Any]) -> CounterReport:
    ranges = max(1, len(kernels))
    names = list(host.metrics.values())
    metric_names = _strings(names)
    profiler = cupti.call("cuptiRangeProfilerEnable", "CUpti_RangeProfiler_Enable_Params",
                          ctx=current_context()).pRangeProfilerObject
    try:
        size = cupti.call("cuptiRangeProfilerGetCounterDataSize",
                          "CUpti_RangeProfiler_GetCounterDataSize_Params",
                          pRangeProfilerObject=profiler,
                          pMetricNames=ctypes.addressof(metric_names), numMetrics=len(names),
                          maxNumOfRanges=ranges, maxNumRangeTreeNodes=ranges).counterDataSize
        data = (ctypes.c_uint8 * size)()
        cupti.call("cuptiRangeProfilerCounterDataImageInitialize",
                   "CUpti_RangeProfiler_CounterDataImage_Initialize_Params",
                   pRangeProfilerObject=profiler, counterDataSize=size,
                   pCounterData=ctypes.addressof(data))
        cupti.call("cuptiRangeProfilerSetConfig", "CUpti_RangeProfiler_SetConfig_Params",
                   pRangeProfilerObject=profiler, configSize=len(host.config),
                   pConfig=ctypes.addressof(host.config), counterDataImageSize=size,
                   pCounterDataImage=ctypes.addressof(data), range=AUTO_RANGE,
                   replayMode=USER_REPLAY, maxRangesPerPass=ranges, numNestingLevels=1,
                   minNestingLevel=1, passIndex=0, targetNestingLevel=1)
        passes = 0
        done = False
        while not done and passes < max(host.passes, 1) + 2:  # CUPTI says when; a bound anyway
            prepared = prepare()
            sync()
            cupti.call("cuptiRangeProfilerStart", "CUpti_RangeProfiler_Start_Params",
                       pRangeProfilerObject=profiler)
            launch(prepared)
            sync()
            done = bool(cupti.call("cuptiRangeProfilerStop", "CUpti_RangeProfiler_Stop_Params",
                                   pRangeProfilerObject=profiler).isAllPassSubmitted)
            passes += 1
        cupti.call("cuptiRangeProfilerDecodeData", "CUpti_RangeProfiler_DecodeData_Params",
                   pRangeProfilerObject=profiler)
        found = cupti.call("cuptiRangeProfilerGetCounterDataInfo",
                           "CUpti_RangeProfiler_GetCounterDataInfo_Params",
                           pCounterDataImage=ctypes.addressof(data),
                           counterDataImageSize=size).numTotalRanges
        measured = []
        for index in range(min(found, len(kernels))):
            values = (ctypes.c_double * len(names))()
            cupti.call("cuptiProfilerHostEvaluateToGpuValues",
                       "CUpti_Profiler_Host_EvaluateToGpuValues_Params", pHostObject=host.handle,
                       pCounterDataImage=ctypes.addressof(data), counterDataImageSize=size,
                       rangeIndex=index, ppMetricNames=ctypes.addressof(metric_names),
                       numMetrics=len(names), pMetricValues=ctypes.addressof(values))
            measured.append(KernelCounters(kernels[index], dict(zip(host.metrics, values))))
    finally:
        with contextlib.suppress(CuptiError):  # the first failure is the one to report
            cupti.call("cuptiRangeProfilerDisable", "CUpti_RangeProfiler_Disable_Params",
                       pRangeProfilerObject=profiler)
    note = "" if found == len(kernels) else (
        f"{found} ranges measured for {len(kernels)} launches: matched in launch order")
    if not measured:
        return unavailable(f"no kernel ran while measuring ({found} ranges)")
    return CounterReport(tuple(measured), note=note, passes=passes)
