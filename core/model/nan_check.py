"""The NaN/Inf check's findings in words (``Trace.nan_check``; the worker's side is
``core.worker.capture.nan_check``): the first op whose output was not finite, and the first
backward node whose gradient was not."""

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
