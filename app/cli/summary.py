"""A readable plain-text summary of a trace, for the headless ``trace`` command."""

from __future__ import annotations

from collections import Counter

from core.model.nan_check import summary_lines as nan_check_lines
from core.model.trace import CallInfo, Trace, Values
from core.programs.notebook import where as line_where


def format_values(values: Values | None, limit: int = 8) -> str:
    if values is None:
        return "None"
    data = values.data if values.data is not None else values.sample
    if data is None:
        return f"<{values.numel} values>"
    shown = ", ".join(_fmt(v) for v in data[:limit])
    more = values.numel > limit
    if values.numel == 1 and data:
        return _fmt(data[0])
    text = f"[{shown}{', ...' if more else ''}]"
    if values.data is None and values.min is not None:
        mark = "\u2248" if values.approx else ""  # statistics of a strided sample
        text += f" (min {mark}{_fmt(values.min)}, max {mark}{_fmt(values.max)}, mean {mark}{_fmt(values.mean)})"
    return text


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def call_summary(call: CallInfo, cells: list | None = None) -> list[str]:
    where = line_where(cells or [], call.line) if call.line else "end of script"
    head = f"call #{call.index}: {call.api} at {where}: {call.node_count} nodes, {call.edge_count} edges"
    if call.snapshot == "summary":
        head += f" (same graph as {call.same_as}; summary only)"
    lines = [head]
    if call.error:
        lines.append(f"  error: {call.error.type}: {call.error.message.splitlines()[0] if call.error.message else ''}")
    if call.nodes:
        roots = ", ".join(call.node(r).name for r in call.roots if call.node(r))
        lines.append(f"  roots: {roots}")
        counts = Counter(n.name for n in call.nodes)
        lines.append("  nodes: " + ", ".join(f"{name} x{k}" if k > 1 else name for name, k in sorted(counts.items())))
        stale = [n for n in call.nodes if n.stale]
        for n in stale:
            at = f" at {line_where(cells or [], n.stale.op_line)}" if n.stale.op_line else ""
            culprit = f" (modified by {n.stale.op}{at})" if n.stale.op else ""
            lines.append(f"  stale saved tensor: {n.name}.{n.stale.saved} saved at version "
                         f"{n.stale.saved_version}, now {n.stale.version}{culprit}")
    for name, vals in call.leaf_grads.items():
        lines.append(f"  {name}.grad = {format_values(vals)}" if call.api != "autograd.grad"
                     else f"  d/d{name} = {format_values(vals)}")
    lines.extend(all_reduce_summary(call.options.get("all_reduce")))
    return lines


def all_reduce_summary(ar: dict | None) -> list[str]:
    """DDP's gradient all-reduce for one call: each rank's local gradient and the reduced one."""
    if not ar:
        return []
    lines = [f"  all-reduce ({ar.get('backend')}, {ar.get('world_size')} ranks, {ar.get('op')}; this is rank "
             f"{ar.get('rank')}) on {len(ar.get('params', {}))} parameter(s)"]
    ranks = ar.get("ranks") or {str(ar.get("rank")): ar.get("params", {})}
    for name in ar.get("params", {}):
        for r, params in sorted(ranks.items()):
            local = params.get(name, {}).get("local")
            lines.append(f"    {name} rank {r} local grad = {_plain_values(local)}")
        lines.append(f"    {name} after all-reduce = {_plain_values(ar['params'][name].get('reduced'))}")
    return lines


def _plain_values(d: dict | None) -> str:
    return format_values(Values(**d)) if d else "None"


def trace_summary(trace: Trace, shown_calls: int = 12) -> str:
    lines = [f"{trace.script} on {trace.device}: {trace.call_count} backward call(s), "
             f"{len(trace.calls)} graph(s) stored, {trace.duration_s:.2f} s"]
    calls = trace.calls
    hidden = 0
    if len(calls) > shown_calls:
        hidden = len(calls) - shown_calls
        calls = calls[: shown_calls // 2] + calls[-shown_calls // 2:]
    for i, call in enumerate(calls):
        if hidden and i == shown_calls // 2:
            lines.append(f"... {hidden} more calls ...")
        lines.extend(call_summary(call, getattr(trace, "cells", None)))
    if trace.error:
        e = trace.error
        where = f" at {e.where}" if getattr(e, "where", "") else (f" at line {e.line}" if e.line else "")
        lines.append(f"error{where}: {e.type}: {e.message}")
    lines.extend(nan_check_lines(trace.nan_check))
    return "\n".join(lines)
