"""The gradient norms Colour by Gradient Norm paints on a call's graph: ‖g‖₂ of the gradient each
edge carried in the call, and ‖grad‖₂ of each leaf's ``.grad`` after it, on one log colour scale.

An edge's norm is the one the worker recorded with its gradient (``GradInfo.norm``, see
``core.worker.capture.edge_grads``), or for a trace written before that, the norm of its values
when they are all there. A leaf's is the call's ``grad_norms`` entry for its name, else the norm
of its ``.grad`` when every value was kept. Calls past the edge-gradient bound (300 nodes) and
loop summaries have no edge gradients: only their leaves get a colour. The scale is the
Gradients heatmap's (``core.model.grad_health.NormMatrix``): log10 from the smallest to the
largest finite, positive norm of the call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from core.model.grad_health import NormMatrix
from core.model.trace import CallInfo, GradInfo, Values

WHY_NO_EDGES = "no edge gradients in this call (recorded up to 300 nodes): leaves only"


def _number(v) -> float | None:
    """A recorded norm as a float ("nan" / "inf" as floats), None when there is none."""
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def values_norm(values: Values | None) -> float | None:
    """‖v‖₂ of a preview holding every element; None for a sample."""
    if values is None or values.data is None or len(values.data) != values.numel:
        return None
    total = 0.0
    for x in values.data:
        x = _number(x)
        if x is None:
            return None
        total += x * x
    return math.sqrt(total)


def grad_norm(grad: GradInfo | None) -> float | None:
    """‖g‖₂ of one recorded gradient: the worker's exact norm, else its values' when all are kept."""
    if grad is None:
        return None
    recorded = _number(getattr(grad, "norm", None))
    return recorded if recorded is not None else values_norm(grad.values)


@dataclass(frozen=True)
class CallNorms:
    """The norms of one call. ``edges``: (node id, slot) -> ‖the gradient that node sent along
    ``next[slot]``‖₂; ``leaves``: AccumulateGrad node id -> (‖.grad‖₂, the leaf's name)."""

    edges: dict[tuple[str, int], float]
    leaves: dict[str, tuple[float, str]]
    has_edges: bool  # the call recorded edge gradients (False: big graphs, loop summaries)

    @cached_property
    def scale(self) -> NormMatrix:
        """Every norm of the call as one column of the heatmap's matrix: the same log scale."""
        values = [*self.edges.values(), *(n for n, _ in self.leaves.values())]
        return NormMatrix(modules=[str(i) for i in range(len(values))], calls=[0], values=[[v] for v in values])

    @property
    def log_range(self) -> tuple[float, float] | None:
        return self.scale.log_range

    def shade(self, value: float | None) -> float | None:
        """Where ``value`` falls on the scale, 0 (smallest) to 1 (largest); None for nan."""
        return self.scale.shade(value)

    @property
    def has_nan(self) -> bool:
        return any(math.isnan(v) for r in self.scale.values for v in r if v is not None)

    def empty(self) -> bool:
        return not self.edges and not self.leaves


def leaf_norms(call: CallInfo) -> dict[str, tuple[float, str]]:
    """AccumulateGrad node id -> (‖.grad‖₂ after the call, the leaf's name)."""
    params = (call.grad_norms or {}).get("params") or {}
    out = {}
    for n in call.nodes:
        if n.kind != "accumulate_grad":
            continue
        t = call.tensor(n.variable)
        name = (t.name if t is not None else None) or n.label or ""
        entry = params.get(name) if name else None
        norm = _number(entry.get("grad")) if isinstance(entry, dict) else None
        if norm is None and t is not None:
            norm = grad_norm(t.grad)
        if norm is not None:
            out[n.id] = (norm, name)
    return out


def call_norms(call: CallInfo) -> CallNorms:
    """The edge and leaf norms of ``call`` (kept on the call: a view asks again on each rebuild)."""
    cached = call.__dict__.get("_call_norms")
    if cached is not None:
        return cached
    edges = {}
    for n in call.nodes:
        for slot, g in enumerate(call.edge_grads.get(n.id) or ()):
            norm = grad_norm(g)
            if norm is not None and slot < len(n.next) and n.next[slot] is not None:
                edges[(n.id, slot)] = norm
    out = CallNorms(edges=edges, leaves=leaf_norms(call), has_edges=bool(call.edge_grads))
    object.__setattr__(call, "_call_norms", out)
    return out


def norm_text(value: float | None) -> str:
    """A norm as tooltips and the scale write it: four significant digits."""
    if value is None:
        return "not recorded"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"
