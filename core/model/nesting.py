"""The backward nested in a checkpoint node, shown inside that node (plain data, no torch, no Qt).

Reentrant checkpointing (``torch.utils.checkpoint(..., use_reentrant=True)``) runs a whole
backward call inside the outer call's ``CheckpointFunctionBackward`` node; the trace stores it
as a call of its own (``options.nested_in`` / ``inside``, and ``nested`` on the outer call).
``link_nested`` gives each outer call a summary of its nested calls (id, node count, the ops),
which the node's box lists and the graph opens on a double-click. The summary lives under
``options["_nested_calls"]``: keys starting with "_" are never written to a trace file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from core.model.trace import CallInfo

CHECKPOINT_NODE = "CheckpointFunctionBackward"
KEY = "_nested_calls"
SHOWN_OPS = 4
LINE_CHARS = 34


@dataclass(frozen=True)
class NestedCall:
    """A backward call run inside a checkpoint node of another call."""

    id: str
    index: int
    nodes: int
    ops: tuple[tuple[str, int], ...]  # (node name, how many), in the call's node order


def ops_of(call: CallInfo) -> tuple[tuple[str, int], ...]:
    counts = Counter(n.name for n in call.nodes)
    order = sorted(dict.fromkeys(n.name for n in call.nodes), key=lambda name: name == "AccumulateGrad")  # leaves last
    return tuple((name, counts[name]) for name in order)


def link_nested(calls: Sequence[CallInfo]) -> None:
    """Give each call that ran others inside its checkpoint node the summary of those calls."""
    by_index = {c.index: c for c in calls}
    for call in calls:
        opts = call.options
        if not isinstance(opts, dict) or not opts.get("nested"):
            continue
        found = []
        for i in opts["nested"]:
            inner = by_index.get(i)
            if inner is not None:
                found.append(NestedCall(inner.id, inner.index, len(inner.nodes) or inner.node_count, ops_of(inner)))
        opts[KEY] = found


def nested_calls(call: CallInfo | None, node=None) -> list[NestedCall]:
    """The calls nested in ``call`` (in ``node`` when given: only a checkpoint node holds them)."""
    if call is None or (node is not None and getattr(node, "name", None) != CHECKPOINT_NODE):
        return []
    return list((call.options or {}).get(KEY) or [])


def _wrap(parts: list[str], width: int) -> list[str]:
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += ", " + part
        else:
            lines.append(part)
    return lines


def nested_lines(call: CallInfo, node) -> list[str]:
    """Lines for the checkpoint node's box: each nested call's number, node count and ops."""
    out = []
    for nc in nested_calls(call, node):
        out.append(f"⤷ backward #{nc.index}: {nc.nodes} node{'' if nc.nodes == 1 else 's'}")
        parts = [f"{k} × {name}" if k > 1 else name for name, k in nc.ops[:SHOWN_OPS]]
        if len(nc.ops) > SHOWN_OPS:
            parts.append(f"+{len(nc.ops) - SHOWN_OPS} more")
        out.extend("  " + line for line in _wrap(parts, LINE_CHARS))
    return out
