"""The forward replay of a call: its ops in the order the forward pass made them (plain data).

The graph is woven while forward runs: each op makes its node as it runs. Replaying a finished
trace shows that: frame k holds the first k ops and the leaves they use, with op k's line and
the time it was made (``NodeInfo.created``, the memory chart's clock).

The order is torch's autograd sequence number (``NodeInfo.seq``, counted per thread), ties broken
by the creation time, then by the trace's preorder. It is taken as a topological order from the
leaves (networkx's lexicographical topological sort, smallest key first), so no op ever appears
before an op it consumes, whatever its thread. Ops without a number (traces written before it
was recorded) wait until no numbered op is ready and then go in preorder: inputs before the ops
that use them, the first input first, as a script reads left to right. An AccumulateGrad leaf
appears with the first op that consumes it; a leaf no op consumes (a root) with the first frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx

from core.model.trace import CallInfo

LEAF = "accumulate_grad"


@dataclass(frozen=True)
class ReplayStep:
    """One op of the replay, as it was made."""

    op: str  # the op's node id
    name: str  # its node's name ("AddBackward0")
    line: int | None  # the script line that made it
    # seconds from the run's start when it was made; for an op without a time, the last time
    # known before it (None while none is): the memory chart's cursor stays where it was
    created: float | None
    leaves: tuple[str, ...] = ()  # AccumulateGrad nodes it is the first op to consume: they appear with it


@dataclass(frozen=True)
class ForwardReplay:
    """A call's ops in creation order; frame k (1 .. ``len``) shows the first k with their leaves."""

    steps: tuple[ReplayStep, ...]
    # node id -> the frame it appears in (1-based): every node of the call once
    appears: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.steps)

    def step(self, k: int) -> ReplayStep:
        """Op k's step (1-based)."""
        return self.steps[k - 1]

    def nodes_at(self, k: int) -> frozenset[str]:
        """The node ids shown at frame k: the first k ops and their leaves (none at 0)."""
        return frozenset(nid for nid, at in self.appears.items() if at <= k)

    def changed(self, old: int, new: int) -> dict[str, bool]:
        """What going from frame ``old`` to frame ``new`` changes: node id -> shown now."""
        lo, hi = sorted((old, new))
        return {nid: at <= new for nid, at in self.appears.items() if lo < at <= hi}


def forward_replay(call: CallInfo | None) -> ForwardReplay:
    """The replay of ``call``'s forward pass (no steps for no call, or a call kept as a summary)."""
    if call is None or not call.nodes:
        return ForwardReplay(steps=())
    nodes = {n.id: n for n in call.nodes}
    index = {n.id: i for i, n in enumerate(call.nodes)}
    ops = [n for n in call.nodes if n.kind != LEAF]

    def key(nid: str) -> tuple:
        n = nodes[nid]
        if n.seq is None:
            return (1, 0, 0.0, index[nid])
        return (0, n.seq, n.created if n.created is not None else math.inf, index[nid])

    order = sorted((n.id for n in ops), key=key)
    if not _inputs_first(order, nodes):  # threads, old traces: the sort that keeps inputs first
        order = _topological(ops, key)
    steps, appears, last = [], {}, None
    for k, nid in enumerate(order, start=1):
        n = nodes[nid]
        appears[nid] = k
        leaves = []
        for e in n.next:
            if e is not None and nodes[e.node].kind == LEAF and e.node not in appears:
                appears[e.node] = k
                leaves.append(e.node)
        last = n.created if n.created is not None else last
        steps.append(ReplayStep(op=nid, name=n.name, line=n.line, created=last, leaves=tuple(leaves)))
    if steps:
        for n in call.nodes:  # leaves no op consumes: there from the start
            if n.id not in appears:
                appears[n.id] = 1
    return ForwardReplay(steps=tuple(steps), appears=appears)


def _inputs_first(order: list[str], nodes: dict) -> bool:
    """Whether every op of ``order`` comes after the ops it consumes (true of one thread's numbers)."""
    seen = set()
    for nid in order:
        for e in nodes[nid].next:
            if e is not None and e.node not in seen and nodes[e.node].kind != LEAF and e.node != nid:
                return False
        seen.add(nid)
    return True


def _topological(ops, key) -> list[str]:
    """The ops from the leaves up, the smallest ``key`` first among those whose inputs are placed."""
    graph = nx.DiGraph()
    graph.add_nodes_from(n.id for n in ops)
    for n in ops:
        for e in n.next:
            if e is not None and e.node in graph and e.node != n.id:
                graph.add_edge(e.node, n.id)  # the input is made before the op that uses it
    return list(nx.lexicographical_topological_sort(graph, key=key))


def replay_caption(replay: ForwardReplay, k: int) -> str:
    """'op 5 of 12: AddBackward0, line 7'."""
    if not 1 <= k <= len(replay):
        return "no ops to replay" if not len(replay) else f"{len(replay)} ops"
    s = replay.step(k)
    where = f", line {s.line}" if s.line else ""
    return f"op {k} of {len(replay)}: {s.name}{where}"
