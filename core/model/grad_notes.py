"""Gradients written on the node they belong to: retained grads and ``autograd.grad``'s results.

Plain data only (no torch). Two kinds of gradient are not a leaf's ``.grad`` and so have no leaf
chip: the ``.grad`` of a non-leaf that called ``retain_grad()`` ("hidden.grad = 3", on the node
that made it), and what ``torch.autograd.grad`` returned for each of its inputs ("returns ∂y/∂x
= 12", on the input's node: its ``AccumulateGrad`` for a leaf, the node that made it otherwise).

``node_notes(call)`` gives every such line of a call by node id, the ids the layout keys its
boxes by (a node drawn as its own box has ``box.id == node.id``); ``notes_for(call, node_id)``
gives one node's lines; both take the step's ``leaf_grads`` while a call is stepped, so a retained
grad changes on the step its node runs (``autograd.grad``'s results are what it returned in the
end). ``note_tip`` says what the lines are, for a tooltip. Values are written as
``core.model.values.short_values`` writes them: a big gradient reads "shape 4×6, …", never like a
list of values.
"""

from __future__ import annotations

import math

from core.model.step_state import accumulated_lines
from core.model.trace import CallInfo, NodeInfo, TensorInfo, Values
from core.model.values import short_values

SAME = 1e-6  # relative tolerance under which a .grad before the call counts as none
RETAINED_TIP = ("retain_grad() keeps this non-leaf's gradient in its .grad (only leaves get one by default); "
                "its .grad after this call")
RESULT_TIP = ("torch.autograd.grad returns the gradient for each of its inputs instead of adding it to "
              "their .grad, which it leaves as it was")


def node_notes(call: CallInfo, stepped: dict | None = None) -> dict[str, list[str]]:
    """Node id -> the lines to write on it: retained grads first, then ``autograd.grad`` results.
    Nodes without such a gradient are absent. ``stepped``: while the call is stepped, the
    ``leaf_grads`` of the step shown (``StepView.leaf_grads``: a tensor's name, or its node's id
    when it has none -> its values): a retained grad then reads as it is at that step, its
    ``.grad`` from before the call until its node has run."""
    return {nid: [line for _, line in notes] for nid, notes in _notes(call, stepped).items()}


def notes_for(call: CallInfo, node_id: str, stepped: dict | None = None) -> list[str]:
    """The lines ``node_notes`` writes on one node ([] when none); cheap to ask node by node."""
    return [line for _, line in _notes(call, stepped).get(node_id, ())]


def note_tip(call: CallInfo, node_id: str) -> str:
    """What a node's lines are, for a tooltip or a hint: one sentence per kind of line on it."""
    kinds = {kind for kind, _ in _notes(call).get(node_id, ())}
    return "\n".join(tip for kind, tip in (("retained", RETAINED_TIP), ("result", RESULT_TIP)) if kind in kinds)


def _notes(call: CallInfo, stepped: dict | None = None) -> dict[str, list[tuple[str, str]]]:
    """Node id -> (kind, line) of each line: kind 'retained' or 'result'. A call's notes after it
    are worked out once (the call is frozen), not once per node asked about."""
    cached = call.__dict__.get("_grad_notes") if stepped is None else None
    if cached is not None:
        return cached
    out: dict[str, list[tuple[str, str]]] = {}
    for kind, pairs in (("retained", _retained(call, stepped)), ("result", _results(call))):
        for node_id, line in pairs:
            out.setdefault(node_id, []).append((kind, line))
    if stepped is None:
        object.__setattr__(call, "_grad_notes", out)
    return out


# -- retained grads -----------------------------------------------------------------------


def _retained(call: CallInfo, stepped: dict | None = None) -> list[tuple[str, str]]:
    out = []
    nodes = call.node_map()
    for t in call.tensors:
        if t.is_leaf or not t.retains_grad or t.grad_fn not in nodes:
            continue
        if stepped is not None:
            lines = [_at_step(call, nodes[t.grad_fn], t, stepped.get(t.name or t.grad_fn))]
        elif t.grad is None:
            lines = [".grad = None"]
        else:
            lines = _accumulated(call, nodes[t.grad_fn], t) or [f".grad = {short_values(t.grad.values, t.grad.shape)}"]
        # an unnamed tensor (a module's output kept by a hook) is told by its node's box
        lines[0] = t.name + lines[0] if t.name else lines[0] + " (retained)"
        out.extend((t.grad_fn, line) for line in lines)
    return out


def _at_step(call: CallInfo, node: NodeInfo, t: TensorInfo, values: dict | None) -> str:
    """A retained ``.grad`` while stepping: the step's value once its node ran, else the one held
    before the call (None unless this call's edges tell that an earlier call left one)."""
    shape = t.grad.shape if t.grad is not None else t.shape
    if values is not None:
        known = {k: v for k, v in values.items() if k in Values.__dataclass_fields__}
        return f".grad = {short_values(Values(**known), shape)}"
    held = _held_before(call, node, t)
    if held is None:
        return ".grad = None"
    return f".grad = {short_values(Values(numel=len(held[0]), data=held[0]), shape)}"


def _accumulated(call: CallInfo, node: NodeInfo, t: TensorInfo) -> list[str] | None:
    """'.grad = 3 (before) + 3 = 6' when the non-leaf already held a ``.grad`` from an earlier call;
    None when it held none or that cannot be told."""
    held = _held_before(call, node, t)
    if held is None:
        return None
    before, parts = held
    return accumulated_lines(before, parts, list(t.grad.values.data), list(t.grad.shape))


def _held_before(call: CallInfo, node: NodeInfo, t: TensorInfo) -> tuple[list, list[list]] | None:
    """(the .grad held before the call, the gradient of each edge into it in this call): the edges'
    gradients subtracted from the ``.grad`` after give the one before. None when it held none
    (zeros), or when that cannot be told: no ``.grad`` after, edge gradients not recorded, or a
    hook on the tensor that may have changed what was kept."""
    after = t.grad.values.data if t.grad is not None else None
    if after is None or t.hooks:
        return None
    parts = _edges_into(call, node.id, t.output_nr or 0)
    if not parts or any(p is None or len(p) != len(after) for p in parts):
        return None
    before = [a - sum(col) for a, *col in zip(after, *parts)]
    if not any(abs(b) > SAME * max(1.0, abs(a)) for b, a in zip(before, after)):
        return None
    return before, parts


def _edges_into(call: CallInfo, node_id: str, output_nr: int) -> list[list | None]:
    """The gradient data on each recorded edge into output ``output_nr`` of a node; [] when an
    edge into it has no record (graphs too big for edge gradients)."""
    out = []
    for c in map(call.node, dict.fromkeys(call.consumers().get(node_id, ()))):
        for slot, e in enumerate(c.next):
            if e is None or e.node != node_id or e.input_nr != output_nr:
                continue
            grads = call.edge_grads.get(c.id) or []
            g = grads[slot] if slot < len(grads) else None
            if g is None:
                return []
            out.append(g.values.data)
    return out


# -- autograd.grad results ----------------------------------------------------------------


def _results(call: CallInfo) -> list[tuple[str, str]]:
    results = (call.options or {}).get("results") if call.api == "autograd.grad" else None
    if not results:
        return []
    of = _numerator(call)
    out = []
    for k, item in enumerate(results):
        t = call.tensor(item.get("tensor"))
        node_id = _input_node(call, t)
        if node_id is None:
            continue  # an unused input (allow_unused=True) has no node to write on
        name = t.name or f"(input {k})"
        given = item.get("values")
        if given is None:
            out.append((node_id, f"returns {of}/∂{name} = None (not used by the outputs)"))
            continue
        values = given if isinstance(given, Values) else Values(**given)
        out.append((node_id, f"returns {of}/∂{name} = {short_values(values, _result_shape(t, values))}"))
    return out


def returned(call: CallInfo, tensor_id: str) -> tuple[list[int], Values] | None:
    """(shape, values) of what ``autograd.grad`` returned for input ``tensor_id`` of ``call``;
    None when it is no input of such a call or got None."""
    t = call.tensor(tensor_id)
    results = (call.options or {}).get("results") if call.api == "autograd.grad" else None
    for item in results or ():
        given = item.get("values")
        if t is not None and item.get("tensor") == tensor_id and given is not None:
            values = given if isinstance(given, Values) else Values(**given)
            return _result_shape(t, values), values
    return None


def _numerator(call: CallInfo) -> str:
    """'∂y', '∂(p + q)' for several outputs, 'grad_outputs·∂y' when grad_outputs were passed (the
    result is then that weighted sum, a vector-Jacobian product)."""
    names = []
    for rid in call.roots:
        node = call.node(rid)
        t = call.tensor(node.tensor) if node is not None and node.tensor else None
        names.append((t.name if t is not None else None) or (node.label if node is not None else None) or "output")
    text = "∂" + (names[0] if len(names) == 1 else "(" + " + ".join(names) + ")")
    seeds = (call.options or {}).get("seed") or []
    return "grad_outputs·" + text if any(seeds) else text


def _input_node(call: CallInfo, t: TensorInfo | None) -> str | None:
    """The node an input's gradient arrives at: a leaf's AccumulateGrad, a non-leaf's grad_fn."""
    if t is None:
        return None
    if not t.is_leaf:
        return t.grad_fn if call.node(t.grad_fn or "") is not None else None
    return next((n.id for n in call.nodes if n.variable == t.id), None)


def _result_shape(t: TensorInfo, values: Values) -> list[int]:
    """A result has its input's shape; with ``is_grads_batched`` one batch dimension more."""
    size = math.prod(t.shape)
    if values.numel == size or size == 0:
        return list(t.shape)
    if values.numel % size == 0:
        return [values.numel // size, *t.shape]
    return [values.numel]
