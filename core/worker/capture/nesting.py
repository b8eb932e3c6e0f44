"""Backward calls nested in another call's backward: reentrant checkpointing (worker side).

``torch.utils.checkpoint(fn, x, use_reentrant=True)`` keeps no activations of ``fn``; its
``CheckpointFunctionBackward`` node reruns ``fn`` during backward and calls
``torch.autograd.backward`` on that recomputed graph, inside the running backward. That inner
call is where the checkpointed layers get their gradients, so it is captured as a call of its
own, marked with the call and the node it ran inside.

``use_reentrant=False`` builds an ordinary-looking graph whose saved tensors are packed by
checkpoint's saved-tensor hooks: nodes made under them are marked ``recomputed``.
"""

from __future__ import annotations

import os
from types import FrameType

import torch

CHECKPOINT_FILE = os.path.join("torch", "utils", "checkpoint.py")
CHECKPOINT_NODE = "CheckpointFunctionBackward"


def inside_reentrant_checkpoint(frame: FrameType | None, depth: int = 12) -> bool:
    """Whether the caller is torch.utils.checkpoint (a few frames up, no further)."""
    while frame is not None and depth > 0:
        if frame.f_code.co_filename.endswith(CHECKPOINT_FILE):
            return True
        frame = frame.f_back
        depth -= 1
    return False


def nested_options(outer_index: int) -> dict:
    """Options of a nested call: the call it ran inside and the node that ran it."""
    return {"nested_in": outer_index, "inside": CHECKPOINT_NODE}


def saved_by_checkpoint() -> bool:
    """Whether ops running now save their tensors through non-reentrant checkpointing's hooks
    (the saved tensors are then dropped after forward and recomputed when backward needs them)."""
    try:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    except Exception:
        return False
    return bool(hooks) and "_checkpoint_hook" in getattr(hooks[0], "__qualname__", "")


GRADCHECK_FILE = os.path.join("torch", "autograd", "gradcheck.py")


def inside_gradcheck(frame: FrameType | None) -> str | None:
    """'gradcheck' or 'gradgradcheck' when the call runs inside one (its many calls are grouped)."""
    found = None
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(GRADCHECK_FILE) and code.co_name in ("gradcheck", "gradgradcheck"):
            found = code.co_name  # the outermost wins: gradgradcheck calls gradcheck
        frame = frame.f_back
    return found


def grad_states(order: list, name_of) -> dict[str, str]:
    """Named leaves of a graph -> 'none', 'zero' or 'set': their .grad before a call."""
    out = {}
    for node in order:
        var = getattr(node, "variable", None)
        if var is None or node.next_functions:
            continue
        name = name_of(var)
        if name is None:
            continue
        g = var.grad
        if g is None:
            out[name] = "none"
        elif g.device.type == "cpu" and g.numel() <= 1_000_000:  # no device sync, no big scan
            out[name] = "set" if bool(g.any()) else "zero"
        else:
            out[name] = "set"
    return out
