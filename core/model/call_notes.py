"""What the Calls list says about each call beyond its line: options, nesting, .grad history.

Plain data only (no torch). ``call_flags`` names how a call was made (retain_graph,
create_graph, nested in a checkpoint, inside gradcheck); ``grad_history`` gives each call the
``.grad`` of its named leaves after it, and marks where the script reset them between calls
(``zero_grad()`` leaves zeros or None; ``x.grad = None`` leaves None); ``group_calls`` folds the
calls made inside one ``torch.autograd.gradcheck`` into one entry.
"""

from __future__ import annotations

from core.model.trace import CallInfo, Trace
from core.model.values import short_values

SHOWN_LEAVES = 3


def call_flags(call: CallInfo) -> list[str]:
    opts = call.options or {}
    out = []
    if opts.get("create_graph"):
        out.append("create_graph")
    elif opts.get("retain_graph"):
        out.append("retain_graph")
    if opts.get("nested_in") is not None:
        out.append(f"inside #{opts['nested_in']}'s {opts.get('inside', 'backward')}")
    if opts.get("nested"):
        out.append("runs " + ", ".join(f"#{i}" for i in opts["nested"]) + " inside")
    return out


def grad_history(trace: Trace) -> dict[str, list[str]]:
    """Call id -> lines like 'x.grad 4'; '↺ x.grad = None' / '↺ x.grad zeroed' mark a reset since the
    previous call (``zero_grad()``, ``x.grad = None`` or ``x.grad.zero_()``)."""
    out: dict[str, list[str]] = {}
    last: dict[str, str] = {}  # leaf -> its .grad text after the previous call that had it
    for call in trace.calls:
        lines = []
        before = (call.options or {}).get("grad_before") or {}
        for name, state in before.items():
            if name in last and state in ("none", "zero"):
                lines.append(f"↺ {name}.grad = None" if state == "none" else f"↺ {name}.grad zeroed")
        shown = 0
        for name, values in call.leaf_grads.items():
            if "." in name and shown >= SHOWN_LEAVES:
                continue
            text = short_values(values, [] if values.numel == 1 else [values.numel])
            if call.api == "autograd.grad":  # returned, not accumulated into .grad
                if shown < SHOWN_LEAVES:
                    lines.append(f"returns ∂/∂{name} {text}")
                    shown += 1
                continue
            if shown < SHOWN_LEAVES:
                lines.append(f"{name}.grad {text}")
                shown += 1
            last[name] = text
        if lines:
            out[call.id] = lines
    return out


def group_calls(calls: list[CallInfo]) -> list[list[CallInfo]]:
    """Consecutive calls made inside the same gradcheck / gradgradcheck (same line) share a group."""
    groups: list[list[CallInfo]] = []
    for call in calls:
        within = (call.options or {}).get("within")
        prev = groups[-1][0] if groups else None
        if within and prev is not None and (prev.options or {}).get("within") == within and prev.line == call.line:
            groups[-1].append(call)
        else:
            groups.append([call])
    return groups
