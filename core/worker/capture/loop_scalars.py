"""The scalars of each backward call, for the curves of a training loop (worker side, imports torch).

A loop that converges or diverges is seen as curves over its calls: the loss, and the value and
gradient of the few small leaves a lesson trains (``w`` and ``b`` of a linear regression, an
``nn.Linear(1, 1)``'s ``weight`` and ``bias``). Each call records ``CallInfo.scalars``:

    {"loss": the root's value when backward started from one one-element tensor, else null,
     "values": {leaf name: [its elements]}, "grads": {leaf name: [its .grad's elements after the call]}}

for the named leaves requiring grad that the call's graph reaches with at most ``SCALAR_LIMIT``
elements (``LEAF_LIMIT`` of them at most). Both halves run inside the capture's own
``untraced()`` / ``DisableTorchFunction`` block (``core.worker.capture.call_record``), so the
script's tracer and torch-function modes never see these reads. Big parameters are left to ``CallInfo.grad_norms``:
only the small leaves are read, in one read back for the values and one for the grads, so a big
model pays a scan of its AccumulateGrad nodes and nothing more. Summaries keep the field, so a
200-epoch loop keeps all its points. Elements are floats, or "nan" / "inf" / "-inf" (JSON has none).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from core.worker.capture.values import _json_number

log = logging.getLogger(__name__)

SCALAR_LIMIT = 16  # elements: a leaf this small has one curve per element
LEAF_LIMIT = 64  # small leaves recorded per call (a model of many tiny parameters keeps its first ones)


def _floats(tensors: list) -> list[list]:
    """Each tensor's elements as JSON-ready floats, with one read back where the devices allow."""
    flat = [(t.to_dense() if t.is_sparse else t).detach().reshape(-1) for t in tensors]
    if not flat:
        return []
    try:
        joined = torch.cat([f.to(torch.float64) for f in flat]).tolist()
    except Exception:  # mixed devices
        joined = [x for f in flat for x in f.to("cpu", torch.float64).tolist()]
    out, start = [], 0
    for f in flat:
        n = f.numel()
        out.append([_json_number(x) for x in joined[start:start + n]])
        start += n
    return out


def _loss(roots: list):
    """The value backward started from: the one root when it is a one-element real tensor."""
    tensors = [r for r in roots if isinstance(r, torch.Tensor)]
    if len(roots) != 1 or len(tensors) != 1:
        return None
    t = tensors[0]
    try:
        if t.numel() != 1 or t.is_complex():
            return None
        return _json_number(float(t.detach().reshape(-1).to("cpu", torch.float64)[0]))
    except Exception:  # a tensor subclass or a meta tensor that has no value to read: the leaves still count
        return None


class LoopScalars:
    """The scalar records of one capture: ``before`` notes a call's loss and small leaves while its
    graph is walked, ``after`` reads them once the call has run (``CallInfo.scalars``)."""

    def __init__(self, name_of: Callable[[torch.Tensor], str | None]):
        self.name_of = name_of
        self._pending: dict[int, tuple] = {}  # call index -> (loss, names, leaves)

    def before(self, index: int, roots: list, order) -> None:
        try:
            names, leaves, seen = [], [], set()
            for node in order:
                if len(leaves) >= LEAF_LIMIT:
                    break
                if type(node).__name__ != "AccumulateGrad":
                    continue
                leaf = node.variable
                if not isinstance(leaf, torch.Tensor) or id(leaf) in seen or leaf.is_complex() \
                        or not 0 < leaf.numel() <= SCALAR_LIMIT:
                    continue
                seen.add(id(leaf))
                name = self.name_of(leaf)
                if name:
                    names.append(name)
                    leaves.append(leaf)
            self._pending[index] = (_loss(roots), names, leaves)
        except Exception:  # a record must never break the script's backward
            log.debug("noting the scalars of call %s failed", index, exc_info=True)

    def after(self, index: int) -> dict | None:
        pending = self._pending.pop(index, None)
        if pending is None:
            return None
        loss, names, leaves = pending
        try:
            values = dict(zip(names, _floats(leaves)))
            with_grad = [(n, p.grad) for n, p in zip(names, leaves)
                         if p.grad is not None and p.grad.numel() == p.numel()]
            grads = dict(zip([n for n, _ in with_grad], _floats([g for _, g in with_grad])))
            return {"loss": loss, "values": values, "grads": grads}
        except Exception:
            log.debug("reading the scalars of call %s failed", index, exc_info=True)
            return None
