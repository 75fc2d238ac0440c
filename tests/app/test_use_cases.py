"""The use cases called directly (``kforge.app``): each returns its typed result, and that
result's ``to_dict()`` is what the command's ``--json`` prints; a refusal is the CLI's one line,
raised as a KforgeError."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kforge.app.facts import SessionFacts, session_facts
from kforge.app.integrate import (
    Applied,
    ApplyRequest,
    E2eMeasured,
    ExportRequest,
    apply,
    e2e_summary,
    export,
    model_measurement,
)
from kforge.app.kernel import KernelAdded, KernelRequest, add_kernel
from kforge.app.profile import ModelList, Profiled, ProfileRequest, list_models, profile
from kforge.app.search import SearchRequest, SearchStarted, start_search
from kforge.cli.main import main
from kforge.core.candidate import Timing
from kforge.errors import KforgeError
from kforge.integrate.measure import MODES, E2eResult, Measured
from kforge.runtime.table import Report
from kforge.store import SessionStatus, Store
from tests.cli.test_add_kernel import PLAN, SOURCE
from tests.doubles import sample_cards
from tests.integrate.helpers import make_session

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "tests" / "capture" / "capture_toy.py"
DOUBLES = {"proposer": "tests.doubles:make_proposer", "evaluator": "tests.doubles:make_evaluator"}


def new_session(db: Path, settings: dict | None = None) -> int:
    async def go() -> int:
        async with await Store.open(db) as store:
            return await store.create_profiled_session(
                "toy", settings or {}, {"name": "Fake GPU", "arch": "sm_90"}, sample_cards())

    return asyncio.run(go())


def cli_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_models_is_the_clis_list(capsys):
    models = list_models()
    assert isinstance(models, ModelList) and models.models[0][0] == "resnet50"
    assert models.to_dict() == cli_json(capsys, "profile", "--list")


def test_profile_stores_a_session_and_answers_as_the_cli_does(tmp_path, capsys):
    request = ProfileRequest(f"{TOY}:build", device="cpu", samples=1, batch=3)
    stages = []
    profiled = profile(tmp_path / "app.db", request, lambda stage, *_: stages.append(stage))
    assert isinstance(profiled, Profiled) and isinstance(profiled.facts, SessionFacts)
    assert (profiled.session, profiled.facts.status, profiled.model) == (1, "ready",
                                                                        f"{TOY}:build")
    assert profiled.samples >= 1 and profiled.settings["batch"] == 3
    assert {"build", "profile"} <= set(stages)
    assert profiled.facts == session_facts(tmp_path / "app.db", 1)
    answer = cli_json(capsys, "profile", f"{TOY}:build", "--device", "cpu", "--samples", "1",
                      "--batch", "3", "--db", str(tmp_path / "cli.db"))
    assert profiled.to_dict() == answer


def test_a_failed_profile_raises_and_creates_no_database(tmp_path):
    with pytest.raises(KforgeError):
        profile(tmp_path / "k.db", ProfileRequest(f"{TOY}:failing_model", device="cpu"))
    assert not (tmp_path / "k.db").exists()


def test_a_search_here_answers_as_the_cli_does(tmp_path, capsys):
    app_db, cli_db = tmp_path / "app.db", tmp_path / "cli.db"
    sid = new_session(app_db)
    assert new_session(cli_db) == sid
    request = SearchRequest(**DOUBLES, iterations_per_op=2)
    seen = []

    class Display:
        def __enter__(self):
            seen.append("entered")

        def __exit__(self, *exc):
            seen.append("left")

        def __call__(self, snap):
            seen.append(snap.session_id)

    started = start_search(app_db, sid, request, Display())
    assert isinstance(started, SearchStarted) and not started.detached
    assert started.status == SessionStatus.DONE and started.ended_well
    assert started.facts == session_facts(app_db, sid) and started.facts.confirming == ()
    assert seen[0] == "entered" and seen[-1] == "left" and sid in seen
    answer = cli_json(capsys, "search", "--session", str(sid), "--db", str(cli_db),
                      "--iterations", "2", "--proposer", DOUBLES["proposer"],
                      "--evaluator", DOUBLES["evaluator"])
    assert started.to_dict() == answer


def test_a_search_request_names_only_what_was_given():
    request = SearchRequest(proposer="library", cluster="none", usd=2.0)
    assert request.given() == {"proposer": "library", "cluster": "", "usd": 2.0}
    assert SearchRequest().given() == {}
    assert SearchRequest(**DOUBLES).consent().options() == [
        "--evaluator", DOUBLES["evaluator"], "--proposer", DOUBLES["proposer"]]
    assert SearchRequest(**DOUBLES, trust_plugins=True).consent().options() == [
        "--trust-plugins"]


def test_a_search_of_an_unknown_session_is_one_error(tmp_path):
    new_session(tmp_path / "k.db")
    with pytest.raises(KforgeError, match="no session 9"):
        start_search(tmp_path / "k.db", 9, SearchRequest())


@pytest.fixture
def add_card(tmp_path) -> tuple[Path, int, int]:
    db = tmp_path / "k.db"
    sid = new_session(db, {"search": DOUBLES})

    async def card() -> int:
        async with await Store.open(db) as store:
            return next(r.id for r in await store.list_cards(sid) if r.card.op == "aten.add.Tensor")

    return db, sid, asyncio.run(card())


def test_add_kernel_returns_the_users_node(add_card):
    db, sid, card = add_card
    added = add_kernel(db, KernelRequest(sid, card, SOURCE, PLAN, approach="one thread each",
                                         trust_plugins=True))
    assert isinstance(added, KernelAdded) and added.node.card_id == card
    assert added.node.meta["proposer"] == "user" and added.node.action == "new"
    assert added.to_dict() == {
        "session": sid, "card": card, "node": added.node.id, "proposer": "user",
        "action": "new", "status": added.node.status, "ok": added.node.ok,
        "confirmed": added.node.confirmed, "speedup": added.outcome.speedup,
        "summary": added.node.summary or None}


def test_add_kernel_refuses_an_unknown_card_as_the_cli_does(add_card):
    db, sid, _ = add_card
    with pytest.raises(KforgeError, match=f"no op card 999 in session {sid}"):
        add_kernel(db, KernelRequest(sid, 999, SOURCE, PLAN, trust_plugins=True))


@pytest.fixture(scope="module")
def winners(tmp_path_factory) -> tuple[Path, int]:
    db = tmp_path_factory.mktemp("app") / "k.db"
    return db, make_session(db)


def test_apply_without_a_gpu_gives_the_decisions_alone(winners, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    db, sid = winners
    told = []
    applied = apply(db, ApplyRequest(sid, cuda_graphs=True), lambda *shown: told.append(shown))
    assert isinstance(applied, Applied) and applied.patch is None and applied.run is None
    assert told == [(applied.plan, None)]
    facts = applied.to_dict()
    assert (facts["session"], facts["made_on"], facts["loaded"]) == (sid, "sm_90", False)
    assert facts["kernels"] == 3 and facts["op_variants"] == len(applied.plan.decisions)
    assert sorted(d["speedup"] for d in facts["decisions"] if d["replaced"]) == [1.3, 1.4, 1.8]
    assert json.loads(json.dumps(facts)) == facts
    with pytest.raises(KforgeError, match="kforge apply needs a CUDA GPU"):
        apply(db, ApplyRequest(sid, run=True))


def test_export_of_nothing_tells_the_plan_then_refuses(winners, tmp_path):
    db, _ = winners
    empty = make_session(db, winners={})
    told = []
    with pytest.raises(KforgeError, match=f"session {empty} has nothing to export"):
        export(db, ExportRequest(empty, tmp_path), lambda *shown: told.append(shown))
    assert [plan.session.id for plan, _ in told] == [empty]
    assert not list(tmp_path.iterdir())


def test_export_writes_the_package(winners, tmp_path):
    pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")
    db, sid = winners
    result = export(db, ExportRequest(sid, tmp_path, name="k"))
    facts = result.to_dict()
    assert facts["path"] == str(tmp_path / "k") and facts["archs"] == ["sm_90"]
    assert facts["unverified"] == [] and (tmp_path / "k" / "manifest.json").exists()


def test_an_e2e_measurement_reads_as_what_it_stored():
    timing = Timing(median_us=1000.0, p10_us=1000.0, p90_us=1000.0, reps=20)
    result = E2eResult([Measured(MODES["eager"].label, timing, mode="eager"),
                        Measured(MODES["eager+kforge"].label, Timing(
                            median_us=800.0, p10_us=800.0, p90_us=800.0, reps=20),
                            mode="eager+kforge", ran=2)], Report([], {}), projected=1.2)
    measured = E2eMeasured(SimpleNamespace(session=SimpleNamespace(id=4)), result)
    facts = measured.to_dict()
    assert facts["session"] == 4 and facts["projected"] == 1.2
    assert facts["measured"] == asdict(model_measurement(result))
    assert facts["summary"] == e2e_summary(result)
    assert [(m["mode"], m["median_us"]) for m in facts["modes"]] == [("eager", 1000.0),
                                                                     ("eager+kforge", 800.0)]
