"""Readable saved attributes: enum-like integers decoded, saved tensors named like the script.

autograd keeps a node's non-tensor arguments as raw integers: ``reduction 1`` is ``'mean'``,
and ``ignore_index`` is handed back as an unsigned 64-bit number (``18446744073709551516`` is
``-100``; the capture stores it signed). Saved tensors are shown as ``self = a``: the argument
name, then the script's name.
Plain data only (no torch): the GUI and the exporters use it.
"""

from __future__ import annotations

from core.model.trace import CallInfo, NodeInfo, Saved

REDUCTIONS = {0: "'none'", 1: "'mean'", 2: "'sum'"}
_SIGNED_NAMES = ("ignore_index", "padding_idx", "dim", "dim0", "dim1", "start", "end", "index")
_INT64_MAX = 2**63 - 1
_UINT64 = 2**64


def signed_int64(value):
    """An int64 that autograd hands back as unsigned (``18446744073709551516``) as the signed
    number it is (``-100``); every other value as it is. The capture stores saved values so."""
    if type(value) is int and _INT64_MAX < value < _UINT64:
        return value - _UINT64
    return value


def decode_value(name: str, value):
    """A saved non-tensor value as the script would have written it."""
    if name == "reduction" and isinstance(value, int) and value in REDUCTIONS:
        return REDUCTIONS[value]
    value = signed_int64(value)  # traces written before the capture stored it signed
    if name in ("end",) and value == _INT64_MAX:
        return "end"
    return value


def decoded_text(name: str, value) -> str:
    """``decode_value`` as display text; strings (already readable) are kept as they are."""
    shown = decode_value(name, value)
    if isinstance(shown, float):
        return f"{shown:.6g}"
    return str(shown)


# Non-tensor saved values worth a box beside the node: the ones a formula or a lesson names.
SHOWN_VALUES = frozenset(("exponent", "alpha", "beta", "reduction", "ignore_index", "negative_slope", "min", "max",
                          "dim", "approximate", "p", "eps"))


def shown_value(saved: Saved) -> bool:
    """Whether a non-tensor saved value is drawn on the graph (``alpha = 1`` and sizes are not)."""
    if saved.tensor is not None or saved.freed or saved.value in (None, "stale") or saved.name not in SHOWN_VALUES:
        return False
    return not (saved.name in ("alpha", "beta") and saved.value == 1)


def tensor_words(t) -> str:
    """A tensor as a student would name it: its script name, else what made it ('output of ReluBackward0')."""
    if t.name:
        return t.name
    if t.grad_fn_name:
        return f"output of {t.grad_fn_name}"
    return f"[{', '.join(map(str, t.shape))}] tensor"


def saved_label(call: CallInfo, saved: Saved) -> str:
    """One saved entry as 'name = value': 'self = a', 'reduction = 'mean'', 'other = [3, 4] tensor'."""
    if saved.freed:
        return f"{saved.name} (freed)"
    if saved.tensor is not None:
        t = call.tensor(saved.tensor)
        return f"{saved.name} = {tensor_words(t)}" if t is not None else saved.name
    return f"{saved.name} = {decoded_text(saved.name, saved.value)}"


def script_names(call: CallInfo, node: NodeInfo) -> tuple[dict[str, str], list[str | None], str | None]:
    """(saved name -> script name, script name per input, the output's script name) of a node."""
    names = {}
    for s in node.saved:
        if s.tensor is not None:
            t = call.tensor(s.tensor)
            if t is not None and t.name:
                names[s.name] = t.name
    inputs: list[str | None] = []
    for edge in node.next:
        if edge is None:
            inputs.append(None)
            continue
        src = call.node(edge.node)
        label = None
        if src is not None:
            label = src.label
            if label is None and src.variable is not None:
                var = call.tensor(src.variable)
                label = var.name if var is not None else None
        inputs.append(label)
    return names, inputs, node.label
