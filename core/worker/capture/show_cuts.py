"""Why an input of a graph ``show()`` captures needs no gradient, read from the graph afterwards.

A traced run notes each op's inputs as it runs (``core.worker.capture.cuts``); ``show()`` comes
after the ops, so it reads what the nodes saved instead: an op whose input needs no gradient often
saved that input to compute the other one's gradient (``w * c`` saves ``c``). Where a node has as
many such saved tensors as cut inputs, they are noted as ``CutRecorder.note_inputs`` notes them, and
the capture names them from the caller's variables: a constant, or a tensor ``detach()`` made (it
shares its storage with a tensor that requires grad). ``w + c`` saves nothing: its cut input is said
to be a tensor with requires_grad=False, without a name; other nodes that saved no such tensor keep
their cut unexplained.
"""

from __future__ import annotations

import weakref
from types import FrameType

import torch

from core.worker.capture.cuts import _short

MAX_NODES = 100_000  # a bigger graph is shown without these notes
# Ops of two tensors that save neither: a cut input is a tensor with requires_grad=False, unnamed.
TWO_TENSORS_NOTHING_SAVED = frozenset({"AddBackward0", "SubBackward0"})


def note_saved_cuts(tensor: torch.Tensor, frame: FrameType) -> int:
    """Note in each node of ``tensor``'s graph the saved tensors behind its cut inputs; returns how
    many nodes got notes. Nodes that already have notes (made inside ``record()``) are left as they are."""
    root = tensor.grad_fn
    if root is None:
        return 0
    graded = _storages_that_require_grad(frame)
    noted, seen, stack = 0, {id(root)}, [root]
    while stack and len(seen) <= MAX_NODES:
        fn = stack.pop()
        nxt = fn.next_functions
        for next_fn, _ in nxt:
            if next_fn is not None and id(next_fn) not in seen:
                seen.add(id(next_fn))
                stack.append(next_fn)
        cuts = sum(1 for next_fn, _ in nxt if next_fn is None)
        if not cuts or "bps_cuts" in fn.metadata:
            continue
        try:
            found = [t for t in _saved_tensors(fn)
                     if not t.requires_grad and (t.is_floating_point() or t.is_complex())]
            if not found and type(fn).__name__ in TWO_TENSORS_NOTHING_SAVED:
                fn.metadata["bps_cuts"] = [("constant", None, None)] * cuts
                noted += 1
                continue
            if len(found) != cuts:
                continue  # which saved tensor is which input cannot be told
            fn.metadata["bps_cuts"] = [("detach" if _storage(t) in graded else "constant", weakref.ref(t),
                                        _short(t)) for t in found]
        except Exception:  # a tensor subclass of the caller's that refuses to be read
            continue
        noted += 1
    return noted


def _saved_tensors(fn) -> list[torch.Tensor]:
    out = []
    for attr in dir(fn):
        if not attr.startswith("_saved_") or attr.endswith("_sym_sizes") or attr == "_saved_result":
            continue
        try:
            value = getattr(fn, attr)
        except Exception:  # freed by an earlier backward, or changed in place
            continue
        if isinstance(value, torch.Tensor):
            out.append(value)
    return out


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr() or None
    except Exception:  # a tensor without storage (meta, nested, a subclass)
        return None


def _storages_that_require_grad(frame: FrameType) -> set[int]:
    """Storages of the caller's tensors that require grad: a cut input sharing one was detached."""
    found = set()
    for scope in (frame.f_locals, frame.f_globals):
        for value in list(scope.values()):
            if type(value) is torch.Tensor or isinstance(value, torch.nn.Parameter):
                if value.requires_grad and (ptr := _storage(value)) is not None:
                    found.add(ptr)
            elif isinstance(value, torch.nn.Module):
                try:
                    found.update(p for p in (_storage(q) for q in value.parameters() if q.requires_grad)
                                 if p is not None)
                except Exception:  # a module of the caller's whose attributes raise
                    continue
    return found
