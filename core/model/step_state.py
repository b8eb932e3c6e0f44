"""What the graph looks like after k backward steps: node states, edge gradients, leaf grads.

Plain data in, plain data out, so the same function drives the live view, the replay of a
past step from the step log, the exported frames and the tests. A step record is the dict
the stepping engine sends: ``index``, ``node``, ``name``, ``grad_outputs``, ``grad_inputs``
(one per ``next`` edge), ``leaf_grads`` and ``error``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.model.trace import CallInfo, NodeInfo, Values
from core.model.values import GRAD_WORD, WHOLE_LIMIT, grad_values, incoming_grads, leaf_value_lines
from core.model.values import short_values as value_text


@dataclass
class StepView:
    states: dict[str, str] = field(default_factory=dict)  # node id -> executed/current/frontier/failed
    edge_texts: dict[tuple[str, str], str] = field(default_factory=dict)  # (src, dst) -> gradient text
    leaf_grads: dict[str, dict] = field(default_factory=dict)  # leaf name -> values (latest)
    executed: list[str] = field(default_factory=list)
    current: str | None = None
    failed: str | None = None


def short_values(values: dict | None, limit: int = WHOLE_LIMIT) -> str:
    """'3', '[1, 2, 3]' (whole up to ``limit`` elements), '[1, 2, 3, …]', '512 values, mean 0.01'
    or '[1, 2, 3, …] (512 values)' for a gradient."""
    if not values:
        return "None"
    data = values.get("data")
    numel = values.get("numel", 0)
    if data is not None:
        if numel == 1:
            return _num(data[0])
        # formatted inline: a Continue labels thousands of edges at once
        shown = ", ".join([f"{v:.4g}" if isinstance(v, float) else str(v) for v in data[:limit if len(data) <= limit else 3]])
        return f"[{shown}{', …' if len(data) > limit else ''}]"
    mean = values.get("mean")
    if mean is not None:
        return f"{numel} values, mean {_num(mean)}"
    sample = values.get("sample")
    if sample:
        shown = ", ".join([f"{v:.4g}" if isinstance(v, float) else str(v) for v in sample[:limit]])
        return f"[{shown}, …] ({numel} values)"
    return f"{numel} values"


def edge_text(values: dict | None) -> str:
    """A gradient a step sent along an edge, worded as the call's edge gradients are: 'grad = [2, 2]'."""
    if not values:
        return GRAD_WORD + "None"
    return GRAD_WORD + grad_values(values.get("numel", 0), values.get("data"), values.get("mean"), values.get("sample"))


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
                view.edge_texts[(node_id, edge.node)] = edge_text(grad)
        for name, values in (record.get("leaf_grads") or {}).items():
            view.leaf_grads[name] = with_added(record, node, values) if name == node.label else values
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


@dataclass
class StepDelta:
    """What changed on the graph since the last delta: only those items need drawing again."""

    states: dict[str, str | None] = field(default_factory=dict)  # node id -> new state (None: plain)
    edge_texts: dict[tuple[str, str], str | None] = field(default_factory=dict)  # (src, dst) -> text
    leaves: set[str] = field(default_factory=set)  # AccumulateGrad node ids whose .grad changed

    def __bool__(self) -> bool:
        return bool(self.states or self.edge_texts or self.leaves)


class StepTracker:
    """``step_view`` kept up to date one step at a time, for live stepping of big graphs.

    Recomputing the view from every recorded step costs O(nodes) per step (17 ms at 5,000
    nodes); the tracker counts each node's consumers that have not run yet, so a step costs
    only its own edges. It also remembers which nodes and edges changed since the last
    ``delta()``, so a view draws a step by touching those items alone.
    """

    def __init__(self, call: CallInfo):
        self.call = call
        self._nodes = call.node_map()
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
        self.current: str | None = None  # the node the engine is paused before, as last given
        self._dirty_nodes: set[str] = set()
        self._dirty_edges: set[tuple[str, str]] = set()
        self._dirty_leaves: set[str] = set()
        self._leaf_nodes = leaf_nodes(call)

    def add(self, record: dict) -> None:
        node_id = record.get("node")
        node = self._nodes.get(node_id) if node_id else None
        if node is None:
            return
        if record.get("error"):
            if self.failed is not None:
                self._dirty_nodes.add(self.failed)
            self.failed = node_id
            self._dirty_nodes.add(node_id)
            if self.current is not None:
                self._dirty_nodes.add(self.current)  # a failure hides the current mark
        if node_id in self.done:
            return
        self.done.add(node_id)
        self.executed.append(node_id)
        self.frontier.discard(node_id)
        self._dirty_nodes.add(node_id)
        grads = record.get("grad_inputs") or []
        for i, edge in enumerate(node.next):
            if edge is None:
                continue
            if i < len(grads) and grads[i] is not None:
                key = (node_id, edge.node)
                self.edge_texts[key] = edge_text(grads[i])
                self._dirty_edges.add(key)
            left = self.remaining.get(edge.node, 0) - 1
            self.remaining[edge.node] = left
            if left <= 0 and edge.node not in self.done:
                self.frontier.add(edge.node)
                self._dirty_nodes.add(edge.node)
        for name, values in (record.get("leaf_grads") or {}).items():
            self.leaf_grads[name] = with_added(record, node, values) if name == node.label else values
            self._dirty_leaves.update(self._leaf_nodes.get(name, ()))
        if node.kind == "accumulate_grad" and node.label in self.leaf_grads:
            # The edge that filled this leaf also shows the accumulated .grad.
            suffix = _leaf_suffix(self.call, node_id, self.edge_texts, self.leaf_grads[node.label])
            self.edge_texts.update(suffix)
            self._dirty_edges.update(suffix)

    def set_current(self, node_id: str | None) -> None:
        """The node the engine is paused before (None while it runs or once it ended)."""
        if node_id != self.current:
            for nid in (self.current, node_id):
                if nid is not None:
                    self._dirty_nodes.add(nid)
            self.current = node_id

    def state(self, node_id: str) -> str | None:
        """One node's state, as ``view`` gives it with the current node set by ``set_current``."""
        if node_id == self.failed:
            return "failed"
        if node_id == self.current:
            if self.failed is None:
                return "current"
            return "executed" if node_id in self.done else None
        if node_id in self.done:
            return "executed"
        if node_id in self.frontier:
            return "frontier"
        return None

    def delta(self) -> StepDelta:
        """Node states and edge texts changed since the last delta (or since the start)."""
        nodes, self._dirty_nodes = self._dirty_nodes, set()
        edges, self._dirty_edges = self._dirty_edges, set()
        leaves, self._dirty_leaves = self._dirty_leaves, set()
        return StepDelta(states={nid: self.state(nid) for nid in nodes},
                         edge_texts={key: self.edge_texts.get(key) for key in edges}, leaves=leaves)

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


def leaf_nodes(call: CallInfo) -> dict[str, list[str]]:
    """The AccumulateGrad node ids of each ``leaf_grads`` key: the leaf's script name, or the
    node's id for a leaf without one."""
    out: dict[str, list[str]] = {}
    for n in call.nodes:
        if n.kind == "accumulate_grad":
            out.setdefault(n.label or n.id, []).append(n.id)
    return out


def leaf_chip_lines(call: CallInfo, node: NodeInfo, leaf_grads: dict[str, dict],
                    before: CallInfo | None = None) -> list[str]:
    """A leaf's value chip while its call is stepped: 'fc2.bias = [...]' and its ``.grad`` as it
    is at this step. Once its AccumulateGrad ran, the ``.grad`` the step recorded, written as the
    step log writes it ('4 (before) + 4 = 8' when the step added to a .grad held before); before,
    the ``.grad`` the leaf held when backward began (``before``: the call as captured then, when
    ``call`` is the call after backward, as a traced call is)."""
    t = call.tensor(node.variable) if node.variable else None
    if t is None:
        return []
    lines = [f"{t.name or 'leaf'} = {value_text(t.values, t.shape)}"]
    grad = leaf_grads.get(node.label or node.id)
    if grad is not None:
        held = held_before(grad)
        if held is not None and not t.hooks:
            return lines + accumulated_lines(held, [grad["added"]], grad["data"], list(t.shape))
        return lines + [f".grad = {short_values(grad)}"]
    start = before.tensor(node.variable) if before is not None else t
    held = start.grad if start is not None else None
    return lines + [".grad = None" if held is None else f".grad = {value_text(held.values, held.shape)}"]


def with_added(record: dict, node: NodeInfo, values: dict) -> dict:
    """A leaf's .grad from its AccumulateGrad's step record, with what the step added to it (the
    gradient the node received, ``added``) when both are known element by element."""
    if node.kind != "accumulate_grad" or values.get("data") is None:
        return values
    incoming = record.get("grad_outputs") or []
    first = incoming[0] if incoming else None
    data = first.get("data") if isinstance(first, dict) else None
    if data is None or len(data) != len(values["data"]):
        return values
    return dict(values, added=list(data))


def held_before(grad: dict) -> list | None:
    """The .grad a leaf held before its AccumulateGrad ran (its .grad after, less what it added), or
    None when it held none (or zeros) or what was added is not known."""
    added, after = grad.get("added"), grad.get("data")
    if added is None or after is None:
        return None
    return _held([a - b for a, b in zip(after, added)], after)


def _held(before: list, after: list) -> list | None:
    """``before`` unless it is zeros (up to the rounding of the subtraction that gave it)."""
    return before if any(abs(h) > 1e-6 * max(1.0, abs(a)) for h, a in zip(before, after)) else None


SUM_LIMIT = 4  # elements up to which '.grad = before (before) + this = after' is written whole


def accumulated_lines(before: list, parts: list[list], after: list, shape: list[int]) -> list[str]:
    """['.grad = 4 (before) + 4 = 8']: the .grad a leaf held before a call, what the call added (one
    term per incoming edge) and the .grad after; for a bigger leaf its .grad and a note that the call
    added to the one held before."""
    def text(data: list) -> str:
        return value_text(Values(numel=len(data), data=list(data)), shape)
    if len(after) > SUM_LIMIT:
        return [f".grad = {text(after)}", "(this call added to the .grad held before)"]
    terms = " + ".join(text(p) for p in parts).replace("+ -", "− ")
    return [f".grad = {text(before)} (before) + {terms} = {text(after)}"]


def leaf_lines_after(call: CallInfo, node: NodeInfo) -> list[str]:
    """A leaf's chip after its call: 'x = 2' and '.grad = 4 (before) + 4 = 8' when the call added to a
    .grad the leaf already held (the gradients of its incoming edges subtracted from the .grad after
    give the .grad before), else as ``leaf_value_lines`` writes it."""
    lines = leaf_value_lines(call, node)
    t = call.tensor(node.variable) if node.variable else None
    if t is None or t.grad is None or t.hooks or call.api == "autograd.grad":
        return lines
    if ((call.options or {}).get("grad_before") or {}).get(t.name or "") != "set":
        return lines
    after = t.grad.values.data
    parts = [v.data for v in incoming_grads(call, node.id)]
    if after is None or not parts or any(p is None or len(p) != len(after) for p in parts):
        return lines
    before = _held([a - sum(col) for a, *col in zip(after, *parts)], after)
    if before is None:
        return lines
    return lines[:1] + accumulated_lines(before, parts, after, list(t.grad.shape))


def step_texts(call: CallInfo, view: StepView) -> dict[tuple[str, str], str]:
    """Edge texts of a step view, with each leaf's ``.grad`` added to the edge that filled it."""
    texts = dict(view.edge_texts)
    if not view.leaf_grads:
        return texts
    for leaf in call.nodes:
        if leaf.kind == "accumulate_grad" and leaf.label in view.leaf_grads:
            texts.update(_leaf_suffix(call, leaf.id, texts, view.leaf_grads[leaf.label]))
    return texts


def _leaf_suffix(call: CallInfo, leaf_id: str, texts: dict, grad) -> dict[tuple[str, str], str]:
    """The edges into a leaf, the last one ending in its .grad: "grad = 2  \u21d2 .grad 6 + 2 = 8" when
    the leaf is reached by several edges (their gradients add up), "grad = 6  \u21d2 .grad 6" when by
    one, and "grad = 4  \u21d2 .grad 4 (before) + 4 = 8" when it added to a .grad held before."""
    keys = [(p, leaf_id) for p in dict.fromkeys(call.consumers().get(leaf_id, [])) if (p, leaf_id) in texts]
    if not keys:
        return {}
    bases = [texts[k].split("  \u21d2 ")[0] for k in keys]
    out = dict(zip(keys, bases))
    terms = [b[len(GRAD_WORD):] if b.startswith(GRAD_WORD) else b for b in bases]
    total = short_values(grad)
    held = held_before(grad)
    if held is not None and len(held) <= SUM_LIMIT:
        before = short_values({"data": held, "numel": len(held)})
        out[keys[-1]] = bases[-1] + f"  \u21d2 .grad {before} (before) + {' + '.join(terms)} = {total}"
        return out
    out[keys[-1]] = bases[-1] + (f"  \u21d2 .grad {' + '.join(terms)} = {total}" if len(keys) > 1
                                 else f"  \u21d2 .grad {total}")
    return out


def box_states(states: dict[str, str], members: dict[str, str], counts: dict[str, int]) -> dict[str, str]:
    """Step states per drawn box; a collapsed group shows its most urgent member's state."""
    per: dict[str, dict[str, int]] = {}
    for nid, st in states.items():
        vid = members.get(nid)
        if vid is not None:
            tally = per.setdefault(vid, {})
            tally[st] = tally.get(st, 0) + 1
    out = {}
    for vid, tally in per.items():
        state = box_state(tally, counts.get(vid, 1))
        if state is not None:
            out[vid] = state
    return out


def box_state(tally: dict[str, int], members: int = 1) -> str | None:
    """A drawn box's state from how many of its ``members`` nodes are in each state: the most
    urgent of failed, current and frontier, else executed once every member ran."""
    for state in ("failed", "current", "frontier"):
        if tally.get(state, 0) > 0:
            return state
    return "executed" if tally.get("executed", 0) >= members else None


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
