"""An outcome's typed facts: their stored form both ways, the previous form read to the same
facts, damaged values dropped with a note, and the report sections each present exactly where
its facts are."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kforge.core.candidate import EvalOutcome, EvalStatus, Timing
from kforge.core.outcome import (
    Comparison,
    CompileFacts,
    Confirmation,
    Correctness,
    CounterFigures,
    Element,
    FailureEvidence,
    HostCost,
    LaunchCounters,
    Mismatch,
    NonFinite,
    Placement,
    Precision,
    RangeFigures,
    RangePoint,
    SanitizerReport,
    SetCheck,
    Tolerance,
    Work,
)
from kforge.core.report import (
    COMPILER_LOG,
    CORRECTNESS,
    DROPPED,
    EVIDENCE,
    MORE,
    TIMING,
    outcome_sections,
    section,
)

T = Timing(20.0, 19.5, 21.0, 100, host_us=4.0, wall_us=20.5)
E = Timing(40.0, 39.0, 41.0, 100)
CHECK = SetCheck("seed 1", 0.001, 0.0002, True, 64, Precision(0.01, 0.02, 0.03), True)
FULL = EvalOutcome(
    EvalStatus.OK, "2.00x eager", "ptxas info: 32 registers", T, E, 2.0, 900.0, 0.5, 1.25,
    work=Work(1 << 20, 1 << 19, 10.0, 8.0, 4096, 0.5, 2, 8, ("a hold timed out",)),
    compile=CompileFacts(0.2, True, {"k": 32}, False), host=HostCost(9.5, 7.0),
    confirmation=Confirmation("held: 12x", True, 12.0, SanitizerReport(True, "memcheck"),
                              1.5, 3.0, 1e9),
    ranges=RangeFigures((RangePoint({"L": 1}, 1.5, 2.0, 3.0),)),
    correctness=Correctness((CHECK,), (SetCheck("stress ramp"),), CHECK,
                            {"float32": Tolerance(1e-5, 1e-5, 1e-4)}, {"huge": "all NaN"}),
    counters=CounterFigures("CUPTI range profiler", passes=1, kernels=(
        LaunchCounters("k", duration_ns=2000.0, dram_read_bytes=1e6),)),
    placement=Placement("cuda:1", "host-a", 1))
FAILED = EvalOutcome(
    EvalStatus.MISMATCH, "seed 2, result 0: values differ",
    failure=FailureEvidence(
        Mismatch("seed 2, run 1", 0, (4, 4), "float32", 1, "inf", 0.5, ((2, 2), (3, 3)),
                 {"nan": NonFinite(0, 1)}, (Element((2, 3), 1.0, "nan"),)),
        (CHECK,), Comparison(False, "differs", 1.0, 0.5, 1, 16), "", "Traceback ..."))


@pytest.mark.parametrize("outcome", [FULL, FAILED, EvalOutcome(EvalStatus.TIMEOUT)])
def test_an_outcome_reads_back_from_its_stored_form_to_the_same_facts(outcome):
    stored = json.loads(json.dumps(outcome.to_dict()))
    assert "extra" not in stored
    assert EvalOutcome.from_dict(stored) == outcome


def test_an_outcome_of_the_previous_form_reads_to_the_same_facts():
    old = {"status": "ok", "summary": "2.00x eager", "compile_log": "ptxas info: 32 registers",
           "timing": vars(T), "eager": vars(E), "speedup": 2.0, "bandwidth_gbs": 900.0,
           "floor_fraction": 0.5, "wall_s": 1.25, "restart": False,
           "correctness": {"sets": [{"inputs": "seed 1", "max_abs": 0.001, "rel_norm": 0.0002,
                                     "deterministic": True, "placement": 64,
                                     "precision": {"candidate_error": 0.01,
                                                   "eager_error": 0.02, "bound": 0.03},
                                     "address_check": True}],
                           "stress": [{"inputs": "stress ramp", "max_abs": 0.0,
                                       "rel_norm": 0.0, "deterministic": None,
                                       "placement": None}],
                           "after_timing": {"inputs": "seed 1", "max_abs": 0.001,
                                            "rel_norm": 0.0002, "deterministic": True,
                                            "placement": 64, "address_check": True,
                                            "precision": {"candidate_error": 0.01,
                                                          "eager_error": 0.02, "bound": 0.03}},
                           "tolerances": {"float32": {"rtol": 1e-5, "atol": 1e-5,
                                                      "norm": 1e-4}},
                           "stress_dropped": {"huge": "all NaN"}},
           "extra": {"compile_s": 0.2, "compile_cached": True, "registers": {"k": 32},
                     "spills": False, "launches": 2, "device": "cuda:1",
                     "read_bytes": 1 << 20, "write_bytes": 1 << 19, "floor_us": 10.0,
                     "hard_floor_us": 8.0, "flops": 4096, "checked_timed_calls": 8,
                     "timing_notes": ["a hold timed out"], "host_us": 9.5,
                     "eager_host_us": 7.0, "tflops": 0.5, "held": "held: 12x",
                     "counters": {"tool": "CUPTI range profiler", "passes": 1,
                                  "kernels": [{"kernel": "k", "duration_ns": 2000.0,
                                               "dram_read_bytes": 1e6}]},
                     "first_speedup": 12.0, "sanitizer": {"ok": True, "tool": "memcheck"},
                     "confirmed": True, "confirmation": {"waited_s": 1.5, "ran_s": 3.0,
                                                         "at": 1e9},
                     "ranges": [{"point": {"L": 1}, "speedup": 1.5, "median_us": 2.0,
                                 "eager_us": 3.0}],
                     "node": "host-a", "node_gpu": 1, "a later key": [1, 2]}}
    assert EvalOutcome.from_dict(old) == FULL
    failed = {"status": "mismatch", "summary": "seed 2, result 0: values differ",
              "extra": {"device": 0, "traceback": "Traceback ...",
                        "report": {"ok": False, "reason": "differs", "max_abs": 1.0,
                                   "rel_norm": 0.5, "bad": 1, "numel": 16},
                        "mismatch": {"where": "seed 2, run 1", "result": 0, "shape": [4, 4],
                                     "dtype": "float32", "faults": 1, "max_abs": "inf",
                                     "rel_norm": 0.5, "fault_span": [[2, 2], [3, 3]],
                                     "nonfinite": {"nan": {"eager": 0, "candidate": 1}},
                                     "worst": [{"index": [2, 3], "eager": 1.0,
                                                "candidate": "nan"}]},
                        "sets_passed": [vars(CHECK) | {"precision": vars(CHECK.precision)}]}}
    assert EvalOutcome.from_dict(failed) == replace(FAILED, placement=Placement("cuda:0"))


def test_damaged_facts_are_dropped_with_a_note_and_the_rest_reads():
    stored = {**FULL.to_dict(), "host": {"host_us": "fast", "eager_host_us": 7.0},
              "work": {"read_bytes": 10, "flops": float("inf"), "launches": True},
              "counters": [1, 2], "placement": {"device": "cuda:0", "color": "red"}}
    outcome = EvalOutcome.from_dict(json.loads(json.dumps(stored)))
    assert outcome.host is None and outcome.counters is None
    assert outcome.work == Work(read_bytes=10)
    assert outcome.placement == Placement("cuda:0") and outcome.compile == FULL.compile
    notes = "\n".join(outcome.notes)
    assert 'host.host_us is "fast", not a finite number: dropped' in notes
    assert "work.flops is Infinity" in notes and "work.launches is true" in notes
    assert "counters is [1, 2], not a table: dropped" in notes and "color" not in notes
    again = EvalOutcome.from_dict(outcome.to_dict())  # the notes are kept
    assert again.notes == outcome.notes
    assert section(outcome_sections(outcome), DROPPED) == outcome.notes


def test_a_confirmation_verdict_carries_the_first_outcomes_facts_only():
    later = FULL.judged_again(EvalStatus.INFRA, "could not confirm")
    assert later.work == FULL.work and later.host == FULL.host
    assert later.timing is None and later.speedup is None and later.correctness is None
    assert not later.held and later.confirmation == FULL.confirmation


def titles(outcome: EvalOutcome) -> list[str]:
    return [s.title for s in outcome_sections(outcome)]


def test_each_section_appears_where_its_facts_are_and_nowhere_else():
    assert titles(FULL) == [TIMING, EVIDENCE, COMPILER_LOG, CORRECTNESS, MORE]
    assert titles(FAILED) == [TIMING, EVIDENCE, MORE]
    assert titles(EvalOutcome(EvalStatus.OK)) == [TIMING]
    bare = replace(FULL, compile_log=" \n", correctness=Correctness(), compile=None,
                   counters=None, work=None, ranges=None, placement=None, confirmation=None)
    assert titles(bare) == [TIMING]


def test_the_timing_section_names_every_figure():
    lines = section(outcome_sections(FULL, used=False), TIMING)
    assert lines[0] == ("time      device median 20.0 us, p10 19.5 us, p90 21.0 us (100 reps); "
                        "host 4.0 us; wall 20.5 us")
    assert lines[2] == "speedup   2.00x (eager's device time over the kernel's)"
    assert "held      held: 12x; re-timed so: this is the confirmation run's figure" in lines
    assert "bandwidth 900 GB/s" in lines and "evaluated in 1.25 s" in lines
    assert "floor     runs at 50% of the physical floor's speed" in lines
    assert ("patched   host time to issue one call of the patched op: 9.5 us through the "
            "launch path, 7.0 us through eager's dispatch") in lines
    assert ("confirmed on new inputs in a fresh worker (first timed at 12.00x); "
            "compute-sanitizer clean; not used: it no longer beats every baseline beyond the "
            "timing noise") in lines
    unconfirmed = section(outcome_sections(replace(FULL, confirmation=None, host=None)), TIMING)
    assert not [line for line in unconfirmed if line.startswith(("held", "confirmed",
                                                                 "patched"))]


def test_evidence_is_the_profile_of_a_working_kernel_and_the_failure_of_a_broken_one():
    working = section(outcome_sections(FULL), EVIDENCE)
    assert working[0] == "ptxas: k 32 registers/thread; no spills"
    assert working[1].startswith("hardware counters (CUPTI range profiler, one call")
    broken = section(outcome_sections(FAILED), EVIDENCE)
    assert broken[0].startswith("mismatch evidence, seed 2, run 1, result 0 (float32 [4, 4]):")
    assert "- passed before it: seed 1" in broken[0]


def test_more_figures_name_what_no_other_section_tells():
    more = section(outcome_sections(FULL), MORE)
    assert "  work.read_bytes: 1048576" in more and "  placement.node: \"host-a\"" in more
    assert "  compile.seconds: 0.2" in more and "  confirmation.waited_s: 1.5" in more
    told = ("host.", "counters.", "correctness.", "compile.registers", "confirmation.held",
            "confirmation.sanitizer", "confirmation.first_speedup")
    assert not [line for line in more if line.strip().startswith(told)]
    assert list(more) == sorted(more)
    failed = section(outcome_sections(FAILED), MORE)
    assert failed == ('  failure.report: {"ok": false, "reason": "differs", "max_abs": 1.0, '
                      '"rel_norm": 0.5, "bad": 1, "numel": 16}',
                      '  failure.traceback: "Traceback ..."')
