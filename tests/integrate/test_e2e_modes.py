"""`kforge e2e`'s modes: which ones --modes picks, and the side-by-side table it prints, from fake
timings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kforge.app.integrate import e2e_summary
from kforge.cli.cmd_integrate import e2e_rows, print_e2e
from kforge.cli.main import main
from kforge.core.candidate import Timing
from kforge.errors import KforgeError
from kforge.integrate.decide import hand_back, verdict
from kforge.integrate.measure import MODES, Difference, E2eResult, Measured, parse_modes
from kforge.runtime.table import KernelCount, Report


def ids(text: str | None) -> list[str]:
    return [m.id for m in parse_modes(text)]


def test_modes_are_picked_by_name_or_by_base_in_table_order_with_eager_always_first():
    assert ids(None) == ids("all") == list(MODES) and len(MODES) == 10
    assert ids("compile") == ["eager", "compile", "compile+kforge"]
    assert ids("max-autotune+kforge, graphs") == ["eager", "graphs", "graphs+kforge",
                                                   "max-autotune+kforge"]
    assert ids("eager") == ["eager", "eager+kforge"]
    assert [m.label for m in parse_modes("reduce-overhead")] == [
        "eager", "reduce-overhead", "reduce-overhead + kforge"]
    assert MODES["reduce-overhead+kforge"].compile == "reduce-overhead"
    assert MODES["graphs+kforge"].graphs and MODES["graphs+kforge"].base == "graphs"


def test_an_unknown_mode_is_named():
    with pytest.raises(KforgeError, match=r"unknown mode 'fast': use all, or any of eager, "
                                          r"eager\+kforge, graphs"):
        parse_modes("compile,fast")


def test_an_unknown_mode_on_the_command_line_is_one_line(capsys):
    assert main(["e2e", "1", "--modes", "turbo"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kforge: unknown mode 'turbo'")


def timing(median_us: float, spread: float = 1.1) -> Timing:
    return Timing(median_us=median_us, p10_us=0.95 * median_us, p90_us=0.95 * spread * median_us,
                  reps=20)


def measured(mode: str, median_us: float | None, spread: float = 1.1, **fields) -> Measured:
    return Measured(MODES[mode].label, timing(median_us, spread) if median_us else None,
                    mode=mode, **fields)


@pytest.fixture
def result() -> E2eResult:
    same = Difference(0.0, 0.0)
    return E2eResult([
        measured("eager", 2000.0),
        measured("eager+kforge", 1600.0, difference=Difference(1e-3, 2e-4), kernels="6 calls",
                 ran=3, host=timing(2100.0)),
        measured("graphs", 1000.0, difference=same, setup_s=0.4),
        measured("graphs+kforge", 800.0, difference=same, setup_s=0.5, kernels="6 captured",
                 ran=3),
        measured("compile", 900.0, difference=same, setup_s=12.0),
        measured("compile+kforge", 1000.0, difference=same, setup_s=14.0, kernels="6 nodes",
                 ran=3),
        measured("reduce-overhead", 700.0),
        measured("reduce-overhead+kforge", 600.0, kernels="no kernels", ran=0),
        measured("max-autotune", None, error="torch.compile failed: InductorError: boom"),
    ], Report([KernelCount("#3 _softmax(f32[2,32,32], -1, False)", "aten._softmax.default",
                           "k", 2, 0, "")], {}), projected=1.31,
        notes=["eager + kforge: #4 gelu(...): kept on eager, the model is slower with it"])


def test_gains_compare_each_mode_with_itself_without_kforge(result):
    assert result.gain("eager") == pytest.approx(1.25)
    assert result.gain("graphs") == pytest.approx(1.25)
    assert result.gain("compile") == pytest.approx(0.9)
    assert result.gain("max-autotune") is None
    assert result.gain("reduce-overhead") is None  # no kforge kernel ran: 1.17x is noise
    assert result.gains() == pytest.approx({"eager": 1.25, "CUDA graphs": 1.25, "compile": 0.9})
    assert result.measured == pytest.approx(1.25)


def test_a_mode_whose_own_noise_hides_any_gain_has_none():
    noisy = E2eResult([measured("compile", 2850.0, spread=3.3),
                       measured("compile+kforge", 1500.0, ran=4)], Report([], {}), 1.2)
    assert noisy.undecidable("compile") and noisy.gain("compile") is None
    (row,) = [r for r in e2e_rows(noisy) if r[0] == "compile + kforge"]
    assert row[6] == "undecidable (noisy: see the CUDA-graph modes)"


def test_a_compiled_mode_where_kforge_is_not_faster_hands_back_inductors_result(result):
    hand_back(result)
    row = result.subject("compile+kforge")
    assert row.timing == result.subject("compile").timing and row.tried.median_us == 1000.0
    assert row.ran == 0 and row.kernels == "no kernels (Inductor's own)"
    assert "compile + kforge: with kforge's kernels the compiled model is 0.900x of " \
           "torch.compile alone" in result.notes[-2]
    assert result.notes[-2].endswith("Inductor's own result is handed back")
    assert result.notes[-1] == ("reduce-overhead + kforge: no kforge kernel is in the compiled "
                                "model: Inductor's own result is handed back")
    assert result.gains() == pytest.approx({"eager": 1.25, "CUDA graphs": 1.25})
    assert e2e_rows(result)[5][9] == "no kernels (Inductor's own); with kforge's it ran 1.00 ms"


def test_a_compiled_mode_with_no_kernel_chosen_is_torch_compiles_own_row():
    result = E2eResult([measured("max-autotune", 500.0, difference=Difference(0.0, 1e-6)),
                        measured("max-autotune+kforge", None, ran=0, kernels="no kernels")],
                       Report([], {}), 1.0)
    hand_back(result)
    row = result.subject("max-autotune+kforge")
    assert row.timing.median_us == 500.0 and row.tried is None and row.difference.rel == 1e-6
    assert result.notes == ["max-autotune + kforge: no kforge kernel is in the compiled model: "
                            "Inductor's own result is handed back"]


def test_kforges_compiled_model_is_kept_only_beyond_noise_and_the_minimum_gain():
    assert verdict("compile", timing(1000.0), timing(800.0), 3).kept
    assert not verdict("compile", timing(1000.0), timing(990.0), 3).kept  # inside the noise
    assert not verdict("compile", timing(1000.0), timing(800.0), 0).kept  # no kernel in it
    tight = Timing(median_us=1000.0, p10_us=999.0, p90_us=1001.0, reps=20)
    slightly = Timing(median_us=990.0, p10_us=989.0, p90_us=991.0, reps=20)
    assert not verdict("compile", tight, slightly, 3).kept  # beyond noise, below the minimum


def test_the_table_has_a_row_per_mode_with_speedups_setup_and_kernels(result):
    rows = {row[0]: row for row in e2e_rows(result)}
    assert list(rows) == [s.name for s in result.subjects]
    assert rows["eager"] == ["eager", "2.00 ms", "1.90 ms", "2.09 ms", "-", "1.00x", "", "-", "",
                             ""]
    assert rows["eager + kforge"][4:7] == ["2.10 ms", "1.25x", "1.25x"]
    assert rows["eager + kforge"][7] == "max |diff| 0.001, relative 0.0002"
    assert rows["CUDA graphs + kforge"][5:] == ["2.50x", "1.25x", "max |diff| 0, relative 0",
                                                "0.5 s", "6 captured"]
    assert rows["compile + kforge"][5:7] == ["2.00x", "0.90x"]
    assert rows["reduce-overhead + kforge"][6] == "no kernels"
    assert rows["compile"][8] == "12.0 s"
    assert rows["max-autotune"][1:] == ["-"] * 8 + ["torch.compile failed: InductorError: boom"]


def test_the_printed_table_ends_with_projected_and_measured(result, capsys):
    session = SimpleNamespace(id=3, model="toy.py:build", settings={"dtype": "float32",
                                                                     "batch": 2})
    print_e2e(SimpleNamespace(session=session), result)
    printed = capsys.readouterr().out
    assert printed.startswith("session 3  toy.py:build (dtype=float32 batch=2)")
    for header in ("mode", "device", "host-incl.", "vs eager", "kforge gain", "output vs eager",
                   "compile/capture", "kforge kernels"):
        assert header in printed
    assert "note: eager + kforge: #4 gelu(...): kept on eager, the model is slower with it" in (
        printed)
    assert ("kforge's best mode: e2e graphs+kforge 0.88x vs reduce-overhead: best without "
            "kforge is faster") in printed
    assert printed.strip().splitlines()[-1] == (
        "speedup from kforge's kernels: projected 1.31x over eager (device time; error +5% vs "
        "eager's 1.25x, +5% vs CUDA graphs's 1.25x, +46% vs compile's 0.90x) from the op cards; "
        "measured (whole forward, device time) eager 1.25x, CUDA graphs 1.25x, compile 0.90x")
    assert e2e_summary(result).startswith("e2e: eager 2.00 ms, eager + kforge 1.60 ms, ")
    assert e2e_summary(result).endswith("kforge measured eager 1.25x, CUDA graphs 1.25x, compile "
                                        "0.90x, projected 1.310x; 2 kernel calls per eager "
                                        "forward")


def test_the_aa_control_follows_each_compiled_mode_measured_without_kforge():
    assert [m.id for m in parse_modes("compile,reduce-overhead", aa=True)] == [
        "eager", "compile", "compile+aa", "compile+kforge", "reduce-overhead",
        "reduce-overhead+aa", "reduce-overhead+kforge"]
    assert parse_modes("compile", aa=True)[2].control
