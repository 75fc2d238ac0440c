"""Evaluation on a Ray cluster: actors on every node's GPUs, only the session's architecture, an
actor or a node lost mid-evaluation costs a re-queue and nothing else, a cluster that vanishes
leaves the session resumable. The cluster is a local one of several Ray nodes with made-up GPUs;
its workers are stand-ins (tests.eval.gated_worker) speaking the real protocol."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from kforge.core.candidate import Candidate
from kforge.core.gpu import GpuInfo
from kforge.core.settings import LlmSection, SearchSettings
from kforge.engine.engine import Engine
from kforge.engine.plugins import check_can_start
from kforge.errors import KforgeError
from kforge.eval.process import cluster
from kforge.eval.process.cluster import (
    DEVICE,
    PYTHON,
    ClusterEvaluator,
    WorkerStatus,
    chosen_arch,
    connect_error,
    gpu_slots,
    pack_samples,
    reach_target,
    unpack_samples,
    workers_of,
)
from kforge.store import NodeStatus, SessionStatus, Store
from tests.doubles import FakeEvaluator, FakeProposer, sample_cards
from tests.eval.fake_worker import worker_said

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="ray is not installed (pip install 'kforge[cluster]')")

STAND_IN = (PYTHON, "-m", "tests.eval.gated_worker", "--device", DEVICE)
SM90 = GpuInfo(name="Fake sm_90", arch="sm_90")
NODE_ARGS = {"num_cpus": 1, "object_store_memory": 80 << 20}
# Lost nodes are noticed within about a second, not the default quarter of a minute.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 2,
                      "health_check_initial_delay_ms": 0}
ITERATIONS = 4  # per op; three target ops
PARALLEL = 3  # the engine's requests at once: as many as the cluster has sm_90 GPUs at most


# ----- the pure rules -----


def test_one_slot_per_whole_gpu_of_each_live_node():
    nodes = [{"NodeID": "a", "Alive": True, "Resources": {"GPU": 2.0, "CPU": 8.0}},
             {"NodeID": "b", "Alive": False, "Resources": {"GPU": 4.0}},
             {"NodeID": "c", "Alive": True, "Resources": {"CPU": 4.0}},
             {"NodeID": "d", "Alive": True, "Resources": {"GPU": 1.5}}]
    assert gpu_slots(nodes) == ["a", "a", "d"]


def test_the_sessions_architecture_or_the_clusters_most_common_one():
    assert chosen_arch(["sm_80", "sm_90", "sm_90"], "sm_80") == "sm_80"
    assert chosen_arch(["sm_80", "sm_90", "sm_90"], None) == "sm_90"
    assert chosen_arch(["sm_90", "sm_80"], "none") == "sm_80"  # a tie: the first by name
    with pytest.raises(KforgeError, match=r"no GPU of this session's architecture sm_75 "
                                          r"\(it has: 1 x sm_80, 2 x sm_90\)"):
        chosen_arch(["sm_80", "sm_90", "sm_90"], "sm_75")


def test_addresses_checked_before_ray_tries():
    assert reach_target("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert reach_target("ray://head:10001") == ("head", 10001)
    assert reach_target("[::1]:6379") == ("::1", 6379)
    assert reach_target("auto") is None


def test_a_version_mismatch_is_one_line():
    raw = RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.41.0\n"
                       "    Python: 3.11.9\nThis process on node 10.0.0.2 was started with:\n"
                       "    Ray: 2.60.0\n    Python: 3.11.9\n")
    message = str(connect_error("head:6379", raw))
    assert "\n" not in message
    assert message.startswith("the Ray cluster at head:6379 runs another Ray or Python version")
    assert "Ray: 2.41.0" in message and message.endswith("install the same versions on every node")


def test_samples_pack_and_unpack_as_capture_laid_them_out(tmp_path: Path):
    card = sample_cards()[0]
    folder = tmp_path / "samples" / card.key
    folder.mkdir(parents=True)
    (folder / "0.pt").write_bytes(b"zero")
    (folder / "1.pt").write_bytes(b"one")
    files = pack_samples(tmp_path / "samples", card)
    assert files == {"0.pt": b"zero", "1.pt": b"one"}
    assert pack_samples(tmp_path / "none", card) == {} and pack_samples(None, card) == {}
    unpack_samples(tmp_path / "there", card.key, files)
    assert (tmp_path / "there" / card.key / "1.pt").read_bytes() == b"one"
    with pytest.raises(KforgeError, match="shipped sample name"):
        unpack_samples(tmp_path / "there", card.key, {"../evil.pt": b""})


@pytest.mark.parametrize("key", ["../../escaped", "/tmp/kforge-escaped", "..", "a/../../b"])
def test_a_crafted_card_key_ships_and_lays_out_no_samples_outside(tmp_path: Path, key):
    from dataclasses import replace

    outside = tmp_path / "escaped"
    outside.mkdir()
    (outside / "0.pt").write_bytes(b"not a sample of this session")
    card = replace(sample_cards()[0], key=key)
    assert pack_samples(tmp_path / "samples" / "1", card) == {}
    with pytest.raises(KforgeError, match="cannot name a folder"):
        unpack_samples(tmp_path / "there" / "1", key, {"0.pt": b"x"})
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["0.pt", "escaped"]


def test_worker_reports_read_back_leniently():
    worker = WorkerStatus("gpu-host-1", 3, "H200", "sm_90", busy=True, done=7)
    stored = {"workers": [{**worker.to_dict(), "from_a_newer_kforge": 1}, "junk"]}
    assert workers_of(stored) == [worker]
    assert workers_of({}) == [] and workers_of({"workers": "junk"}) == []


async def test_an_unreachable_address_is_one_clear_line():
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'kforge[cluster]')")
    evaluator = ClusterEvaluator("127.0.0.1:1", None)
    with pytest.raises(KforgeError, match=r"^cannot reach the Ray cluster at 127.0.0.1:1: "):
        await evaluator.start()


def test_a_search_on_a_cluster_is_checked_before_anything_is_profiled():
    with pytest.raises(KforgeError, match="runs the gpu evaluator's workers, not the plug-in"):
        check_can_start(SearchSettings(cluster="auto", evaluator="tests.doubles:make_evaluator"),
                        LlmSection())
    if importlib.util.find_spec("ray") is not None:  # no GPU needed here, only the cluster
        with pytest.raises(KforgeError, match="^cannot reach the Ray cluster at 127.0.0.1:1"):
            check_can_start(SearchSettings(cluster="127.0.0.1:1"), LlmSection())


async def test_a_cluster_without_gpus_is_one_clear_line(monkeypatch: pytest.MonkeyPatch):
    nodes = [{"NodeID": "a", "Alive": True, "Resources": {"CPU": 16.0}}]
    monkeypatch.setattr(cluster, "require_ray", lambda: SimpleNamespace(nodes=lambda: nodes))
    monkeypatch.setattr(cluster, "connect", lambda address: False)
    with pytest.raises(KforgeError, match=r"^the Ray cluster at auto has no GPU: start its GPU "):
        await ClusterEvaluator("auto", None).start()


# ----- on a cluster -----


@pytest.fixture(scope="module")
def ray_cluster():
    """A head with two sm_90 GPUs, a node with one more, and a node with one sm_80 GPU."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'kforge[cluster]')")
    from ray.cluster_utils import Cluster

    made = Cluster(initialize_head=True, head_node_args={
        **NODE_ARGS, "num_gpus": 2, "include_dashboard": False,
        "env_vars": {"KFORGE_TEST_ARCH": "sm_90"}, "_system_config": FAST_HEALTH_CHECKS})
    made.sm90_node = made.add_node(**NODE_ARGS, num_gpus=1,
                                   env_vars={"KFORGE_TEST_ARCH": "sm_90"})
    made.add_node(**NODE_ARGS, num_gpus=1, env_vars={"KFORGE_TEST_ARCH": "sm_80"})
    yield made
    made.shutdown()


def gated(gate: Path) -> FakeProposer:
    """A proposer whose candidates are held back (on any worker) until ``gate`` exists."""
    proposer = FakeProposer(speeds=(0.5, 0.9))
    propose = proposer.propose

    async def propose_gated(request):
        proposal = await propose(request)
        return replace(proposal, candidates=[replace(c, meta={**c.meta, "gate": str(gate)})
                                             for c in proposal.candidates])

    proposer.propose = propose_gated
    return proposer


def cluster_evaluator(address: str, samples_dir: Path | None, gpu: GpuInfo = SM90):
    return ClusterEvaluator(address, samples_dir, settings={"sanitize": False}, timeout_s=60,
                            start_timeout_s=60, gpu=gpu, worker_command=STAND_IN)


async def wait_until(condition: Callable[[], bool | Awaitable[bool]], what: str,
                     timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await _holds(condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _holds(answer: bool | Awaitable[bool]) -> bool:
    return await answer if inspect.isawaitable(answer) else bool(answer)


async def evaluations_held(store: Store, sid: int, evaluator: ClusterEvaluator) -> bool:
    """Every GPU busy with a stored candidate's evaluation: every one of the engine's requests
    is past its op's baseline, so no GPU is timing one."""
    evaluating = [n for n in await store.list_nodes(sid) if n.status == NodeStatus.EVALUATING]
    workers = evaluator.workers()
    return len(evaluating) == PARALLEL and bool(workers) and all(w.busy for w in workers)


async def new_session(store: Store) -> int:
    return await store.create_profiled_session("toy", {}, SM90.to_dict(), sample_cards())


def engine(store: Store, sid: int, proposer, evaluator) -> Engine:
    settings = SearchSettings(iterations_per_op=ITERATIONS, parallel=PARALLEL, patience=100)
    return Engine(store, sid, proposer, evaluator, settings)


async def check_nothing_lost_or_repeated(store: Store, sid: int) -> None:
    nodes = await store.list_nodes(sid)
    assert len(nodes) == 3 * ITERATIONS
    assert all(n.status == NodeStatus.OK for n in nodes)
    cards = [c for c in await store.list_cards(sid) if c.card.target]
    assert sum(c.spent for c in cards) == 3 * ITERATIONS  # each result counted once
    for card in cards:
        assert card.spent == sum(n.card_id == card.id for n in nodes)


@needs_ray
async def test_a_lost_actor_and_a_lost_node_cost_only_a_requeue(ray_cluster, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    import ray

    puts = []
    put = ray.put
    monkeypatch.setattr(ray, "put", lambda files: puts.append(list(files)) or put(files))
    store = await Store.open(tmp_path / "k.db")
    try:
        sid = await new_session(store)
        softmax = sample_cards()[0]
        sample = store.samples_dir(sid) / softmax.key / "0.pt"
        sample.parent.mkdir(parents=True)
        sample.write_bytes(b"captured inputs")
        gate = tmp_path / "gate"
        evaluator = cluster_evaluator(ray_cluster.address, store.samples_dir(sid))
        run = asyncio.create_task(engine(store, sid, gated(gate), evaluator).run())
        await wait_until(lambda: evaluations_held(store, sid, evaluator),
                         "three evaluations held on three GPUs")
        assert len(evaluator.slots) == 3
        # the sm_80 GPU's actor was started, heard and let go: the session is sm_90's
        assert {w.arch for w in evaluator.workers()} == {"sm_90"}
        victim = next(s for s in evaluator.slots if s.node_id != ray_cluster.sm90_node.node_id)
        ray.kill(victim.actor)
        ray_cluster.remove_node(ray_cluster.sm90_node, allow_graceful=False)
        await wait_until(lambda: evaluator.requeued == 2, "both lost evaluations re-queued")
        gate.touch()
        assert await asyncio.wait_for(run, 90) == SessionStatus.DONE
        await check_nothing_lost_or_repeated(store, sid)
        assert [w.lost for w in evaluator.workers()].count(True) == 2
        # the samples went into the object store once, and every actor got them intact
        assert puts == [["0.pt"]]
        softmax_id = next(c.id for c in await store.list_cards(sid) if c.card.key == softmax.key)
        digest = hashlib.sha256(b"captured inputs").hexdigest()
        for node in await store.list_nodes(sid):
            outcome = (await store.get_node(node.id)).outcome
            assert outcome is not None
            expected = {"0.pt": digest} if node.card_id == softmax_id else {}
            assert worker_said(outcome)["samples"] == expected
        # none once it ended (a search over before its first heartbeat never stored any)
        assert (await store.get_session(sid)).settings.get("workers", []) == []
    finally:
        await store.close()


@needs_ray
async def test_a_cluster_that_vanishes_leaves_the_session_resumable(ray_cluster, tmp_path: Path):
    import ray

    store = await Store.open(tmp_path / "k.db")
    try:
        sid = await new_session(store)
        evaluator = cluster_evaluator(ray_cluster.address, None)
        run = asyncio.create_task(engine(store, sid, gated(tmp_path / "gate"), evaluator).run())
        await wait_until(lambda: evaluations_held(store, sid, evaluator),
                         "an evaluation held on every GPU")
        for slot in evaluator.slots:
            ray.kill(slot.actor)
        with pytest.raises(KforgeError, match="every evaluation worker of the Ray cluster"):
            await asyncio.wait_for(run, 60)
        left = await store.list_nodes(sid)
        assert any(n.status == NodeStatus.EVALUATING for n in left)
        assert (await store.get_session(sid)).status == SessionStatus.FAILED
        status = await engine(store, sid, FakeProposer(speeds=(0.5, 0.9)),
                              FakeEvaluator()).run()
        assert status == SessionStatus.DONE
        await check_nothing_lost_or_repeated(store, sid)
    finally:
        await store.close()


@needs_ray
async def test_a_session_is_evaluated_only_on_gpus_of_its_architecture(ray_cluster):
    evaluator = cluster_evaluator(ray_cluster.address, None,
                                  GpuInfo(name="Fake sm_80", arch="sm_80"))
    await evaluator.start()
    try:
        assert evaluator.capacity == 1 and evaluator.gpu.arch == "sm_80"
        assert [w.arch for w in evaluator.workers()] == ["sm_80"]
        outcome = await evaluator.evaluate(sample_cards()[1], Candidate("src", meta={}))
        assert outcome.ok and outcome.placement.node == evaluator.workers()[0].node
        assert evaluator.workers()[0].done == 1 and not evaluator.workers()[0].busy
    finally:
        await evaluator.close()
    with pytest.raises(KforgeError, match="no GPU of this session's architecture sm_75"):
        await cluster_evaluator(ray_cluster.address, None,
                                GpuInfo(name="old", arch="sm_75")).start()
