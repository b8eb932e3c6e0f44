"""The non-leaf tensors of the script that called ``retain_grad()`` (worker side, imports torch).

A call's snapshot keeps the tensors the script names; a retained tensor it holds under no name
(``o.retain_grad()`` in a forward hook, an activation kept in a module attribute or a dict) would
be left out, and its ``.grad`` with it. The creation mode notes each ``retain_grad()`` call here,
and the snapshot adds those whose node lies in the call's graph.
"""

from __future__ import annotations

import weakref

import torch

from core.worker.capture.node_graph import grad_fn_of

# id -> tensor, held weakly: the script decides how long a retained tensor lives. Not a WeakSet:
# weak references to two live tensors compare with the tensors' elementwise ``==``.
_retained: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def note_retained(t) -> None:
    """``t.retain_grad()`` was called (a leaf's is a no-op: it gets a ``.grad`` anyway)."""
    if isinstance(t, torch.Tensor) and not t.is_leaf:
        try:
            _retained[id(t)] = t
        except TypeError:  # a tensor subclass that refuses weak references
            pass


def live_retained() -> list[torch.Tensor]:
    """Every retained tensor alive now (a stepped call reports their ``.grad`` as its nodes run)."""
    return [t for t in list(_retained.values()) if t.retains_grad]


def retained_in(node_ids: dict[int, str]) -> list[torch.Tensor]:
    """The retained tensors alive now whose grad_fn is a node of this graph (``node_ids``: id(node) ->
    node id), in the order ``retain_grad()`` was called."""
    out = []
    for t in live_retained():
        fn = grad_fn_of(t)
        if fn is not None and id(fn) in node_ids:
            out.append(t)
    return out
