"""The generation benchmark on the CPU with Gemma 4's tiny twin: every run is a real greedy
generate compared token by token with eager's; a range kernel serves the KV append at every step
of a dynamic-cache generation; a model without a static cache falls back to the dynamic one with
a note. GPU runs of the real models are in ``test_generate_gpu``."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kforge.core.argspec import encode_call
from kforge.core.laws import Ranges, Symbol
from kforge.core.opcard import OpCard
from kforge.core.ranges import fit_laws, range_card, skeleton
from kforge.errors import KforgeError
from kforge.integrate import generate as generation
from kforge.integrate.generate import (
    DYNAMIC,
    EAGER,
    MODES,
    STATIC,
    agreement,
    compile_config,
    first_divergence,
    generate_tokens,
    parse_modes,
    run_generation,
)
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable
from tests.eval.candidates import tensor

CAT = "aten.cat.default"
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed")


def test_modes_are_chosen_by_id_or_by_base_and_eager_always_runs():
    assert [m.id for m in parse_modes("graphs")] == ["eager", "graphs", "graphs+kforge"]
    assert [m.id for m in parse_modes("compile+kforge")] == ["eager", "compile+kforge"]
    assert [m.id for m in parse_modes("all", kforge=False)] == ["eager", "graphs", "compile"]
    assert len(parse_modes(None)) == len(MODES) == 6
    with pytest.raises(KforgeError, match="unknown generation mode 'fast'"):
        parse_modes("fast")


def test_the_first_diverging_token_is_found_over_the_batch():
    reference = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert first_divergence(reference, reference.clone()) is None
    other = reference.clone()
    other[1, 2] = 0
    other[0, 3] = 0
    assert first_divergence(reference, other) == 2
    assert first_divergence(reference, reference[:, :3]) == 0


@pytest.fixture(scope="module")
def tiny():
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    from kforge.capture import ModelOptions, load_model

    loaded = load_model("gemma4-tiny", ModelOptions(mode="prefill", seq_len=8, batch=1,
                                                    dtype="fp32"))
    return loaded.model, loaded.kwargs["input_ids"]


class CatRecorder(TorchDispatchMode):
    """The arg specs of every KV append (``aten.cat`` along the sequence)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[list, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if str(func) == CAT:
            self.calls.append(encode_call(func, args, kwargs))
        return func(*args, **kwargs)


class CountingRange:
    """A range entry's runner for tests: the KV append computed by PyTorch at any point, in
    float64 (another variant, which the guard lets through), with the points it served."""

    def __init__(self) -> None:
        self.points: list[int] = []

    def at(self, point):
        self.points.append(point["L"])
        return self.append

    @staticmethod
    def append(args: tuple, kwargs: dict) -> torch.Tensor:
        tensors, dim = args
        return torch.cat([t.double() for t in tensors], dim).to(tensors[0].dtype)


def kv_append_range(model, prompt) -> OpCard:
    """The range card of the full-attention layers' KV append, fitted from the calls of a real
    dynamic-cache generation (one call per step, the cache one longer each time)."""
    recorder = CatRecorder()
    with recorder:
        generate_tokens(model, prompt, 4, cache=DYNAMIC)
    growing = {}
    for args, kwargs in recorder.calls:
        first = args[0]["items"][0]
        if len(first["shape"]) != 4 or args[1:] != [-2]:
            continue  # not a KV append (generate's own token concatenation)
        length = first["shape"][2]
        growing.setdefault(skeleton(CAT, args, kwargs), {})[length] = (args, kwargs)
    series = max(growing.values(), key=len)
    assert len(series) >= 3
    observed = sorted(series.items())
    laws = fit_laws([(n, *spec) for n, spec in observed])
    at, (args, kwargs) = observed[1]
    return range_card(OpCard(CAT, args, kwargs), Ranges((Symbol("L", 1, 64, at),), laws))


@needs_transformers
def test_a_range_kernel_serves_every_step_of_a_dynamic_cache_generation(tiny):
    model, prompt = tiny
    card = kv_append_range(model, prompt)
    runner = CountingRange()
    kernels = Patch(KernelTable([Entry(CAT, card.args, card.kwargs, runner, torch.device("cpu"),
                                       label="kv append", key=card.key, ranges=card.ranges)]))
    result = run_generation(model, prompt, 4, modes=parse_modes("eager"), kernels=kernels,
                            cache=DYNAMIC, reps=1, hand_back=False)
    eager, patched = result.run(EAGER), result.run("eager+kforge")
    assert eager.tokens.shape == patched.tokens.shape == (1, 4)
    assert patched.first_divergence is None and agreement(patched) == "same"
    served = sorted(set(runner.points))
    assert len(served) >= 3 and served == list(range(served[0], served[0] + len(served)))
    assert patched.kernels.endswith(" calls") and int(patched.kernels.split()[0]) > 0
    assert eager.tokens_per_s() > 0 and patched.setup_s is not None
    assert [run.error for run in result.runs if run.mode.kind != EAGER] == []
    table = result.table()
    assert "eager + kforge" in table and "same" in table


@needs_transformers
def test_a_model_without_a_static_cache_falls_back_to_the_dynamic_one(tiny, monkeypatch):
    model, prompt = tiny
    generate = model.generate

    def no_static(*args, **kwargs):
        if kwargs.get("cache_implementation") == STATIC:
            raise ValueError("this model has no static cache")
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", no_static)
    result = run_generation(model, prompt, 2, modes=parse_modes("all", kforge=False), reps=1)
    assert result.cache == DYNAMIC
    assert "cannot generate with a static cache (ValueError" in result.notes[0]
    assert result.run(EAGER).tokens is not None
    for mode in ("graphs", "compile"):
        assert result.run(mode).error == "not measured: it needs a static cache"
    assert "note: " in result.table() and result.to_dict()["cache"] == DYNAMIC


@needs_transformers
def test_static_cache_generation_matches_the_dynamic_one(tiny):
    model, prompt = tiny
    assert torch.equal(generate_tokens(model, prompt, 3, cache=STATIC),
                       generate_tokens(model, prompt, 3, cache=DYNAMIC))


def test_bad_requests_are_refused_in_one_line():
    with pytest.raises(KforgeError, match="has no generate"):
        run_generation(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long), 2,
                       modes=parse_modes("eager"))

    class Generates(torch.nn.Module):
        def generate(self, *args, **kwargs):
            raise AssertionError("not reached")

    with pytest.raises(KforgeError, match="need kforge's kernels"):
        run_generation(Generates(), torch.zeros(1, 2, dtype=torch.long), 2,
                       modes=parse_modes("eager"))
    with pytest.raises(KforgeError, match="unknown cache"):
        run_generation(Generates(), torch.zeros(1, 2, dtype=torch.long), 2,
                       modes=parse_modes("eager", kforge=False), cache="paged")


@needs_transformers
def test_a_session_patch_runs_bound_to_the_generating_model(tiny, monkeypatch):
    """Region kernels replace module forwards, so the patch active in each +kforge mode must
    know the model that generates, or those kernels never run."""
    from kforge.integrate.patching import SessionPatch
    from kforge.integrate.plan import SessionPlan
    from kforge.store.records import Session

    model, prompt = tiny
    bound_to = []
    install = SessionPatch.install

    def recording(self):
        bound_to.append(self.model)
        install(self)

    monkeypatch.setattr(SessionPatch, "install", recording)
    session = Session(id=1, model="gemma4-tiny", gpu={}, settings={}, status="done", error="",
                      created_at=0.0, updated_at=0.0)
    kernels = SessionPatch(SessionPlan(session, []), KernelTable(), [])
    result = run_generation(model, prompt, 2, modes=parse_modes("eager"), kernels=kernels,
                            cache=DYNAMIC, reps=1)
    assert result.run("eager+kforge").tokens is not None
    assert bound_to and all(m is model for m in bound_to)
    assert kernels.model is None  # the caller's patch is left as it was given


class SlowRange(CountingRange):
    """The KV append, served slowly: kforge's kernel loses to eager's."""

    def at(self, point):
        time.sleep(0.05)
        return super().at(point)


@needs_transformers
def test_a_kforge_mode_no_faster_in_its_trial_is_handed_back(tiny):
    model, prompt = tiny
    card = kv_append_range(model, prompt)
    kernels = Patch(KernelTable([Entry(CAT, card.args, card.kwargs, SlowRange(),
                                       torch.device("cpu"), label="kv append", key=card.key,
                                       ranges=card.ranges)]))
    result = run_generation(model, prompt, 4, modes=parse_modes("eager"), kernels=kernels,
                            cache=DYNAMIC, reps=2)
    eager, patched = result.run(EAGER), result.run("eager+kforge")
    assert patched.tried is not None and patched.tried < 1.0
    assert patched.kernels.startswith("no kernels (eager's own): kforge's tried at 0.")
    assert patched.seconds == eager.seconds and torch.equal(patched.tokens, eager.tokens)
    assert result.gain(EAGER) == 1.0 and patched.trial_s > eager.trial_s
    row = result.to_dict()["runs"][1]
    assert row["handed_back_tried"] == patched.tried and row["kforge_gain"] == 1.0


def kernel_of(op: str, args: list, label: str) -> Entry:
    return Entry(op, args, {}, lambda args, kwargs: None, torch.device("cpu"), label=label)


@needs_transformers
def test_the_compiled_kforge_mode_leaves_ops_inductor_fuses_to_inductor(monkeypatch):
    """As ``kforge.backend(session)`` does: a kernel of an op Inductor fuses would take it out of
    Inductor's fusions, which a generate does not weigh kernel by kernel."""
    relu = kernel_of("aten.relu.default", [tensor([4, 8])], "relu")
    mm = kernel_of("aten.mm.default", [tensor([4, 8]), tensor([8, 4])], "mm")
    _, chosen = compile_config(MODES["compile+kforge"], "reduce-overhead",
                               Patch(KernelTable([relu, mm])), torch.device("cpu"))
    assert chosen.table.entries == [mm]
    assert [n.split(":")[0] for n in chosen.report.notes] == ["relu"]

    class Counting(torch.nn.Module):
        """A generate that returns zeros and counts its calls (nothing is compiled)."""

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def generate(self, input_ids, **options):
            self.calls += 1
            return torch.cat([input_ids, torch.zeros_like(input_ids[:, :2])], dim=1)

    monkeypatch.setattr(generation, "static_cache_problem", lambda model, input_ids: None)
    model = Counting()
    result = run_generation(model, torch.zeros(1, 3, dtype=torch.long), 2,
                            modes=parse_modes("compile"), kernels=Patch(KernelTable([relu])),
                            reps=1)
    compiled, with_kforge = result.run("compile"), result.run("compile+kforge")
    assert model.calls == 6  # eager's and compile's: setup, trial, one timed; none of kforge's
    assert with_kforge.kernels == ("no kernels (Inductor's own): every kernel is of an op "
                                   "Inductor fuses")
    assert with_kforge.seconds == compiled.seconds and result.gain("compile") == 1.0
