"""Tensor anatomy of a call: in-place ops, stale saved tensors, shared storages, device changes.

Plain functions of a CallInfo, so the graph view and the exporters mark the same things and
say the same words about them. Qt-free. A script line is written "line 12"; a notebook's as
"cell 4, line 2" once ``name_lines`` gave its calls the notebook's cells.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from core.model.trace import CallInfo, NodeInfo, StorageInfo, TensorInfo
from core.model.values import dims_text, format_shape

ARROW = "\u2192"
WHERE = "_where"  # options key: how the call writes a script line; "_" keys are never saved to a trace file
HOOK_LINE = re.compile(r" \(line (\d+)\)$")  # a hook as the trace stores it: "clip (line 5)"


@dataclass(frozen=True)
class Holder:
    """A tensor a node relates to: its own tensor (``saved`` None) or one it saved for backward."""

    node: str
    saved: str | None
    tensor: str | None
    storage: str
    inferred: bool = False  # a stale saved tensor: its storage is that of the in-place op's tensor


@dataclass(frozen=True)
class DeviceChange:
    """A trace edge whose two nodes' outputs live on different devices.

    ``before`` is the device of ``dst``'s output (the producer in the forward pass), ``after``
    that of ``src`` (its consumer): the forward pass moved data before -> after, the gradient
    goes back after -> before, and ``text`` says that way, as the dtype marks of
    ``core.model.edge_marks`` do.
    """

    src: str
    dst: str
    slot: int
    before: str
    after: str

    @property
    def text(self) -> str:
        return f"{self.after} {ARROW} {self.before}"


# -- names ---------------------------------------------------------------------------------------


def name_lines(calls: Iterable[CallInfo], where: Callable[[int], str]) -> None:
    """Have every text about ``calls`` write a script line as ``where(line)`` does: for a notebook,
    ``functools.partial(core.programs.notebook.where, trace.cells)`` ("cell 4, line 2")."""
    for call in calls:
        if isinstance(call.options, dict):
            call.options[WHERE] = where


def line_name(call: CallInfo, line: int | None) -> str:
    """``line 12``, or ``cell 4, line 2`` in a notebook (``name_lines``); "" for no line."""
    if not line:
        return ""
    where = call.options.get(WHERE) if isinstance(call.options, dict) else None
    return (where(line) if where is not None else "") or f"line {line}"


def hook_name(call: CallInfo, hook: str) -> str:
    """A hook as the trace stores it, "clip (line 5)", with its line named as ``line_name`` does."""
    found = HOOK_LINE.search(hook)
    if found is None:
        return hook
    return f"{hook[:found.start()]} ({line_name(call, int(found.group(1)))})"


def tensor_name(call: CallInfo, t: TensorInfo | None) -> str:
    """The script's name for a tensor, else its grad_fn's label, else its shape."""
    if t is None:
        return "a tensor"
    if t.name:
        return t.name
    node = call.node(t.grad_fn) if t.grad_fn else None
    if node is not None and node.label:
        return node.label
    return f"a {dims_text(t.shape) or 'scalar'} tensor"


def view_base(call: CallInfo, tensor_id: str | None) -> TensorInfo | None:
    """The base of a view, when the tensor is a view and its base is in the call."""
    t = call.tensor(tensor_id)
    if t is None or not t.is_view or t.base is None:
        return None
    return call.tensor(t.base)


# -- devices -------------------------------------------------------------------------------------


def node_device(call: CallInfo, node: NodeInfo) -> str | None:
    """Device of a node's output; AccumulateGrad and nodes made inside C++ ops use their tensor's."""
    if node.device:
        return node.device
    t = call.tensor(node.variable or node.tensor)
    return t.device if t is not None else None


def call_devices(call: CallInfo) -> list[str]:
    """The devices the call's nodes put their outputs on, in first-seen order (kept on the call)."""
    cached = call.__dict__.get("_call_devices")
    if cached is None:
        seen: dict[str, None] = {}
        for n in call.nodes:
            d = node_device(call, n)
            if d:
                seen.setdefault(d, None)
        cached = tuple(seen)
        object.__setattr__(call, "_call_devices", cached)
    return list(cached)


def device_changes(call: CallInfo) -> list[DeviceChange]:
    """Edges along which the gradient crosses devices (e.g. into a ``ToCopyBackward0``); kept on
    the call (it is immutable), as every fold of a 50,000-node graph asks again."""
    cached = call.__dict__.get("_device_changes")
    if cached is not None:
        return list(cached)
    out = _device_changes(call)
    object.__setattr__(call, "_device_changes", tuple(out))
    return out


def _device_changes(call: CallInfo) -> list[DeviceChange]:
    devices = {n.id: node_device(call, n) for n in call.nodes}
    out = []
    for n in call.nodes:
        after = devices[n.id]
        if after is None:
            continue
        for slot, e in enumerate(n.next):
            before = devices.get(e.node) if e is not None else None
            if before is not None and before != after:
                out.append(DeviceChange(n.id, e.node, slot, before, after))
    return out


def device_change_tip(call: CallInfo, change: DeviceChange) -> str:
    src, dst = call.node(change.src), call.node(change.dst)
    return (
        f"Device change: the forward pass moved data from {change.before} to {change.after} here "
        f"({dst.name} on {change.before} feeds {src.name} on {change.after}).\n"
        f"In backward the gradient travels the other way, {change.after} {ARROW} {change.before}, "
        "and is copied between devices."
    )


# -- in-place ops and stale saved tensors ---------------------------------------------------------


def stale_culprit(call: CallInfo, node: NodeInfo) -> NodeInfo | None:
    """The node made by the in-place op that modified ``node``'s stale saved tensor, if drawn."""
    s = node.stale
    if s is None or s.op is None:
        return None
    found = [m for m in call.nodes if m.inplace == s.op and (s.op_line is None or m.line == s.op_line)]
    for m in found:
        if any(e is not None and e.node == node.id for e in m.next):
            return m
    return found[0] if found else None


def _version(v: int | None) -> str:
    return "?" if v is None else str(v)


def stale_versions(node: NodeInfo) -> str:
    """``v0 → v1``: the version a stale tensor was saved at, and its version now."""
    s = node.stale
    return f"v{_version(s.saved_version)} {ARROW} v{_version(s.version)}"


def stale_tag(node: NodeInfo) -> str:
    """``result v0 → v1``: the stale saved tensor's name and versions."""
    return f"{node.stale.saved} {stale_versions(node)}"


def stale_tip(call: CallInfo, node: NodeInfo) -> str:
    """Why backward fails at ``node``, in plain words."""
    s = node.stale
    culprit = stale_culprit(call, node)
    name = None
    if culprit is not None:
        name = culprit.label or (tensor_name(call, call.tensor(culprit.tensor)) if culprit.tensor else None)
    subject = f"{name} (saved as '{s.saved}')" if name else f"The saved tensor '{s.saved}'"
    where = f" at {line_name(call, s.op_line)}" if s.op_line else ""
    op = f"{s.op}{where} changed it in place" if s.op else "an in-place op changed it"
    return (
        f"{subject} was saved at version {_version(s.saved_version)} by {node.name}; "
        f"{op} (now version {_version(s.version)}): backward will fail here."
    )


def inplace_tip(call: CallInfo, node: NodeInfo, stale: list[NodeInfo] | None = None) -> str:
    """What an in-place op did to the tensor and to the graph; ``stale``: the call's stale nodes, if known."""
    name = node.label or (tensor_name(call, call.tensor(node.tensor)) if node.tensor else "its input")
    where = f" at {line_name(call, node.line)}" if node.line else ""
    prev = next((call.node(e.node) for e in node.next if e is not None), None)
    stacked = f", stacked on {prev.name}, which made it before" if prev is not None else ""
    if stale is None:
        stale = [n for n in call.nodes if n.stale is not None]
    broken = [n.name for n in stale if stale_culprit(call, n) is node]
    after = (
        f" {' and '.join(broken)} saved the old value: backward fails there."
        if broken
        else " No saved tensor needed the old value, so backward is unaffected."
    )
    return (
        f"In-place op: {node.inplace}{where} changed {name} in place. Its version counter went up by one "
        f"and this {node.name} became its grad_fn{stacked}.{after}"
    )


# -- shared storages -------------------------------------------------------------------------------


def storage_holders(call: CallInfo) -> dict[str, list[Holder]]:
    """Every node's tensors (output, leaf, saved) grouped by storage, in node order."""
    out: dict[str, list[Holder]] = {}
    tensors = call.tensor_map()

    def add(node_id: str, saved: str | None, tid: str | None, inferred: bool = False) -> None:
        t = tensors.get(tid) if tid else None
        if t is not None and t.storage is not None:
            out.setdefault(t.storage, []).append(Holder(node_id, saved, tid, t.storage, inferred))

    for n in call.nodes:
        for tid in dict.fromkeys(t for t in (n.tensor, n.variable) if t):
            add(n.id, None, tid)
        for s in n.saved:
            if s.tensor is not None:
                add(n.id, s.name, s.tensor)
            elif s.value == "stale" and n.stale is not None and n.stale.saved == s.name:
                culprit = stale_culprit(call, n)
                if culprit is not None:
                    add(n.id, s.name, culprit.tensor, inferred=True)
    return out


def holder_text(call: CallInfo, h: Holder) -> str:
    node = call.node(h.node)
    name = tensor_name(call, call.tensor(h.tensor))
    if h.saved is not None:
        text = f"{name}, saved as '{h.saved}' by {node.name}"
        return text + " (before the in-place change)" if h.inferred else text
    if node.kind == "accumulate_grad":
        return f"leaf {name}"
    return f"{name}, output of {node.name}"


def storage_tip(call: CallInfo, storage: str, holders: list[Holder], info: StorageInfo | None = None) -> str:
    """What a storage link means; ``info`` saves a search of the call's storages."""
    info = info or next((s for s in call.storages if s.id == storage), None)
    size = f" ({info.nbytes:,} bytes on {info.device})" if info is not None else ""
    lines = [f"Same storage {storage}{size}: these tensors share one block of memory,"]
    lines.append("so an in-place change through one of them changes the others:")
    lines += [f"  {holder_text(call, h)}" for h in dict.fromkeys(holders)]
    return "\n".join(lines)


def view_tip(call: CallInfo, tensor_id: str, base: TensorInfo, saved: str | None = None) -> str:
    t = call.tensor(tensor_id)
    what = f"The saved '{saved}'" if saved else tensor_name(call, t)
    return (
        f"{what} is a view of {tensor_name(call, base)}: the same storage {base.storage} seen with "
        f"{format_shape(t.shape)}, stride {tuple(t.stride)} and offset {t.storage_offset}; no copy was made."
    )
