"""One tensor's graph captured in the caller's own process, for ``backprop_studio.show``.

The same snapshot code as a traced run (``core.worker.capture.snapshot``, ``core.worker.capture.names``) reads the
tensor's grad_fn graph and names its tensors from the caller's frame, without running
backward: the notebook keeps its graph and its grads. The result is one call of kind
``unreached``, as tracing the same script gives for a graph it built and never
backwarded. Nodes know the line that created them when the code ran inside
``backprop_studio.record()`` (``LineTags``), as every op of a traced run does.
"""

from __future__ import annotations

import linecache
import sys
import time
from pathlib import Path
from types import FrameType

import torch
from torch.overrides import TorchFunctionMode

from core.worker.capture.cuts import CutRecorder
from core.worker.capture.names import NameTable
from core.worker.capture.node_graph import label_nodes
from core.worker.capture.snapshot import Snapshotter
from core.model.trace import CallInfo, Trace


def capture_tensor(tensor: torch.Tensor, frame: FrameType) -> Trace:
    """A Trace holding the graph that produced ``tensor``, named from ``frame`` (the caller's)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"show() takes a tensor, not {type(tensor).__name__}")
    started = time.perf_counter()
    script = frame.f_code.co_filename
    names = NameTable(script)
    names.globals = frame.f_globals
    frames = []
    f = frame
    while f is not None:
        if f.f_code.co_filename == script:
            frames.append(f)
        f = f.f_back
    names.refresh(frames)
    calls: list[CallInfo] = []
    try:
        with torch._C.DisableTorchFunction():
            root = tensor.grad_fn
            if root is None and tensor.requires_grad:
                root = torch.autograd.graph.get_gradient_edge(tensor).node
            if root is not None:
                snap = Snapshotter(names.name_of, names.module_paths)
                nodes, ids, structure = snap.walk([root])
                for _, t in names.named_tensors():
                    if t.grad_fn is not None and id(t.grad_fn) in ids:
                        snap.tensor_id(t)
                tensors = snap.finish_tensors(ids)
                nodes = label_nodes(nodes, tensors)
                calls.append(CallInfo(
                    id="c0", index=0, api="unreached", line=None, roots=[ids[id(root)]], nodes=nodes,
                    tensors=tensors, storages=snap.finish_storages(tensors), structure=structure,
                    node_count=len(nodes), edge_count=sum(1 for n in nodes for e in n.next if e is not None),
                ))
            top = Snapshotter(names.name_of, names.module_paths)
            for _, t in names.named_tensors(bound_only=True):
                top.tensor_id(t)
            named = top.finish_tensors(None)
            storages = top.finish_storages(named)
    finally:
        names.release()
    source = ""
    if Path(script).suffix == ".py" and Path(script).is_file():
        try:
            source = Path(script).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            source = ""
    if not source:  # a notebook cell: IPython keeps its text in linecache, not on disk
        source = "".join(linecache.getlines(script))
    return Trace(calls=calls, script=script, source=source, device=str(tensor.device), mode="script",
                 duration_s=time.perf_counter() - started, torch_version=torch.__version__, call_count=0,
                 tensors=named, storages=storages)


class LineTags(TorchFunctionMode):
    """Tags each new grad_fn with the line of ``filename`` that created it (``record()``), as a
    traced run does, so a shown graph links its nodes to the caller's lines."""

    def __init__(self, filename: str):
        super().__init__()
        self.filename = filename
        self.cuts = CutRecorder()  # why an input needs no gradient, as a traced run notes it

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        line = None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename == self.filename:
                line = frame.f_lineno
                break
            frame = frame.f_back
        for o in outs:
            fn = o.grad_fn if isinstance(o, torch.Tensor) else None
            if fn is None and isinstance(o, torch.Tensor):
                self.cuts.note_free(o, getattr(func, "__name__", ""), args)
            if fn is not None and "bps_line" not in fn.metadata:
                self.cuts.note_inputs(fn.metadata, args)
                fn.metadata["bps_line"] = line
                fn.metadata["bps_device"] = str(o.device)
        return out
