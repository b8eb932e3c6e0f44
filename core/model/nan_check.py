"""The NaN/Inf check's findings in words (``Trace.nan_check``; the worker's side is
``core.worker.capture.nan_check``): the first op whose output was not finite, and the first
backward node whose gradient was not.

``hold_nan_check`` hands each call of a trace the findings about its own nodes, so whatever
draws a call alone (the window's graph, an export) marks them: ``nonfinite_marks`` says what
each mark reads and explains (``widgets.graph.marks`` places and paints them)."""

from __future__ import annotations


def _number(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "?" if v is None else str(v)


def _bad_values(record: dict) -> str:
    """``1 of 4 values -inf``, ``2 nan and 1 inf of 8 values``."""
    kinds = [(record["nan"], "nan"), (record["posinf"], "inf"), (record["neginf"], "-inf")]
    parts = [f"{n} {kind}" for n, kind in kinds if n]
    if len(parts) == 1:
        n, kind = next((n, kind) for n, kind in kinds if n)
        return f"{n} of {record['numel']} values {kind}"
    return f"{' and '.join(parts)} of {record['numel']} values"


def _where(record: dict) -> str:
    text = f" at line {record['line']}" if record.get("line") is not None else ""
    return text + (f" in {record['module']}" if record.get("module") else "")


def forward_text(record: dict | None) -> str:
    """``log at line 7 in act (torch.log(h)): 1 of 4 values -inf; input h in [0, 3]``."""
    if record is None:
        return "none (every op's output was finite)"
    text = f"{record['op']}{_where(record)} ({record['text']}): "
    which = f"output {record['output']}: " if record["output"] else ""
    text += which + _bad_values(record)
    inputs = [f"input {i['name'] or '#' + str(i['position'])} in [{_number(i['min'])}, {_number(i['max'])}]"
              for i in record["inputs"] if i["min"] is not None]
    return text + ("; " + ", ".join(inputs) if inputs else "")


def backward_text(record: dict | None) -> str:
    """``SqrtBackward0 (line 9, call #0, node n2): its gradient for input 0 has 1 of 4 values inf``."""
    if record is None:
        return "none (every node's gradient was finite)"
    line = f"line {record['line']}, " if record.get("line") is not None else ""
    module = f" in {record['module']}" if record.get("module") else ""
    call = record["call"].lstrip("c")
    return (f"{record['name']} ({line}call #{call}, node {record['node']}){module}: its gradient for input "
            f"{record['input']} has {_bad_values(record)}")


def summary_lines(nan_check: dict | None) -> list[str]:
    """The trace command's two lines; none when the check was off."""
    if nan_check is None:
        return []
    return [f"first non-finite value: {forward_text(nan_check['forward'])}",
            f"first non-finite gradient: {backward_text(nan_check['backward'])}"]


NAN_CHECK_KEY = "_nan_check"  # on a call: the trace's NaN/Inf findings about its nodes


def hold_nan_check(trace) -> None:
    """Give each call of ``trace`` the NaN/Inf check's findings about its nodes (``Trace.nan_check``),
    for its graph's marks: ``[(kind, record)]``, kind ``"forward"`` or ``"backward"``. Again on the
    same trace, the findings are replaced, not added twice."""
    for call in trace.calls:
        call.__dict__.pop(NAN_CHECK_KEY, None)
    calls = {c.id: c for c in trace.calls}
    for kind in ("forward", "backward"):
        record = (trace.nan_check or {}).get(kind)
        call = calls.get(record.get("call")) if record else None
        if call is not None and record.get("node"):
            call.__dict__.setdefault(NAN_CHECK_KEY, []).append((kind, record))


def nonfinite_word(record: dict) -> str:
    """``NaN``, ``inf`` or ``-inf``: what the first non-finite tensor held (NaN before infinities)."""
    if record["nan"]:
        return "NaN"
    return "-inf" if record["neginf"] and not record["posinf"] else "inf"


def nonfinite_marks(call) -> list[tuple[str, str, str]]:
    """``(node id, text, tip)`` for the first non-finite op's node and the first non-finite backward
    node of ``call`` (as ``hold_nan_check`` gave them): ``first -inf: log (line 25)``, ``first NaN
    gradient: LogBackward0``."""
    out = []
    for kind, record in call.__dict__.get(NAN_CHECK_KEY, ()):
        word = nonfinite_word(record)
        if kind == "forward":
            line = f" (line {record['line']})" if record.get("line") is not None else ""
            out.append((record["node"], f"first {word}: {record['op']}{line}",
                        f"First non-finite value: {forward_text(record)}. This node is the op's."))
        else:
            out.append((record["node"], f"first {word} gradient: {record['name']}",
                        f"First non-finite gradient: {backward_text(record)}."))
    return out
