"""The gradient each edge carried in a call, recorded with node hooks (worker side, imports torch).

For graphs up to ``LIMIT`` nodes, a post-hook on every node keeps ``grad_inputs``: entry i is
the gradient the node sent along ``next_functions[i]``. Exports then write it on the edge, and a
leaf reached by several edges shows the sum ("6 + 2 = 8") with no stepping. Hooks are removed
in ``finish`` whatever happens, so the next ``backward()`` runs untouched. Bigger graphs are
left alone: the hooks would cost a value copy per edge.

Each gradient also keeps ‖g‖₂ of all its elements (``GradInfo.norm``): past ``VALUES`` elements the
values are a sample, and Colour by Gradient Norm needs the exact norm.
"""

from __future__ import annotations

import math

import torch

from core.worker.capture.node_graph import shape_of
from core.worker.capture.names import untraced
from core.worker.capture.values import values_of
from core.model.trace import GradInfo, fast_new

LIMIT = 300
VALUES = 16  # elements kept per gradient; larger ones keep a sample and statistics


def norm_of(g: torch.Tensor) -> float | str | None:
    """‖g‖₂ as the trace writes it: a float, "nan" or "inf"; None where torch cannot say (a
    tensor subclass without storage). Outside the script's modes and the NaN/Inf check's: the
    norm of a NaN gradient is not an op of the script."""
    try:
        with torch._C.DisableTorchFunction(), untraced():
            g = g.detach()
            n = float(torch.linalg.vector_norm(g.to_dense() if g.is_sparse else g))
    except Exception:
        return None
    if math.isfinite(n):
        return n
    return "nan" if math.isnan(n) else "inf"


class EdgeGradRecorder:
    def __init__(self, order: list, ids: dict[int, str]):
        self.grads: dict[str, list] = {}
        self.handles = []
        if len(order) > LIMIT:
            return
        for node in order:
            if not node.next_functions:
                continue  # AccumulateGrad: its incoming edges are recorded at their sources
            nid = ids.get(id(node))
            if nid is None:
                continue
            try:
                self.handles.append(node.register_hook(self._hook(nid)))
            except Exception:  # nodes that take no hooks (some custom Functions)
                continue

    def _hook(self, nid: str):
        def record(grad_inputs, grad_outputs):
            self.grads[nid] = [
                fast_new(GradInfo, {"shape": shape_of(g), "values": values_of(g, full_limit=VALUES),
                                    "norm": norm_of(g)})
                if g is not None else None
                for g in grad_inputs
            ]

        return record

    def finish(self) -> dict[str, list[GradInfo | None]]:
        for h in self.handles:
            h.remove()
        self.handles = []
        return self.grads
