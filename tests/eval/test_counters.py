"""Hardware counters through CUPTI: the parameter structs match CUPTI's headers byte for byte, a
machine without counters gets a note saying why (never an exception), and on a GPU a correct
candidate's outcome carries its kernels' counters or that note; eager's kernels are profiled with
the baseline; the GPU's limits are read from the driver."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kforge.core.schema import encode
from kforge.runtime.counters import (
    INSUFFICIENT_PRIVILEGES,
    STRUCTS,
    CounterReport,
    CuptiError,
    KernelCounters,
    explain,
    find_cupti,
    measure_counters,
    struct_size,
    supported_metrics,
)
from kforge.runtime.gpuinfo import device_limits


def cupti_headers() -> Path | None:
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for folder in Path(root).glob("*/include"):
            if (folder / "cupti_range_profiler.h").exists() and (folder / "cuda.h").exists():
                return folder
    return None


def test_the_parameter_structs_match_cuptis_headers(tmp_path):
    headers = cupti_headers()
    if headers is None or shutil.which("gcc") is None:
        pytest.skip("needs gcc and the nvidia-cuda-cupti and nvidia-cuda-runtime headers")
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <cupti_target.h>",
             "#include <cupti_profiler_target.h>", "#include <cupti_profiler_host.h>",
             "#include <cupti_range_profiler.h>", "int main(void) {"]
    for name, struct in STRUCTS.items():
        for field, _ in struct._fields_:
            lines.append(f'printf("{name} {field} %zu\\n", offsetof({name}, {field}));')
        lines.append(f'printf("{name} SIZE %zu\\n", (size_t){name}_STRUCT_SIZE);')
    (tmp_path / "layout.c").write_text("\n".join(lines + ["return 0; }"]))
    subprocess.run(["gcc", "-I", str(headers), str(tmp_path / "layout.c"), "-o",
                    str(tmp_path / "layout")], check=True)
    printed = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True,
                             check=True).stdout.split()
    for name, field, value in zip(printed[::3], printed[1::3], printed[2::3]):
        struct = STRUCTS[name]
        if field == "SIZE":  # these headers may add fields after ours (a newer CUPTI)
            assert struct_size(struct) <= int(value), name
        else:
            assert getattr(struct, field).offset == int(value), f"{name}.{field}"


# CUPTI_PROFILER_STRUCT_SIZE of each struct in CUPTI 13.0's headers (CUPTI_API_VERSION 130001,
# the cu130 wheels'): an older CUPTI refuses a larger struct (CUPTI_ERROR_INVALID_PARAMETER).
CUPTI_13_0_SIZES = {
    "CUpti_Device_GetChipName_Params": 32, "CUpti_Profiler_Initialize_Params": 16,
    "CUpti_Profiler_DeInitialize_Params": 16, "CUpti_Profiler_GetCounterAvailability_Params": 40,
    "CUpti_Profiler_Host_Initialize_Params": 48, "CUpti_Profiler_Host_Deinitialize_Params": 24,
    "CUpti_Profiler_Host_GetBaseMetrics_Params": 48,
    "CUpti_Profiler_Host_ConfigAddMetrics_Params": 40,
    "CUpti_Profiler_Host_GetConfigImageSize_Params": 32,
    "CUpti_Profiler_Host_GetConfigImage_Params": 40,
    "CUpti_Profiler_Host_GetNumOfPasses_Params": 40,
    "CUpti_Profiler_Host_EvaluateToGpuValues_Params": 72,
    "CUpti_RangeProfiler_Enable_Params": 32, "CUpti_RangeProfiler_Disable_Params": 24,
    "CUpti_RangeProfiler_GetCounterDataSize_Params": 64,
    "CUpti_RangeProfiler_CounterDataImage_Initialize_Params": 40,
    "CUpti_RangeProfiler_SetConfig_Params": 90, "CUpti_RangeProfiler_Start_Params": 24,
    "CUpti_RangeProfiler_Stop_Params": 41, "CUpti_RangeProfiler_DecodeData_Params": 32,
    "CUpti_RangeProfiler_GetCounterDataInfo_Params": 40,
}


def test_every_struct_is_cupti_13_0s_which_newer_cuptis_take_too():
    """CUPTI 13.0 (PyTorch's cu130 wheels) refused GetCounterAvailability with 13.1's
    bAllowDeviceLevelCounters and RangeProfiler_Enable with a later cacheControlMode:
    CUPTI_ERROR_INVALID_PARAMETER, and no counters in any search."""
    assert {name: struct_size(s) for name, s in STRUCTS.items()} == CUPTI_13_0_SIZES


def test_without_counters_the_report_says_why_and_nothing_raises():
    report = measure_counters(lambda: None, lambda memory: None, ["k"], lambda: None)
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert not report.ok and report.note.startswith("counters not available: ")
    assert encode(report.figures(), defaults=False) == {"tool": report.tool, "note": report.note}


def test_privileges_and_other_refusals_are_explained():
    denied = explain(CuptiError("cuptiProfilerHostInitialize", INSUFFICIENT_PRIVILEGES, "x"))
    assert "not permitted" in denied and "NVreg_RestrictProfilingToAdminUsers" in denied
    other = explain(CuptiError("cuptiRangeProfilerEnable", 1, "CUPTI_ERROR_INVALID_PARAMETER"))
    assert "cuptiRangeProfilerEnable failed: CUPTI_ERROR_INVALID_PARAMETER" in other


def test_the_first_metric_a_chip_knows_is_taken():
    chosen = supported_metrics({"gpu__time_duration", "dram__bytes_op_read", "dram__bytes_write",
                                "sm__warps_active"})
    assert chosen == {"duration_ns": "gpu__time_duration.sum",
                      "dram_read_bytes": "dram__bytes_op_read.sum",
                      "dram_write_bytes": "dram__bytes_write.sum",
                      "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active"}


def test_a_report_gives_each_launchs_achieved_bandwidth():
    kernel = KernelCounters("rows", {"duration_ns": 10_000.0, "dram_read_bytes": 30e6,
                                     "dram_write_bytes": 10e6, "occupancy_pct": 48.0})
    assert kernel.dram_gbs == pytest.approx(4000.0)
    data = encode(CounterReport((kernel,), passes=2).figures(), defaults=False)
    assert data["kernels"][0] == {"kernel": "rows", "duration_ns": 10_000.0,
                                  "dram_read_bytes": 30e6, "dram_write_bytes": 10e6,
                                  "occupancy_pct": 48.0, "dram_gbs": pytest.approx(4000.0)}
    assert data["passes"] == 2 and "note" not in data


def test_the_gpus_limits_come_from_driver_attributes_where_it_has_them():
    attributes = {"MAX_SHARED_MEMORY_PER_BLOCK": 49152,
                  "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448,
                  "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 233472,
                  "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536, "CLOCK_RATE": 1980000,
                  "MEMORY_CLOCK_RATE": 3201000, "GLOBAL_MEMORY_BUS_WIDTH": 6144,
                  "INTEGRATED": 0, "CLUSTER_LAUNCH": 1}
    limits = device_limits(attributes.get)
    assert limits == {"smem_per_block_kb": 48.0, "smem_per_block_optin_kb": 227.0,
                      "smem_per_sm_kb": 228.0, "regs_per_sm": 65536, "sm_clock_mhz": 1980,
                      "mem_clock_mhz": 3201, "bus_width_bits": 6144, "integrated": False,
                      "cluster_launch": True}


def test_cupti_is_found_where_the_wheel_or_toolkit_puts_it():
    found = find_cupti()
    if found is None:
        pytest.skip("neither nvidia-cuda-cupti nor a CUDA toolkit with CUPTI is installed")
    assert "libcupti.so" in Path(found).name


# ----- on a GPU -----


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_correct_candidates_outcome_carries_its_kernels_counters_or_why_not():
    from kforge.eval.process.local import evaluate_local
    from kforge.eval.verify.pipeline import EvalSettings
    from tests.eval import candidates as C

    card = C.softmax_card(4096, 4096)
    outcome = evaluate_local(card, C.softmax(), settings=EvalSettings(sanitize=False))
    assert outcome.ok, outcome.summary
    counters = outcome.counters
    print(counters)
    if not counters.kernels:
        assert counters.note.startswith("counters not available: ")
        pytest.skip(counters.note)
    (kernel,) = counters.kernels
    assert kernel.kernel == "softmax_f32"
    assert kernel.duration_ns > 0
    moved = (kernel.dram_read_bytes or 0) + (kernel.dram_write_bytes or 0)
    assert moved >= 0.5 * 2 * 4096 * 4096 * 4  # read the input and write the output, cold L2
    assert kernel.occupancy_pct is not None and 0 < kernel.occupancy_pct <= 100


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_counters_leave_later_timings_alone():
    """Measuring counters in a worker must not slow the candidates it evaluates next."""
    from kforge.eval.process.local import evaluate_local
    from kforge.eval.verify.pipeline import EvalSettings
    from tests.eval import candidates as C

    card = C.softmax_card(4096, 4096)
    plain = EvalSettings(sanitize=False, counters=False)
    before = evaluate_local(card, C.softmax(), settings=plain)
    evaluate_local(card, C.softmax(), settings=EvalSettings(sanitize=False))
    after = evaluate_local(card, C.softmax(), settings=plain)
    assert before.ok and after.ok
    assert after.timing.median_us < 1.1 * before.timing.median_us


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_baseline_names_eagers_kernels_with_their_times():
    from kforge.eval.process.local import baseline_local
    from kforge.eval.verify.pipeline import EvalSettings
    from tests.eval import candidates as C

    base = baseline_local(C.softmax_card(4096, 4096), settings=EvalSettings(compile_baseline=False))
    assert base.eager_kernels, base.note
    top = base.eager_kernels[0]
    assert "softmax" in top["name"].lower() and top["us"] > 0 and top["calls"] == 1
    print(base.eager_kernels)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpus_limits_are_read_from_the_driver():
    from kforge.runtime.gpuinfo import detect_gpu

    gpu = detect_gpu(0)
    props = torch.cuda.get_device_properties(0)
    assert gpu.regs_per_sm == props.regs_per_multiprocessor
    assert gpu.smem_per_block_optin_kb * 1024 == props.shared_memory_per_block_optin
    assert gpu.max_threads_per_sm == props.max_threads_per_multi_processor
    assert gpu.integrated == bool(props.is_integrated)
    print(gpu)
