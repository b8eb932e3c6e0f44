"""The autograd graph alive at a forward pause, read as a call is (worker side, imports torch).

A debug run paused in forward (``core.worker.forward_pause``) shows what ``c = a + b`` has built so
far: every grad_fn node reachable from the tensors the paused frames can reach (their locals, the
globals, lists of tensors, the parameters, buffers and tensor attributes of the modules they hold),
with the AccumulateGrad node of every leaf that requires grad, in the trace format (a ``CallInfo`` of
api "live", id ``live<pause>``). Its tensors are every named live tensor, requires_grad or not.

Each node is stamped with the number of the pause that first saw it (``metadata["bps_pause"]``), so
the nodes made since the previous pause are known. Reading changes nothing of the run: no grad is
read, no op of the script's modes runs, and no tensor or node is held once the call is built (the
name table is released as ``call_before`` releases it).
"""

from __future__ import annotations

from types import FrameType

import torch

from core.model.trace import CallInfo, paused_gc
from core.worker.capture.names import untraced
from core.worker.capture.node_graph import gradient_node, label_nodes, number_nodes
from core.worker.capture.snapshot import Snapshotter

LIVE_API = "live"
PAUSE_MARK = "bps_pause"  # node metadata: the pause that first saw the node
MAX_ATTRS = 256  # tensor attributes read per module (a module holding a list of thousands is rare)


def module_attr_tensors(frames: list[FrameType], module_paths: dict[int, str], named) -> list[tuple[str, torch.Tensor]]:
    """Tensors held as plain attributes (``self.cache = h``) of the modules whose ``forward`` the
    paused frames run, named by the module's path; parameters and buffers are named already."""
    out = []
    for frame in frames:
        owner = frame.f_locals.get("self")
        if not issubclass(type(owner), torch.nn.Module):
            continue
        path = module_paths.get(id(owner)) or "self"
        try:
            items = list(vars(owner).items())[:MAX_ATTRS]
        except TypeError:
            continue
        for attr, value in items:
            if issubclass(type(value), torch.Tensor) and value._cdata not in named:
                out.append((f"{path}.{attr}", value))
    return out


def live_call(capture, frames: list[FrameType], pause: int, extra=(), leaves=None) -> tuple[CallInfo, list[str]]:
    """The graph alive in ``frames`` (the script's frames, innermost first) as a call, and the ids of
    its nodes first seen at this pause. ``extra``: (name, tensor) pairs that no variable holds yet
    (the output of the op a NaN pause stopped after). ``leaves``: a ``WeakIdKeyDictionary`` kept
    across the run's pauses, leaf tensor -> the pause that first saw it (see ``_first_seen``)."""
    names = capture.names
    with torch._C.DisableTorchFunction(), paused_gc(), untraced():
        names.refresh(frames)
        try:
            return _read(capture, names, frames, pause, extra, leaves)
        finally:
            names.release()


def _first_seen(node, pause: int, leaves) -> int | None:
    """The pause that first saw ``node``, stamped now if this is it. A leaf's AccumulateGrad is
    freed by torch while no op uses the leaf and made again later: the leaf tensor is what stays,
    so leaves are remembered by their tensor (weakly)."""
    try:
        md = node.metadata
    except Exception:
        return None
    if PAUSE_MARK not in md:
        md[PAUSE_MARK] = pause
        if leaves is not None and hasattr(node, "variable"):
            try:
                md[PAUSE_MARK] = leaves.setdefault(node.variable, pause)
            except Exception:  # a node whose variable cannot be read
                pass
    return md[PAUSE_MARK]


def _read(capture, names, frames, pause, extra, leaves) -> tuple[CallInfo, list[str]]:
    tensors = names.named_tensors()
    named = {t._cdata for _, t in tensors}
    attrs = module_attr_tensors(frames, names.module_paths, named)
    extra = [(n, t) for n, t in extra if isinstance(t, torch.Tensor) and t._cdata not in named]
    labels = {t._cdata: n for n, t in attrs + extra}

    def name_of(t):
        return names.name_of(t) or labels.get(t._cdata)

    everything = tensors + attrs + extra
    candidates, seen = [], set()
    for _, t in everything:
        fn = gradient_node(t)
        if fn is not None and id(fn) not in seen:
            seen.add(id(fn))
            candidates.append(fn)
    snap = Snapshotter(name_of, names.module_paths, capture.inplace, origin=capture.cuts.origin)
    nodes, ids, structure, roots, new = [], {}, "", [], []
    if candidates:
        order = number_nodes(candidates)[0]
        children = {id(fn) for node in order for fn, _ in node.next_functions if fn is not None}
        roots = [fn for fn in candidates if id(fn) not in children]
        nodes, ids, structure = snap.walk(roots)
        for node in snap.walked:
            first = _first_seen(node, pause, leaves)
            if first == pause:
                new.append(ids[id(node)])
        del order, children
    for _, t in everything:
        snap.tensor_id(t)
    infos = snap.finish_tensors(ids, read_grads=False)
    nodes = label_nodes(nodes, infos)
    root_ids = [ids[id(r)] for r in roots]
    snap.release(ids)
    snap.objects = {}
    line = frames[0].f_lineno if frames else None  # the line the run is paused before
    call = CallInfo(id=f"live{pause}", index=pause, api=LIVE_API, line=line, roots=root_ids, nodes=nodes,
                    tensors=infos, storages=snap.finish_storages(infos), structure=structure,
                    node_count=len(nodes), edge_count=sum(1 for n in nodes for e in n.next if e is not None))
    return call, new
