"""What `kforge e2e` keeps of a measurement, from fake timings: the figures it stores for the
session's viewers (beside its log line), and the line `kforge show` prints of them."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from kforge.app.integrate import e2e_summary, keep_e2e, model_measurement
from kforge.cli.main import main
from kforge.core.candidate import Timing
from kforge.integrate.measure import MODES, E2eResult, Measured
from kforge.runtime.table import Report
from kforge.store import Store
from kforge.store.events import LogLine, ModelMeasured
from tests.doubles import sample_cards


def measured(mode: str, median_us: float | None) -> Measured:
    timing = Timing(median_us=median_us, p10_us=median_us, p90_us=median_us, reps=20) \
        if median_us else None
    return Measured(MODES[mode].label, timing, mode=mode,
                    ran=2 if mode.endswith("+kforge") else None)


@pytest.fixture
def result() -> E2eResult:
    return E2eResult([measured("eager", 2000.0), measured("eager+kforge", 1600.0),
                      measured("graphs", 1000.0), measured("graphs+kforge", 800.0),
                      measured("compile", 900.0), measured("compile+kforge", None)],
                     Report([], {}), projected=1.31)


def test_a_measurement_keeps_each_modes_speedup_over_eager_and_kforges_gains(result):
    kept = model_measurement(result)
    assert kept.speedups == pytest.approx({"eager": 1.0, "eager+kforge": 1.25, "graphs": 2.0,
                                           "graphs+kforge": 2.5, "compile": 2000 / 900})
    assert kept.gains == pytest.approx({"eager+kforge": 1.25, "graphs+kforge": 1.25})
    assert kept.projected == 1.31
    assert kept.times_us == {"eager": 2000.0, "eager+kforge": 1600.0, "graphs": 1000.0,
                             "graphs+kforge": 800.0, "compile": 900.0}
    assert kept.kernels == {"eager+kforge": 2, "graphs+kforge": 2, "compile+kforge": 2}
    assert kept.spreads == {mode: 1.0 for mode in kept.times_us}


def test_without_an_eager_timing_only_the_gains_are_kept():
    result = E2eResult([measured("eager", None), measured("graphs", 1000.0),
                        measured("graphs+kforge", 500.0)], Report([], {}), projected=1.2)
    assert model_measurement(result) == ModelMeasured(
        {}, {"graphs+kforge": 2.0}, 1.2, times_us={"graphs": 1000.0, "graphs+kforge": 500.0},
        kernels={"graphs+kforge": 2}, spreads={"graphs": 1.0, "graphs+kforge": 1.0})


def test_e2e_stores_the_measurement_and_show_prints_it(tmp_path: Path, result, capsys):
    db = tmp_path / "k.db"

    async def keep_and_read():
        async with await Store.open(db) as store:
            sid = await store.create_profiled_session("toy", {}, {"name": "Fake GPU"},
                                                      sample_cards())
            await keep_e2e(store, sid, result)
            return sid, await store.latest_model_measurement(sid), await store.recent_logs(sid)

    sid, latest, logs = asyncio.run(keep_and_read())
    assert latest is not None and latest.record == model_measurement(result)
    assert [e.record for e in logs] == [LogLine(e2e_summary(result))]

    assert main(["show", str(sid), "--db", str(db)]) == 0
    shown = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert any(re.fullmatch(  # the headline: kforge's best mode against the best without it
        r"e2e graphs\+kforge 1\.12x over compile \(best without kforge\), measured \d+s ago; "
        r"per mode: eager\+kforge 1\.25x, graphs\+kforge 1\.25x \(each over the same mode "
        r"without kforge\); projected 1\.31x over eager \(device time; error \+5% vs "
        r"eager\+kforge's 1\.25x, \+5% vs graphs\+kforge's 1\.25x\)", line)
        for line in shown), shown


# eager+kforge gains 1.25x; graphs+kforge (2.1x over eager) is within the graphs modes' noise of
# graphs (2.0x); no kforge kernel ran under torch.compile.
NOISY = ModelMeasured(
    speedups={"eager": 1.0, "eager+kforge": 1.25, "graphs": 2.0, "graphs+kforge": 2.1,
              "compile": 1.5, "compile+kforge": 1.5},
    gains={"eager+kforge": 1.25}, projected=1.3,
    times_us={"eager": 2100.0, "eager+kforge": 1680.0, "graphs": 1050.0, "graphs+kforge": 1000.0,
              "compile": 1400.0, "compile+kforge": 1400.0},
    kernels={"eager+kforge": 2, "graphs+kforge": 2, "compile+kforge": 0},
    spreads={"eager": 1.01, "eager+kforge": 1.01, "graphs": 1.2, "graphs+kforge": 1.2,
             "compile": 1.01, "compile+kforge": 1.01})


@pytest.mark.parametrize(("measured_model", "said"), [
    (NOISY, "e2e graphs+kforge ≈ graphs (best without kforge): 1.05x, within noise, p90/p10 "
            "1.20, measured 0s ago; per mode: eager+kforge 1.25x, graphs+kforge within noise, "
            "compile+kforge no kernels (each over the same mode without kforge); projected "
            "1.30x over eager (device time; error +4% vs eager+kforge's 1.25x)"),
    (ModelMeasured(NOISY.speedups, {}, 1.3, NOISY.times_us,
                   {mode: 0 for mode in NOISY.kernels}, NOISY.spreads),
     "e2e: no kforge kernel ran in any mode, measured 0s ago; per mode: eager+kforge no kernels, "
     "graphs+kforge no kernels, compile+kforge no kernels (each over the same mode without "
     "kforge); projected 1.30x over eager (device time)"),
], ids=["noise", "no-kernels"])
def test_show_says_no_kernels_and_noise_per_mode_and_in_its_headline(tmp_path: Path, capsys,
                                                                    measured_model, said):
    db = tmp_path / "k.db"

    async def keep() -> int:
        async with await Store.open(db) as store:
            sid = await store.create_profiled_session("toy", {}, {}, sample_cards())
            await store.add_model_measurement(sid, measured_model)
            return sid

    sid = asyncio.run(keep())
    assert main(["show", str(sid), "--db", str(db)]) == 0
    assert said in [line.strip() for line in capsys.readouterr().out.splitlines()]


def test_show_says_nothing_of_a_model_never_measured(tmp_path: Path, capsys):
    db = tmp_path / "k.db"

    async def make():
        async with await Store.open(db) as store:
            return await store.create_profiled_session("toy", {}, {}, sample_cards())

    sid = asyncio.run(make())
    assert main(["show", str(sid), "--db", str(db)]) == 0
    assert "e2e" not in capsys.readouterr().out
