"""Compact text of a tensor's values for labels on the graph (plain data, no torch)."""

from __future__ import annotations

from core.trace import CallInfo, NodeInfo, Values


def _num(x) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def short_values(values: Values, shape: list[int], limit: int = 4) -> str:
    """'2', '[1, 2, 3]', or '[64, 10] μ 0.01 ∈ [−1.2, 1.3]' for big tensors."""
    flat = values.data if values.data is not None else None
    if flat is not None and len(flat) <= limit:
        if not shape:
            return _num(flat[0]) if flat else "[]"
        return "[" + ", ".join(_num(v) for v in flat) + "]"
    dims = "[" + ", ".join(str(s) for s in shape) + "]"
    if values.mean is not None:
        return f"{dims} μ {_num(values.mean)} ∈ [{_num(values.min)}, {_num(values.max)}]"
    sample = flat if flat is not None else (values.sample or [])
    return f"{dims} {', '.join(_num(v) for v in sample[:3])}, …"


def leaf_value_lines(call: CallInfo, node: NodeInfo) -> list[str]:
    """An AccumulateGrad's leaf: 'x = 2' and '.grad = 12' (after the call)."""
    t = call.tensor(node.variable)
    if t is None:
        return []
    name = t.name or "leaf"
    lines = [f"{name} = {short_values(t.values, t.shape)}"]
    if t.grad is not None:
        lines.append(f".grad = {short_values(t.grad.values, t.grad.shape)}")
    else:
        lines.append(".grad = None")
    return lines


def seed_text(call: CallInfo, root: NodeInfo) -> str:
    """The gradient backward starts from at a root."""
    t = call.tensor(root.tensor) if root.tensor else None
    if call.api == "autograd.grad":
        return "seed: grad_outputs (ones for a scalar)"
    if t is not None and t.shape and any(s != 1 for s in t.shape):
        return f"seed: the gradient argument, {'×'.join(map(str, t.shape))}"
    return "seed: 1 (d out / d out)"
