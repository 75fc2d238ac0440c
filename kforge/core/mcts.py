"""Monte Carlo Tree Search over kernel variants of one op card, as pure code.

No I/O, no clocks, no asyncio: the engine feeds it node ids and evaluation results and asks it what
to expand next. Same seed and same calls give the same decisions.

The tree:
- the root stands for eager PyTorch (reward 0); its children are *new approaches*;
- a node that evaluated correctly (OK) is expanded by *refine* (a rewrite of its kernel);
- a node that failed is expanded by at most one *repair*, fed its compiler or mismatch log; a chain of
  failures longer than ``max_repairs`` repairs is closed;
- rewards are log speedups over eager (see ``reward``), and UCT values them on the card's own
  scale (``reward.RewardScale``: 0 for eager or the slowest kernel, 1 for the fastest), so the
  exploration constant means the same for a 2 us op and a 2 ms op;
- a node's value is the best value in its subtree, blended with the subtree's mean by
  ``backup_mean`` (0: the best alone). Kernel search wants the maximum: a branch holding one 2x
  kernel whose refinements failed is worth more than a branch of 1.05x kernels, which a mean
  would rank the other way;
- progressive widening lets a node have ``floor(k * visits ** alpha)`` children before UCT must
  choose among existing ones;
- nodes in flight (proposed or being evaluated) add virtual loss along their path, so several
  expansions can be under way without all piling onto one branch;
- pruned subtrees are never selected, never count as best and add nothing to their ancestors'
  best values.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from kforge.core.reward import FAILURE_REWARD, MIN_SPAN, RewardScale

ROOT = 0


class Action(StrEnum):
    ROOT = "root"
    NEW = "new"  # a different approach to the op
    REFINE = "refine"  # improve a working kernel
    REPAIR = "repair"  # fix a failing kernel from its log


class NodeState(StrEnum):
    IN_FLIGHT = "in_flight"
    OK = "ok"
    FAILED = "failed"


@dataclass(frozen=True)
class MctsParams:
    explore: float = 0.35  # UCT exploration constant, on the card's normalised value scale
    widen_k: float = 1.5  # a node may have floor(widen_k * visits ** widen_alpha) children
    widen_alpha: float = 0.65
    max_repairs: int = 2
    failure_reward: float = FAILURE_REWARD  # a failure's value on the normalised scale
    virtual_loss: float = 1.0  # phantom visits per in-flight node below a node
    min_gain: float = 0.01  # an improvement smaller than this (log units) is not progress
    backup_mean: float = 0.0  # weight of the subtree's mean value in a node's value (0: its best)
    min_span: float = MIN_SPAN  # the narrowest reward spread (log units) the scale stretches


@dataclass(frozen=True)
class Decision:
    """Expand ``parent`` with ``action``. ``parent`` is ROOT for a new approach."""

    parent: int
    action: Action


@dataclass
class _Node:
    id: int
    parent: int | None
    action: Action
    state: NodeState
    depth: int
    reward: float | None = None
    repairable: bool = False
    children: list[int] = field(default_factory=list)
    visits: int = 0  # finished evaluations in the subtree (pruned parts included)
    ok_count: int = 0  # ...of which correct, with these rewards summed
    ok_sum: float = 0.0
    best: float | None = None  # the highest reward in the subtree outside pruned parts
    failed_below: bool = False  # a failure in the subtree outside pruned parts
    inflight: int = 0
    pruned: bool = False
    fail_chain: int = 0  # consecutive failed nodes ending here (0 for an OK node)
    demoted: bool = False  # finished OK, then failed its confirmation


@dataclass(frozen=True)
class NodeRecord:
    """What the tree needs to rebuild one node from storage."""

    id: int
    parent: int
    action: Action
    state: NodeState
    reward: float | None = None
    repairable: bool = False
    pruned: bool = False


class Tree:
    """The search tree of one op card."""

    def __init__(self, params: MctsParams | None = None, seed: int = 0) -> None:
        self.params = params or MctsParams()
        self._rng = random.Random(seed)
        self._nodes: dict[int, _Node] = {
            ROOT: _Node(ROOT, None, Action.ROOT, NodeState.OK, depth=0, reward=0.0)
        }
        self.completed = 0
        self._best_reward = -math.inf
        self._best_at = 0  # value of `completed` when the best last improved by min_gain
        self.scale = RewardScale(min_span=self.params.min_span)

    # ----- building -----

    @classmethod
    def from_records(cls, records: Iterable[NodeRecord], params: MctsParams | None = None,
                     seed: int = 0) -> Tree:
        """Rebuild a tree from stored nodes (parents before children, as ids ascend)."""
        tree = cls(params, seed)
        for rec in sorted(records, key=lambda r: r.id):
            # a node refined before its parent's confirmation failed keeps its action
            tree._attach(rec.id, rec.parent, rec.action)
            if rec.state is not NodeState.IN_FLIGHT:
                tree.complete(rec.id, rec.reward if rec.state is NodeState.OK else None,
                              repairable=rec.repairable)
            if rec.pruned:
                tree.prune(rec.id)
        return tree

    def add(self, node_id: int, parent: int, action: Action) -> None:
        """Record that ``node_id`` is now in flight as ``action`` applied to ``parent``."""
        p = self._nodes.get(parent)
        if p is not None and p.state is not NodeState.IN_FLIGHT:
            expected = (Action.NEW if parent == ROOT
                        else Action.REPAIR if p.state is NodeState.FAILED else Action.REFINE)
            # a refinement chosen before its parent's confirmation failed is still taken
            if action is not expected and not (p.demoted and action is Action.REFINE):
                raise ValueError(f"node {parent} is expanded by {expected}, not {action}")
        self._attach(node_id, parent, action)

    def _attach(self, node_id: int, parent: int, action: Action) -> None:
        if node_id in self._nodes:
            raise ValueError(f"node {node_id} already exists")
        if parent not in self._nodes:
            raise ValueError(f"parent {parent} does not exist")
        p = self._nodes[parent]
        if p.state is NodeState.IN_FLIGHT:
            raise ValueError(f"parent {parent} is still in flight")
        node = _Node(node_id, parent, action, NodeState.IN_FLIGHT, depth=p.depth + 1)
        self._nodes[node_id] = node
        p.children.append(node_id)
        for n in self._path(node_id):
            n.inflight += 1

    def complete(self, node_id: int, reward: float | None, repairable: bool = False) -> None:
        """The evaluation of ``node_id`` finished: ``reward`` is its log speedup, None if it failed."""
        node = self._node(node_id)
        if node.state is not NodeState.IN_FLIGHT:
            raise ValueError(f"node {node_id} is not in flight")
        node.state = NodeState.OK if reward is not None else NodeState.FAILED
        node.reward = reward
        node.repairable = repairable and reward is None
        parent = self._nodes[node.parent]
        node.fail_chain = 0 if reward is not None else (
            parent.fail_chain + 1 if parent.state is NodeState.FAILED else 1)
        counted = True  # no pruned node lies between the finished node and this ancestor
        for n in self._path(node_id):
            n.inflight -= 1
            n.visits += 1
            if reward is not None:
                n.ok_count += 1
                n.ok_sum += reward
            if counted:
                _note_below(n, reward)
            counted = counted and not n.pruned
        if reward is not None:
            self.scale = self.scale.including(reward)
        self.completed += 1
        if reward is not None and not self.is_pruned(node_id):
            self._note_reward(reward)

    def demote(self, node_id: int, repairable: bool = False) -> None:
        """A node that finished OK failed after all (its confirmation rejected it): it counts as
        a failure from now on; the nodes already built on it stay."""
        node = self._node(node_id)
        if node.state is not NodeState.OK or node.reward is None or node_id == ROOT:
            raise ValueError(f"node {node_id} did not finish OK")
        reward = node.reward
        node.state, node.reward, node.repairable = NodeState.FAILED, None, repairable
        node.demoted = True
        parent = self._nodes[node.parent]
        node.fail_chain = parent.fail_chain + 1 if parent.state is NodeState.FAILED else 1
        for n in self._path(node_id):
            n.ok_count -= 1
            n.ok_sum -= reward
        self._recompute_best()

    def discard(self, node_id: int) -> None:
        """Forget an in-flight leaf that never produced a result (its work will be redone)."""
        node = self._node(node_id)
        if node.state is not NodeState.IN_FLIGHT or node.children:
            raise ValueError(f"node {node_id} is not an in-flight leaf")
        for n in self._path(node_id):
            n.inflight -= 1
        self._nodes[node.parent].children.remove(node_id)
        del self._nodes[node_id]

    def prune(self, node_id: int) -> None:
        if node_id == ROOT:
            raise ValueError("the root cannot be pruned")
        self._node(node_id).pruned = True
        self._recompute_best()

    def unprune(self, node_id: int) -> None:
        self._node(node_id).pruned = False
        self._recompute_best()

    def _recompute_below(self, node: _Node) -> None:
        """Rebuild ``best`` and ``failed_below`` of ``node``'s subtree from its finished nodes
        (after a prune or unprune changed which of them count)."""
        node.best, node.failed_below = None, False
        if node.state is not NodeState.IN_FLIGHT and node.id != ROOT:
            _note_below(node, node.reward)
        for child_id in node.children:
            child = self._nodes[child_id]
            self._recompute_below(child)
            if not child.pruned:
                if child.best is not None:
                    _note_below(node, child.best)
                node.failed_below = node.failed_below or child.failed_below

    # ----- queries -----

    def __contains__(self, node_id: int) -> bool:
        return node_id in self._nodes

    def __len__(self) -> int:
        return len(self._nodes) - 1

    def children(self, node_id: int) -> list[int]:
        return list(self._node(node_id).children)

    def parent(self, node_id: int) -> int | None:
        return self._node(node_id).parent

    def visits(self, node_id: int) -> int:
        return self._node(node_id).visits

    def mean_value(self, node_id: int) -> float | None:
        """The mean normalised value of the subtree's finished evaluations (failures at
        ``failure_reward``); None before any finished."""
        n = self._node(node_id)
        if not n.visits:
            return None
        scale, fails = self.scale, n.visits - n.ok_count
        ok = (n.ok_sum - n.ok_count * scale.low) / scale.span if scale.span > 0 else 0.0
        return (ok + fails * self.params.failure_reward) / n.visits

    def value(self, node_id: int) -> float | None:
        """What UCT credits the node with: the best normalised value in its subtree (a failure
        counting ``failure_reward``), blended with the mean by ``backup_mean``; None before any
        evaluation below it finished."""
        n = self._node(node_id)
        if not n.visits:
            return None
        candidates = ([self.scale.value(n.best)] if n.best is not None else []) + (
            [self.params.failure_reward] if n.failed_below else [])
        # Everything finished below lies in pruned parts: those count as failures.
        best = max(candidates, default=self.params.failure_reward)
        mean = self.mean_value(node_id)
        assert mean is not None
        w = self.params.backup_mean
        return (1.0 - w) * best + w * mean

    def inflight(self, node_id: int = ROOT) -> int:
        return self._node(node_id).inflight

    def is_pruned(self, node_id: int) -> bool:
        """True if the node or any ancestor is pruned."""
        return any(n.pruned for n in self._path(node_id))

    def lineage(self, node_id: int) -> list[int]:
        """Ids from the root's child down to ``node_id``."""
        return [n.id for n in reversed(list(self._path(node_id))) if n.id != ROOT]

    def best(self) -> int | None:
        """The OK node with the highest reward outside pruned subtrees."""
        best_id, best_reward = None, -math.inf
        for n in self._nodes.values():
            if (n.id != ROOT and n.state is NodeState.OK and n.reward is not None
                    and n.reward > best_reward and not self.is_pruned(n.id)):
                best_id, best_reward = n.id, n.reward
        return best_id

    @property
    def best_reward(self) -> float | None:
        return None if self._best_reward == -math.inf else self._best_reward

    @property
    def since_improvement(self) -> int:
        """Completed evaluations since the best reward last improved by at least ``min_gain``."""
        return self.completed - self._best_at

    def stagnant(self, window: int) -> bool:
        return self.since_improvement >= window

    # ----- selection -----

    def select(self) -> Decision:
        """Walk from the root by UCT and return where to expand next. Always returns a decision:
        when everything below is closed or in flight, the walk widens the node it is at."""
        node = self._nodes[ROOT]
        while True:
            if node.state is NodeState.FAILED:
                if not node.children:
                    return Decision(node.id, Action.REPAIR)
                node = self._nodes[node.children[0]]
                continue
            kids = [self._nodes[c] for c in node.children if not self._nodes[c].pruned]
            action = Action.NEW if node.id == ROOT else Action.REFINE
            if len(kids) < self._allowed_children(node):
                return Decision(node.id, action)
            open_kids = [k for k in kids if self._open(k)]
            if not open_kids:
                return Decision(node.id, action)
            node = self._pick_uct(node, open_kids)

    def _allowed_children(self, node: _Node) -> int:
        p = self.params
        return max(1, math.floor(p.widen_k * max(1, node.visits) ** p.widen_alpha))

    def _open(self, node: _Node) -> bool:
        """Whether selection can still find work in this subtree."""
        if node.pruned or node.state is NodeState.IN_FLIGHT:
            return False
        if node.state is NodeState.OK:
            return True
        if not node.children:
            return node.repairable and node.fail_chain <= self.params.max_repairs
        return self._open(self._nodes[node.children[0]])

    def _pick_uct(self, parent: _Node, kids: list[_Node]) -> _Node:
        p = self.params
        n_parent = parent.visits + p.virtual_loss * parent.inflight
        log_n = math.log(max(n_parent, 1.0))
        scores = []
        for k in kids:
            n = k.visits + p.virtual_loss * k.inflight
            if n <= 0:
                scores.append(math.inf)
                continue
            value = self.value(k.id)
            q = ((value if value is not None else 0.0) * k.visits
                 + p.virtual_loss * k.inflight * p.failure_reward) / n
            scores.append(q + p.explore * math.sqrt(log_n / n))
        top = max(scores)
        return self._rng.choice([k for k, s in zip(kids, scores) if s == top])

    # ----- internals -----

    def _node(self, node_id: int) -> _Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id} in this tree") from None

    def _path(self, node_id: int) -> Iterable[_Node]:
        """The node and its ancestors up to the root."""
        node: _Node | None = self._node(node_id)
        while node is not None:
            yield node
            node = self._nodes[node.parent] if node.parent is not None else None

    def _note_reward(self, reward: float) -> None:
        if reward > self._best_reward:
            if reward >= self._best_reward + self.params.min_gain or self._best_reward == -math.inf:
                self._best_at = self.completed
            self._best_reward = reward

    def _recompute_best(self) -> None:
        best = self.best()
        self._best_reward = -math.inf if best is None else self._nodes[best].reward
        self._recompute_below(self._nodes[ROOT])


def _note_below(node: _Node, reward: float | None) -> None:
    """Take a finished evaluation in ``node``'s subtree into its best value."""
    if reward is None:
        node.failed_below = True
    elif node.best is None or reward > node.best:
        node.best = reward
