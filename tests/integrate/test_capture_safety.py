"""What keeps a CUDA graph capture whole, checked without a GPU: Python's cyclic garbage collector
runs before each capture kforge makes or sets off and not during it (a Triton kernel Inductor
let go unloads its module when collected, a collected graph destroys itself: driver calls a
capturing stream does not permit), and a captured graph keeps alive what owns the kernels it
launches."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch

from kforge.capture.loader import LoadedModel
from kforge.errors import KforgeError
from kforge.integrate import graphs, measure
from kforge.integrate.graphs import gc_paused
from kforge.integrate.measure import (
    Measured,
    parse_modes,
    run_modes,
    time_subjects,
)
from kforge.runtime.guard import Patch
from kforge.runtime.table import KernelTable
from kforge.runtime.timing import ForwardRun, time_forward_runs, timing_stage
from tests.integrate.helpers import cpu_model


class Finalized:
    """Garbage in a reference cycle whose finalizer says when it ran (as a Triton kernel Inductor
    let go unloads its module when the collector reaches it)."""

    def __init__(self, log: list[str], name: str) -> None:
        self.cycle = self
        self.log, self.name = log, name

    def __del__(self) -> None:
        self.log.append(f"{self.name} collected")


@pytest.fixture
def collector():
    """The collector enabled, with thresholds that collect at nearly every allocation."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    gc.set_threshold(1, 1, 1)
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


def test_garbage_is_collected_before_the_block_and_none_inside_it(collector):
    log: list[str] = []
    Finalized(log, "before")
    with gc_paused():
        assert log == ["before collected"] and not gc.isenabled()
        Finalized(log, "inside")
        for _ in range(1000):
            [object() for _ in range(10)]  # plenty of allocations that would set off a collection
        assert log == ["before collected"]
    assert gc.isenabled()
    gc.collect()
    assert log == ["before collected", "inside collected"]


def test_nested_pauses_collect_once_and_a_caller_s_disabled_collector_stays_off(collector):
    log: list[str] = []
    with gc_paused():
        Finalized(log, "inner garbage")
        with gc_paused():
            assert not log and not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
    gc.enable()


def test_the_collector_is_back_on_after_a_block_that_raises(collector):
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("capture failed")
    assert gc.isenabled()


class FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def fake_cuda(monkeypatch) -> list[str]:
    """torch.cuda's graph capture replaced by stand-ins that log what happens inside them."""
    log: list[str] = []

    class Stream:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def wait_stream(self, other) -> None:
            pass

    @contextlib.contextmanager
    def graph(g, *args, **kwargs):
        log.append("capture begins")
        yield
        log.append("capture ends")

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(graphs, "no_host_sync", contextlib.nullcontext)
    monkeypatch.setattr(graphs, "clear_cublas_workspaces", lambda: log.append("workspaces cleared"))
    return log


def test_a_capture_collects_first_and_runs_its_warm_up_and_captured_calls_without_collection(
        collector, monkeypatch):
    log = fake_cuda(monkeypatch)
    Finalized(log, "an earlier compiled model")
    seen = []

    def step() -> torch.Tensor:
        seen.append(gc.isenabled())
        Finalized(log, "garbage of the step")  # in a real capture: a driver call that breaks it
        return torch.ones(2)

    captured = graphs.capture(step, torch.device("cuda", 0))
    assert seen == [False, False, False]  # two warm-up calls, then the captured one
    # nothing collected from the first warm-up call to the end of the capture
    events = [e for e in log if e != "workspaces cleared"]
    assert events[:3] == ["an earlier compiled model collected", "capture begins",
                          "capture ends"]
    assert gc.isenabled() and captured.graph.replays == 1


def test_only_the_captured_call_is_checked_for_host_syncs(monkeypatch):
    # Warm-up calls may synchronize (lazy set-up; transformers checks values on the host unless
    # a stream is capturing); the check is armed inside the capture, after capture_begin, which
    # synchronizes itself.
    log = fake_cuda(monkeypatch)

    @contextlib.contextmanager
    def checked():
        log.append("armed")
        yield
        log.append("disarmed")

    monkeypatch.setattr(graphs, "no_host_sync", checked)
    graphs.capture(lambda: log.append("call"), torch.device("cuda", 0))
    captured = log[log.index("capture begins"):log.index("capture ends") + 1]
    assert log.count("call") == 3 and log[:2] == ["call", "call"]
    assert captured == ["capture begins", "armed", "call", "disarmed", "capture ends"]


def test_a_capture_makes_its_own_cublas_workspace_and_leaves_none_behind(monkeypatch):
    # A workspace kept from an earlier capture belongs to that graph's pool: cleared before, the
    # graph makes its own inside its pool; cleared after, no later capture takes it over.
    log = fake_cuda(monkeypatch)
    graphs.capture(lambda: None, torch.device("cuda", 0))
    assert log[-4:] == ["workspaces cleared", "capture begins", "capture ends",
                        "workspaces cleared"]


def test_a_forward_that_cannot_be_captured_is_named_with_where_it_stopped(monkeypatch):
    fake_cuda(monkeypatch)
    calls = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 3:  # the captured call
            raise RuntimeError("called a synchronizing CUDA operation")

    with pytest.raises(KforgeError) as raised:
        graphs.capture(step, torch.device("cuda", 0))
    line = step.__code__.co_firstlineno + 3
    assert str(raised.value).startswith(
        "the forward cannot be captured as a CUDA graph: RuntimeError: called a synchronizing "
        f"CUDA operation (at integrate/test_capture_safety.py:{line}) (a forward replayed")


def test_source_files_are_named_as_their_package_names_them():
    assert graphs.short_path("/venv/lib/python3.12/site-packages/transformers/masking_utils.py"
                             ) == "transformers/masking_utils.py"
    assert graphs.short_path("/home/me/models/unet.py") == "models/unet.py"


def test_a_graphed_subject_keeps_the_step_that_owns_its_kernels_alive(monkeypatch):
    log = fake_cuda(monkeypatch)

    class CompiledForward:
        """Stands for a compiled model: the kernels it owns live as long as it does."""

        def __call__(self) -> torch.Tensor:
            return torch.ones(2)

    forward = CompiledForward()
    alive = weakref.ref(forward)
    loaded = LoadedModel("m", torch.nn.Identity(), (torch.ones(2),), {}, torch.float32,
                         torch.device("cuda", 0))
    graphed = measure._graphed(loaded, ForwardRun("compiled", forward), Measured("compiled"), None)
    del forward
    gc.collect()
    assert alive() is not None, "the graph would launch kernels of a collected model"
    assert "capture ends" in log
    del graphed
    gc.collect()
    assert alive() is None


def test_timed_forwards_run_without_collection(collector):
    loaded = cpu_model()
    seen = []

    def step() -> None:
        seen.append(gc.isenabled())
        loaded.step()

    time_subjects(loaded, [ForwardRun("a", step), ForwardRun("b", step)], reps=3, warmup=1)
    assert seen and not any(seen)
    assert gc.isenabled()


def test_every_mode_is_set_up_and_timed_without_collection(collector):
    loaded = cpu_model()
    seen = []
    loaded.model.register_forward_pre_hook(lambda *_: seen.append(gc.isenabled()))
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        result = run_modes(loaded, parse_modes("eager,compile"), patched=Patch(KernelTable()),
                           projected=1.0, reps=2, warmup=1)
    torch._dynamo.reset()
    assert all(s.timing is not None for s in result.subjects), [s.error for s in result.subjects]
    # eager forwards before the modes are set up are the reference; every later one is paused
    assert seen[2:] and not any(seen[2:])
    assert gc.isenabled()


def test_an_error_in_a_timed_forward_names_the_forward():
    # A kernel fault surfaces at a later call; run with CUDA_LAUNCH_BLOCKING=1 it surfaces in the
    # forward that launched it, and the note says which one that was.
    calls = []

    def faulty() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("CUDA error: unspecified launch failure")

    with pytest.raises(RuntimeError) as raised:
        time_forward_runs([ForwardRun("plain", lambda: None), ForwardRun("patched", faulty)],
                          torch.device("cpu"), reps=3, warmup=1)
    assert timing_stage(raised.value) == "host-inclusive forward 0 of patched"
