"""Compact text of a tensor's values for labels on the graph (plain data, no torch)."""

from __future__ import annotations

import re
from math import prod

from core.model.trace import CallInfo, GradInfo, NodeInfo, Values


def dims_text(shape) -> str:
    """``8×64``: a shape's sizes, never bracketed like a list of values; "" for a 0-d tensor."""
    return "×".join(str(s) for s in shape or ())


def format_shape(shape) -> str:
    """``shape 8×64`` (in words, so it cannot be read as the values [8, 64]), ``scalar`` for a 0-d
    tensor, "" when the shape is unknown."""
    if shape is None:
        return ""
    return "scalar" if len(shape) == 0 else "shape " + dims_text(shape)


def _num(x) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


WHOLE_LIMIT = 12  # elements: a tensor this small is written whole, row by row


def short_values(values: Values, shape: list[int], limit: int = WHOLE_LIMIT) -> str:
    """'2', '[1, 2, 3]', '[[1, 2, 3], [4, 5, 6]]' (the values, whole, in rows, up to ``limit``
    elements), or 'shape 64×10, μ 0.01 ∈ [−1.2, 1.3]' for big tensors."""
    flat = values.data if values.data is not None else None
    if flat is not None and len(flat) <= limit:
        if not shape:
            return _num(flat[0]) if flat else "[]"
        return _nested(flat, shape)
    dims = format_shape(shape) or "values"
    if values.mean is not None:
        return f"{dims}, μ {_num(values.mean)} ∈ [{_num(values.min)}, {_num(values.max)}]"
    sample = flat if flat is not None else (values.sample or [])
    return f"{dims}: {', '.join(_num(v) for v in sample[:3])}, …"


def _nested(flat: list, shape: list[int]) -> str:
    """``flat`` written in the rows of ``shape`` ('[[1, 2], [3, 4]]'); a flat list when the two
    disagree (a preview that is not the whole tensor)."""
    if len(shape) < 2 or not flat or prod(shape) != len(flat):
        return "[" + ", ".join(_num(v) for v in flat) + "]"
    step = len(flat) // shape[0]
    return "[" + ", ".join(_nested(flat[i:i + step], shape[1:]) for i in range(0, len(flat), step)) + "]"


def incoming_grads(call: CallInfo, node_id: str) -> list[Values]:
    """The gradients recorded on the edges into a node, in the order of its consumers."""
    index = call.__dict__.get("_incoming_grads")
    if index is None:  # built once per call: a big graph asks for each of its thousands of leaves
        index = {}
        for c in call.nodes:
            grads = call.edge_grads.get(c.id)
            if not grads:
                continue
            for i, e in enumerate(c.next):
                if e is not None and i < len(grads) and grads[i] is not None:
                    index.setdefault(e.node, []).append(grads[i].values)
        object.__setattr__(call, "_incoming_grads", index)
    return list(index.get(node_id, ()))


def _scalar(v: Values):
    return v.data[0] if v.data is not None and len(v.data) == 1 and isinstance(v.data[0], (int, float)) else None


def leaf_value_lines(call: CallInfo, node: NodeInfo) -> list[str]:
    """An AccumulateGrad's leaf: 'x = 3' and '.grad = 6 + 2 = 8' (after the call)."""
    t = call.tensor(node.variable)
    if t is None:
        return []
    name = t.name or "leaf"
    lines = [f"{name} = {short_values(t.values, t.shape)}"]
    if t.grad is None:
        return lines + [".grad = None"]
    grad = short_values(t.grad.values, t.grad.shape)
    parts = incoming_grads(call, node.id)
    scalars = [_scalar(v) for v in parts]
    if len(parts) > 1 and all(s is not None for s in scalars):
        total = sum(scalars)
        terms = " + ".join(_num(s) for s in scalars).replace("+ -", "− ")
        now = _scalar(t.grad.values)
        if t.hooks:
            return lines + [f".grad = {grad}", f"(edges {terms} = {_num(total)}, then its hook)"]
        if now is not None and abs(now - total) <= 1e-6 * max(1.0, abs(total)):
            return lines + [f".grad = {terms} = {grad}"]
        return lines + [f".grad = {grad}", f"(this call: {terms} = {_num(total)})"]
    if len(parts) > 1:
        return lines + [f".grad = Σ of {len(parts)} edges = {grad}"]
    return lines + [f".grad = {grad}"]


GRAD_WORD = "grad = "  # how an edge's gradient is written: a value, never a shape
EDGE_LIMIT = WHOLE_LIMIT  # elements of an edge's gradient written whole (a shorter form where no room)
EDGE_PREVIEW = 4  # elements written of a bigger one


def grad_values(numel: int, data=None, mean=None, sample=None) -> str:
    """A gradient's values as edges show them, after the call and while stepping alike: '6',
    '[1, 2]', '[8, 8, 8, 8, …] (6 values)', '512 values, mean 0.01'."""
    if data is not None:
        if numel == 1 and data:
            return _edge_num(data[0])
        if len(data) <= EDGE_LIMIT:
            return "[" + ", ".join([_edge_num(v) for v in data]) + "]"
        return f"[{', '.join([_edge_num(v) for v in data[:EDGE_PREVIEW]])}, …] ({numel:,} values)"
    if mean is not None:
        return f"{numel:,} values, mean {_edge_num(mean)}"
    if sample:
        return f"[{', '.join(_edge_num(v) for v in sample[:EDGE_PREVIEW])}, …] ({numel:,} values)"
    return f"{numel:,} values"


def _edge_num(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def edge_grad_text(grad: GradInfo) -> str:
    """A gradient on an edge: 'grad = 6', 'grad = [1, 2]', 'grad = [1, 1, 1, 1, …] (15 values)'."""
    v = grad.values
    return GRAD_WORD + grad_values(v.numel, v.data, v.mean, v.sample)


def compact_values(text: str, level: int = 1) -> str:
    """A shorter form of an edge text, for an edge with no room for the whole: at ``level`` 1 the
    first element of each list and how many there are ('grad = [-0.08, …] (8 values)'), at 2 only
    how many ('grad = … (8 values)'); the text itself when it is no longer."""
    def short(m) -> str:
        items = m.group(1).split(", ")
        count = m.group(2) or f" ({len(items)} values)"
        if len(items) <= 1:
            return m.group(0)
        return f"[{items[0]}, …]{count}" if level == 1 else f"…{count}"
    text = _LIST.sub(short, text)
    return _MEAN.sub(r"\1", text) if level == 2 else text


_MEAN = re.compile(r"(\d[\d,]* values), mean [^\s,]+")
_LIST = re.compile(r"\[([^\[\]]*)\]( \([\d,]+ values\))?")


def edge_label(parts: list[str], value: str) -> str:
    """One label for an edge: 'grad = [2, 2]'; after a shape or broadcast chip, its value follows
    it: '[4, 3] → Σ → [3] = [8, 8, 8]' (two texts side by side would read as two things)."""
    if not parts:
        return value
    head = ", ".join(parts)
    if not value:
        return head
    return f"{head} = {value[len(GRAD_WORD):] if value.startswith(GRAD_WORD) else value}"


def seed_text(call: CallInfo, root: NodeInfo) -> str:
    """The gradient backward starts from at a root."""
    t = call.tensor(root.tensor) if root.tensor else None
    seeds = (call.options or {}).get("seed") or []
    index = call.roots.index(root.id) if root.id in call.roots else 0
    given = seeds[index] if index < len(seeds) else None
    if given:
        values = Values(**given) if isinstance(given, dict) else given
        shape = t.shape if t is not None else ([] if values.numel == 1 else [values.numel])
        word = "grad_outputs" if call.api == "autograd.grad" else "gradient"
        return f"seed: {word} = {short_values(values, shape)}"
    if call.api == "autograd.grad":
        return "seed: grad_outputs (ones for a scalar)"
    if t is not None and t.shape and any(s != 1 for s in t.shape):
        # No gradient was passed and the output is not a scalar: backward refuses to start.
        numel = 1
        for s in t.shape:
            numel *= s
        shape = f" (shape {'×'.join(map(str, t.shape))})" if len(t.shape) > 1 else ""
        return (f"seed: none given; {t.name or 'the output'} has {numel:,} element{'' if numel == 1 else 's'}"
                f"{shape}, and backward() needs a scalar or a gradient argument")
    return "seed: 1 (d out / d out)"
