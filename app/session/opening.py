"""Which call a trace opens on, and which node is described before anything is selected.

The session decides both (``Session.opening_call``, ``Session.opening_node``); the window and
the graph view only show what they are given.
"""

from __future__ import annotations

from core.model.forward_errors import failed_inputs
from core.model.trace import CallInfo, Trace


def opening_call(trace: Trace | None, opens_on: int | None = None) -> CallInfo | None:
    """The call ``trace`` opens on: the one whose index is ``opens_on`` (the call last stepped, for
    the trace of a debug run that ran to its end), else its first call with a full graph; None
    when no call has one."""
    shown = [c for c in trace.calls if c.snapshot == "full" and c.nodes] if trace is not None else []
    shown.sort(key=lambda c: "failed_op" not in c.options)  # a forward pass that failed: the graph it failed on
    return next((c for c in shown if c.index == opens_on), shown[0] if shown else None)


def opening_node(call: CallInfo | None) -> str | None:
    """The node described while ``call`` has no selection: for a failed call, the one it is about
    (whose saved tensor was changed in place, or the first input of the op the forward pass failed
    in), else the root (the loss); None without roots."""
    if call is None or not call.roots:
        return None
    failed = failed_inputs(call)
    if failed:
        return failed[0]
    stale = next((n.id for n in call.nodes if n.stale is not None), None) if call.error else None
    return stale or call.roots[0]
