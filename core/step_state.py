"""What the graph looks like after k backward steps: node states, edge gradients, leaf grads.

Plain data in, plain data out, so the same function drives the live view, the replay of a
past step from the step log, the exported frames and the tests. A step record is the dict
the stepping engine sends: ``index``, ``node``, ``name``, ``grad_outputs``, ``grad_inputs``
(one per ``next`` edge), ``leaf_grads`` and ``error``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.trace import CallInfo


@dataclass
class StepView:
    states: dict[str, str] = field(default_factory=dict)  # node id -> executed/current/frontier/failed
    edge_texts: dict[tuple[str, str], str] = field(default_factory=dict)  # (src, dst) -> gradient text
    leaf_grads: dict[str, dict] = field(default_factory=dict)  # leaf name -> values (latest)
    executed: list[str] = field(default_factory=list)
    current: str | None = None
    failed: str | None = None


def short_values(values: dict | None, limit: int = 3) -> str:
    """'3', '[1, 2, 3, …]', '512 values, mean 0.01' or '[1, 2, 3, …] (512 values)' for a gradient."""
    if not values:
        return "None"
    data = values.get("data")
    numel = values.get("numel", 0)
    if data is not None:
        if numel == 1:
            return _num(data[0])
        shown = ", ".join(_num(v) for v in data[:limit])
        return f"[{shown}{', …' if len(data) > limit else ''}]"
    mean = values.get("mean")
    if mean is not None:
        return f"{numel} values, mean {_num(mean)}"
    sample = values.get("sample")
    if sample:
        return f"[{', '.join(_num(v) for v in sample[:limit])}, …] ({numel} values)"
    return f"{numel} values"


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def step_view(call: CallInfo, steps: list[dict], pending: dict | None = None, upto: int | None = None) -> StepView:
    """The graph's state after ``steps[:upto]`` ran (all of them when ``upto`` is None).

    ``pending`` is the node about to run (the engine is paused before it); when replaying a
    past step it is None and the last replayed step is drawn as current.
    """
    shown = steps if upto is None else steps[:upto]
    view = StepView()
    done: set[str] = set()
    for record in shown:
        node_id = record.get("node")
        if node_id is None or call.node(node_id) is None:
            continue
        done.add(node_id)
        view.executed.append(node_id)
        node = call.node(node_id)
        grads = record.get("grad_inputs") or []
        for edge, grad in zip(node.next, grads):
            if edge is not None and grad is not None:
                view.edge_texts[(node_id, edge.node)] = short_values(grad)
        for name, values in (record.get("leaf_grads") or {}).items():
            view.leaf_grads[name] = values
        if record.get("error"):
            view.failed = node_id
    for node_id in done:
        view.states[node_id] = "executed"
    if view.failed:
        view.states[view.failed] = "failed"
    current = pending.get("node") if pending else (view.executed[-1] if upto is not None and view.executed else None)
    if current is not None and current != view.failed:
        view.current = current
        view.states[current] = "current"
    # The frontier: nodes every one of whose consumers has run (so their gradient is complete).
    consumers: dict[str, list[str]] = {}
    for n in call.nodes:
        for e in n.next:
            if e is not None:
                consumers.setdefault(e.node, []).append(n.id)
    if done:
        for node_id, users in consumers.items():
            if node_id in done or node_id == current:
                continue
            if all(u in done for u in users):
                view.states[node_id] = "frontier"
    return view


class StepTracker:
    """``step_view`` kept up to date one step at a time, for live stepping of big graphs.

    Recomputing the view from every recorded step costs O(nodes) per step (17 ms at 5,000
    nodes); the tracker counts each node's consumers that have not run yet, so a step costs
    only its own edges.
    """

    def __init__(self, call: CallInfo):
        self.call = call
        self.remaining: dict[str, int] = {}
        for n in call.nodes:
            for e in n.next:
                if e is not None:
                    self.remaining[e.node] = self.remaining.get(e.node, 0) + 1
        self.done: set[str] = set()
        self.frontier: set[str] = set()
        self.edge_texts: dict[tuple[str, str], str] = {}
        self.leaf_grads: dict[str, dict] = {}
        self.executed: list[str] = []
        self.failed: str | None = None

    def add(self, record: dict) -> None:
        node_id = record.get("node")
        node = self.call.node(node_id) if node_id else None
        if node is None:
            return
        if record.get("error"):
            self.failed = node_id
        if node_id in self.done:
            return
        self.done.add(node_id)
        self.executed.append(node_id)
        self.frontier.discard(node_id)
        grads = record.get("grad_inputs") or []
        for i, edge in enumerate(node.next):
            if edge is None:
                continue
            if i < len(grads) and grads[i] is not None:
                self.edge_texts[(node_id, edge.node)] = short_values(grads[i])
            left = self.remaining.get(edge.node, 0) - 1
            self.remaining[edge.node] = left
            if left <= 0 and edge.node not in self.done:
                self.frontier.add(edge.node)
        for name, values in (record.get("leaf_grads") or {}).items():
            self.leaf_grads[name] = values
        if node.kind == "accumulate_grad" and node.label in self.leaf_grads:
            # The edge that filled this leaf also shows the accumulated .grad.
            suffix = f"  \u21d2 .grad {short_values(self.leaf_grads[node.label])}"
            for parent in self.call.consumers().get(node_id, []):
                key = (parent, node_id)
                if key in self.edge_texts:
                    self.edge_texts[key] = self.edge_texts[key].split("  \u21d2 ")[0] + suffix

    def view(self, pending: dict | None = None) -> StepView:
        states = dict.fromkeys(self.done, "executed")
        current = pending.get("node") if pending else None
        for node_id in self.frontier:
            if node_id != current:
                states[node_id] = "frontier"
        if self.failed:
            states[self.failed] = "failed"
        elif current is not None:
            states[current] = "current"
        return StepView(states=states, edge_texts=dict(self.edge_texts), leaf_grads=dict(self.leaf_grads),
                        executed=list(self.executed), current=current, failed=self.failed)


def step_texts(call: CallInfo, view: StepView) -> dict[tuple[str, str], str]:
    """Edge texts of a step view, with each leaf's ``.grad`` added to the edge that filled it."""
    texts = dict(view.edge_texts)
    if not view.leaf_grads:
        return texts
    for node in call.nodes:
        for e in node.next:
            if e is None or (node.id, e.node) not in texts:
                continue
            leaf = call.node(e.node)
            if leaf is not None and leaf.kind == "accumulate_grad" and leaf.label in view.leaf_grads:
                texts[(node.id, e.node)] += f"  \u21d2 .grad {short_values(view.leaf_grads[leaf.label])}"
    return texts


def box_states(states: dict[str, str], members: dict[str, str], counts: dict[str, int]) -> dict[str, str]:
    """Step states per drawn box; a collapsed group shows its most urgent member's state."""
    per: dict[str, list[str]] = {}
    for nid, st in states.items():
        vid = members.get(nid)
        if vid is not None:
            per.setdefault(vid, []).append(st)
    out = {}
    for vid, sts in per.items():
        state = next((s for s in ("failed", "current", "frontier") if s in sts), None)
        if state is None and sts.count("executed") >= counts.get(vid, 1):
            state = "executed"
        if state is not None:
            out[vid] = state
    return out


def leaf_digest(call: CallInfo) -> str:
    """A digest of the values of a call's leaf tensors before backward (parameters, inputs).

    Two runs that built the same graph from the same numbers have the same digest; a script that
    draws new random numbers each run does not.
    """
    import hashlib
    import json

    parts = []
    for t in call.tensors:
        if t.is_leaf:
            v = t.values
            parts.append([t.id, t.name, list(t.shape), v.data if v.data is not None else
                          [v.sample, v.min, v.max, v.mean]])
    return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def same_run_check(traced: CallInfo, structure: str, leaves: str) -> str | None:
    """None when a re-run reached the traced call with the same graph and leaf values, else why not."""
    if structure and traced.structure and structure != traced.structure:
        return ("this script is not deterministic: the re-run built a different graph for call "
                f"#{traced.index}; stepping shows the new run, not the trace")
    if leaves and traced.tensors and leaves != leaf_digest(traced):
        return ("this script is not deterministic: stepping shows a new run, its values differ from the trace "
                f"(call #{traced.index}'s leaf tensors hold other numbers)")
    return None
