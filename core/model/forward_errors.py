"""An error the script raised in forward, told at the op that raised it (plain data, no torch).

When a torch op raises while the script builds its graph (an in-place op on a leaf that
requires grad, ``.numpy()`` on a tensor that requires grad, shapes that do not fit), the worker
records that op in ``ErrorInfo.failed_op`` and keeps the graph built so far that reaches its
inputs as a call of its own, whose ``options["failed_op"]`` holds the same record with the
error's type and message. A record is a dict:

- ``name``: the torch function (``add_``, ``numpy``, ``mm``);
- ``text``: the call as the op saw it, inputs named by the script (``x.add_(1)``, ``torch.mm(x, w)``);
- ``line``: the script line of the op (``where``: "cell 4, line 2" in a notebook);
- ``inputs``: the tensors it was called on, each ``{position, name, shape, dtype, requires_grad,
  is_leaf, node}``, ``node`` the id of its grad_fn (or AccumulateGrad) in the partial call;
- ``call`` (in the error): the id of that partial call, or None when no input had a graph;
- ``type``, ``message`` (in the call's options): the error.

Here are the texts the graph's mark, its tooltip and the exports' titles show.
"""

from __future__ import annotations

import re

from core.model.trace import CallInfo, ErrorInfo
from core.model.values import format_shape

KEY = "failed_op"
TITLE_CHARS = 200  # an export's title: the message's first line, cut at a word past this
REASON_CHARS = 80  # a mark's reason, when no shorter words are known for the message


def failed_op(call: CallInfo | None) -> dict | None:
    """The op whose error ``call`` is the partial graph of, or None."""
    if call is None:
        return None
    return (call.options or {}).get(KEY)


def failed_inputs(call: CallInfo | None) -> list[str]:
    """The node ids, in this call, of the inputs the op a forward pass failed in was called on."""
    op = failed_op(call)
    if op is None:
        return []
    return [e["node"] for e in op.get("inputs") or () if e.get("node") and call.node(e["node"]) is not None]


def _dims(a: str, b: str) -> str:
    return f"{a}\u00d7{b}"


# (pattern of torch's message, the short words for it): the message says it for autograd's
# internals; the mark says it for the script.
_REASONS: list[tuple[re.Pattern, object]] = [
    (re.compile(r"a view of a leaf Variable that requires grad is being used in an in-place operation"),
     "a view of a leaf that requires grad cannot be changed in place"),
    (re.compile(r"a leaf Variable that requires grad is being used in an in-place operation"),
     "a leaf that requires grad cannot be changed in place"),
    (re.compile(r"Can't call numpy\(\) on Tensor that requires grad"),
     lambda m, who="": f"a tensor that requires grad has no .numpy(); call {who}.detach().numpy()"),
    (re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)"),
     lambda m: f"shapes {_dims(m[1], m[2])} and {_dims(m[3], m[4])} cannot be multiplied ({m[2]} \u2260 {m[3]})"),
    (re.compile(r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) "
                r"at non-singleton dimension (\d+)"),
     lambda m: f"sizes {m[1]} and {m[2]} at dimension {m[3]} do not broadcast"),
    (re.compile(r"Tensor on device (\S+) is not on the expected device (\S+?)!"),
     lambda m: f"a tensor on {m[1]} meets one on {m[2]}: move one with .to()"),
    (re.compile(r"Expected all tensors to be on the same device, but (?:found at least two devices, )?"
                r"(\S+?) and (\S+?)[!.,]"),
     lambda m: f"a tensor on {m[1]} meets one on {m[2]}: move one with .to()"),
    (re.compile(r"size mismatch, got input \((\d+)\), mat \((\d+)x(\d+)\), vec \((\d+)\)"),
     lambda m: f"shapes {_dims(m[2], m[3])} and {m[4]} cannot be multiplied ({m[3]} \u2260 {m[4]})"),
]


_NUMPY = _REASONS[2][0]


def short_reason(message: str, op: dict | None = None) -> str:
    """What went wrong, in a few true words: ``a leaf that requires grad cannot be changed in place``;
    ``op`` (the failed op's record) names the tensor where the fix needs it (``h.detach().numpy()``)."""
    for pattern, words in _REASONS:
        m = pattern.search(message)
        if m is not None:
            if not callable(words):
                return words
            first = ((op or {}).get("inputs") or [{}])[0].get("name") if pattern is _NUMPY else None
            return words(m, first) if first else words(m)
    first = (message.strip().splitlines() or [""])[0]
    first = first.split(". ")[0].rstrip(".")
    return _cut(first, REASON_CHARS)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    at = text.rfind(" ", 0, limit)
    return text[: at if at > 0 else limit] + " \u2026"


def _where(op: dict) -> str:
    if op.get("where"):
        return op["where"]
    return f"line {op['line']}" if op.get("line") is not None else "no line"


def mark_text(op: dict) -> str:
    """The mark on the graph: ``x.add_(1) failed: a leaf that requires grad cannot be changed in place (line 7)``."""
    return f"{op['text']} failed: {short_reason(op.get('message', ''), op)} ({_where(op)})"


def input_text(entry: dict) -> str:
    """One input of the failed op: ``x: shape 2 · float32 · leaf · requires grad``."""
    parts = [format_shape(entry.get("shape")) or "shape unknown", entry.get("dtype", "")]
    if entry.get("requires_grad"):
        parts.append("leaf · requires grad" if entry.get("is_leaf") else "requires grad (not a leaf)")
    else:
        parts.append("requires no grad")
    name = entry.get("name") or f"input {entry.get('position', 0)}"
    return f"{name}: " + " \u00b7 ".join(p for p in parts if p)


def mark_tip(op: dict) -> str:
    """The mark's tooltip: the whole message and the inputs the op was called on."""
    lines = [f"{op['text']} raised {op.get('type', 'an error')} at {_where(op)}:", op.get("message", "").strip()]
    inputs = op.get("inputs") or []
    if inputs:
        lines += ["", "Called on:"] + [input_text(e) for e in inputs]
    lines += ["", "The graph shows what the script had built when the op failed; backward never ran on it."]
    return "\n".join(lines)


def error_title(error: ErrorInfo | None) -> str:
    """The title of a failed run's export: ``RuntimeError at line 7: a leaf Variable that requires grad
    is being used in an in-place operation.`` ("" without an error)."""
    if error is None:
        return ""
    return _title(error.type, error.message, error.where or (f"line {error.line}" if error.line is not None else ""))


def op_title(op: dict) -> str:
    """``error_title`` of the error a failed op's partial call holds (the op's line)."""
    return _title(op.get("type", "Error"), op.get("message", ""), _where(op) if op.get("line") is not None or
                  op.get("where") else "")


def _title(kind: str, message: str, where: str) -> str:
    first = (message.strip().splitlines() or [""])[0]
    head = f"{kind} at {where}" if where else kind
    return f"{head}: {_cut(first, TITLE_CHARS)}" if first else head
