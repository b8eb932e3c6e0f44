"""One captured backward call: the graph read before the engine runs, completed after it.

``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad`` are wrapped
while the script runs (``core.worker.capture.recorder`` installs them). Each call is snapshotted *before*
the real call (the engine frees saved tensors as it goes) and completed after it (leaf
``.grad``, retained grads, results, the error if it raised). Calls in a loop whose graph has
the same structure as an earlier call keep a summary only, except the first few and the last.

The script's threads may call backward at the same time: which calls run is kept per thread
(``ThreadState``), and reading and storing a call's graph holds the capture's lock. A call
made while one of this thread's calls runs, or from inside an autograd node (a backward hook,
reentrant checkpointing; on CUDA the node runs on the engine's device thread, not the caller's),
is nested: it belongs to the call whose graph holds that node.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from dataclasses import replace

import torch

from core.worker.capture.edge_grads import LIMIT as EDGE_GRAD_LIMIT
from core.worker.capture.edge_grads import EdgeGradRecorder
from core.worker.capture.names import untraced
from core.worker.capture.nesting import grad_states, inside_gradcheck, inside_reentrant_checkpoint, nested_options
from core.worker.capture.script_errors import error_info
from core.worker.capture.node_graph import label_nodes
from core.worker.capture.node_graph import root_nodes as shared_root_nodes
from core.worker.capture.retained import retained_in
from core.worker.capture.snapshot import Snapshotter
from core.worker.capture.node_graph import grad_fn_of
from core.worker.capture.values import values_of
from core.worker.interrupts import INTERRUPTS
from core.model.trace import CallInfo, paused_gc

_ORIG_TENSOR_BACKWARD = torch.Tensor.backward
_ORIG_BACKWARD = torch.autograd.backward
_ORIG_GRAD = torch.autograd.grad
_current_node = getattr(torch._C, "_current_autograd_node", lambda: None)
# torch.compile runs autograd itself while it traces (AOTAutograd's joint graph): not the script's calls.
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)  # torch < 2.3: none


class ThreadState(threading.local):
    """What a capture keeps per thread of the script."""

    def __init__(self):
        self.depth = 0  # captured calls running on this thread
        self.running: list[int] = []  # their indices, innermost last
        self.tagging = True  # whether this thread's ops tag the nodes they make


class CallRecording:
    """The per-call half of a capture (mixed into ``core.worker.capture.recorder.Capture``)."""

    _local: ThreadState
    _lock: threading.RLock

    @property
    def tagging(self) -> bool:
        """Whether an op run now tags its node: not inside a backward call (the engine's own
        ops, a checkpoint's recomputation), on whichever thread the engine runs it."""
        return self._local.tagging and _current_node() is None

    @tagging.setter
    def tagging(self, value: bool) -> None:
        self._local.tagging = value

    def _is_nested(self) -> bool:
        """Whether a backward call made now runs inside another one."""
        return self._local.depth > 0 or _current_node() is not None

    def _outer_call(self) -> int | None:
        """The running call a call made now is nested in: this thread's innermost, else the
        call whose graph holds the autograd node running now (None: a call of its own)."""
        if self._local.running:
            return self._local.running[-1]
        node = _current_node()
        if node is None or not self._running:
            return None
        seen = _safe_metadata(node).get("bps_seen")
        return seen if seen in self._running else self._running[-1]

    def _tensor_backward(self, tensor, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        def real():
            return _ORIG_TENSOR_BACKWARD(tensor, gradient, retain_graph, create_graph, inputs=inputs)

        if self._is_nested() or _compiling():
            return real()
        return self._record("Tensor.backward", [tensor], real, retain_graph, create_graph, inputs, gradient)

    def _autograd_backward(self, *args, **kwargs):
        def real():
            return _ORIG_BACKWARD(*args, **kwargs)

        if _compiling() or (self._is_nested() and not inside_reentrant_checkpoint(sys._getframe(1))):
            return real()
        bound = _bind(_ORIG_BACKWARD, args, kwargs)
        return self._record(
            "autograd.backward",
            _as_list(bound.get("tensors")),
            real,
            bound.get("retain_graph"),
            bound.get("create_graph", False),
            bound.get("inputs"),
            bound.get("grad_tensors"),
        )

    def _autograd_grad(self, *args, **kwargs):
        def real():
            return _ORIG_GRAD(*args, **kwargs)

        if self._is_nested() or _compiling():
            return real()
        bound = _bind(_ORIG_GRAD, args, kwargs)
        return self._record(
            "autograd.grad",
            _as_list(bound.get("outputs")),
            real,
            bound.get("retain_graph"),
            bound.get("create_graph", False),
            bound.get("inputs"),
            bound.get("grad_outputs"),
        )

    # -- one captured call ---------------------------------------------------------------------
    def _record(self, api, roots, real, retain_graph, create_graph, inputs, seed=None):
        """``seed``: the gradient argument backward starts from (None: ones)."""
        local = self._local
        with self._lock:
            index = self.call_count
            self.call_count += 1
            line = self.names.user_line(sys._getframe(2))
            # A backward run by reentrant checkpointing inside another call's backward: captured as
            # its own call, marked as nested in the running one (core.worker.capture.nesting).
            outer = self._outer_call()
            self._running.append(index)
        within = inside_gradcheck(sys._getframe(2))
        local.running.append(index)
        local.depth += 1
        was_tagging, local.tagging = local.tagging, False
        t0 = time.perf_counter()
        # Options known before the call, merged in by _after (a stored call is streamed at once).
        extra: dict = {}
        if within is not None:
            extra["within"] = within
        with torch._C.DisableTorchFunction(), untraced():
            seeds = [{k: v for k, v in values_of(g, full_limit=16).__dict__.items()
                      if v is not None and not (k == "approx" and v is False)}
                     if isinstance(g, torch.Tensor) else None for g in _as_list(seed)]
        if any(v is not None for v in seeds):
            extra["seed"] = seeds
        try:
            with self._lock:
                if outer is not None:
                    extra.update(nested_options(outer))
                    self._nested.setdefault(outer, []).append(index)
                self._extra[index] = extra
                with torch._C.DisableTorchFunction(), paused_gc(), untraced():
                    snap, nodes, ids, structure, root_ids, input_ids = self._before(roots, inputs, index)
                self.phase = "backward"
                self.on_event({"type": "call", "index": index, "api": api, "line": line, "nodes": len(nodes),
                               "t": time.perf_counter() - self.started})
            error = None
            result = None
            try:
                if self.call_hook is not None and outer is None:
                    self.hook_call = (api, index, line, snap, nodes, ids, structure, root_ids)
                    result = self.call_hook(index=index, api=api, roots=roots, real=real)
                else:
                    result = real()
            except BaseException as exc:  # recorded, then re-raised so the script sees it
                error = error_info(exc, line, self.names)
                raise
            finally:
                # A Stop that comes while the call is stored waits until it is (it is the call the
                # user stopped in), then stops the script as it would have.
                with INTERRUPTS.held(), self._lock, torch._C.DisableTorchFunction(), paused_gc(), untraced():
                    self._after(api, index, line, snap, nodes, ids, structure, root_ids, input_ids, result,
                                error, retain_graph, create_graph, t0)
            return result
        finally:
            with self._lock:
                if outer is None:
                    self.names.release()
                self._running.remove(index)
            local.tagging = was_tagging
            local.running.pop()
            local.depth -= 1

    def _before(self, roots, inputs, index):
        self.names.refresh(self.names.user_frames(sys._getframe(3)))
        snap = Snapshotter(self.names.name_of, self.names.module_paths, self.inplace, origin=self.cuts.origin)
        for t in roots:
            if isinstance(t, torch.Tensor):
                snap.tensor_id(t)
        root_nodes = shared_root_nodes(roots)
        nodes, ids, structure = snap.walk(root_nodes)
        # Named tensors whose grad_fn lies in this graph label their nodes.
        for _, t in self.names.named_tensors():
            fn = grad_fn_of(t)
            if fn is not None and id(fn) in ids:
                snap.tensor_id(t)
        for t in retained_in(ids):  # retain_grad() on a tensor held under no name: its .grad is read after
            snap.tensor_id(t)
        input_ids = [snap.tensor_id(t) for t in _as_list(inputs) if isinstance(t, torch.Tensor)]
        snap.gets_grad.update(input_ids)
        order = snap.walked
        for node in order:
            try:
                node.metadata["bps_seen"] = index
            except Exception:
                pass
        roots_ids = [ids[id(n)] for n in root_nodes]
        self._grad_before[index] = grad_states(order, self.names.name_of)
        # Edge gradients for small graphs, and in a loop only for the first calls of each structure
        # (later ones are mostly kept as summaries, and the hooks would slow every epoch).
        seen = self._structures.get(structure, (None, 0))[1]
        record = len(nodes) <= EDGE_GRAD_LIMIT and seen < self.keep_first
        self._edge_grads[index] = EdgeGradRecorder(order if record else [], ids)
        if self.nan_check is not None:  # the NaN/Inf check's hooks, removed in _after
            self.nan_check.watch(index, order, ids)
        # Previews are taken now, and every reference backward would otherwise free is dropped:
        # the snapshot must not hold activations (device memory) the script does not hold.
        self.grad_norms.before(index, order)
        self.loop_scalars.before(index, roots, order)  # the loss and the small leaves, for the curves
        snap.release(ids)
        if self.call_hook is None:
            self.names.release()
        return snap, nodes, ids, structure, roots_ids, input_ids

    def call_before(self) -> CallInfo:
        """The call a ``call_hook`` is running, as captured before backward (no grads read yet)."""
        api, index, line, snap, nodes, ids, structure, root_ids = self.hook_call
        with torch._C.DisableTorchFunction(), paused_gc(), untraced():
            tensors = snap.finish_tensors(ids, read_grads=False)
            nodes = label_nodes(nodes, tensors)
            return CallInfo(id=f"c{index}", index=index, api=api, line=line, roots=root_ids, nodes=nodes,
                            tensors=tensors, storages=snap.finish_storages(tensors), structure=structure,
                            node_count=len(nodes), edge_count=sum(1 for n in nodes for e in n.next if e is not None))

    def _after(self, api, index, line, snap, nodes, ids, structure, root_ids, input_ids, result, error,
               retain_graph, create_graph, t0):
        tensors = snap.finish_tensors(ids, read_grads=True)
        recorder = self._edge_grads.pop(index, None)
        edge_grads = recorder.finish() if recorder is not None else {}
        if self.nan_check is not None:
            self.nan_check.unwatch(index)
        nodes = label_nodes(nodes, tensors)
        leaf_grads = {}
        options: dict = {"retain_graph": bool(retain_graph) if retain_graph is not None else bool(create_graph),
                         "create_graph": bool(create_graph)}
        if api == "autograd.grad" and result is not None:
            by_id = {t.id: t for t in tensors}
            results = []
            for tid, g in zip(input_ids, _as_list(result)):
                vals = values_of(g) if isinstance(g, torch.Tensor) else None
                results.append({"tensor": tid, "values": vals.__dict__ if vals else None})
                name = by_id[tid].name if tid in by_id else None
                if name and vals is not None:
                    leaf_grads[name] = vals
            options["results"] = results
        else:
            for t in tensors:
                if t.name and t.grad is not None and (t.is_leaf or t.retains_grad):
                    leaf_grads[t.name] = t.grad.values
        if input_ids:
            options["inputs"] = input_ids
        if index in self._nested:
            options["nested"] = self._nested.pop(index)
        options.update(self._extra.pop(index, {}))
        before = self._grad_before.pop(index, None)
        if before:
            options["grad_before"] = before
        classes = module_classes(nodes, self.names.module_classes)
        if classes:
            options["module_classes"] = classes
        edge_count = sum(1 for n in nodes for e in n.next if e is not None)
        call = CallInfo(
            id=f"c{index}",
            index=index,
            api=api,
            line=line,
            roots=root_ids,
            nodes=nodes,
            tensors=tensors,
            error=error,
            storages=snap.finish_storages(tensors),
            options=options,
            structure=structure,
            node_count=len(nodes),
            edge_count=edge_count,
            leaf_grads=leaf_grads,
            duration_s=time.perf_counter() - t0,
            edge_grads=edge_grads,
            grad_norms=self.grad_norms.after(index, api),
            scalars=self.loop_scalars.after(index),
        )
        self._store(call)
        self.phase = "between"
        self.on_event({"type": "call_done", "index": index, "error": error is not None,
                       "t": time.perf_counter() - self.started})

    def streamable(self, index: int) -> CallInfo:
        """Stored call ``index`` as it is streamed now: a loop's repeated call beyond the first
        few is kept in full only while it is the last (``_pending``), so it goes as its summary,
        and in full with the trace if it stays the last; the others as they are."""
        call = self.calls[index]
        return summary_of(call) if index == self._pending else call

    def _store(self, call: CallInfo) -> None:
        first = self._structures.get(call.structure)
        if first is None:
            self._structures[call.structure] = (call.id, 1)
            self.calls.append(call)
            return
        first_id, count = first
        self._structures[call.structure] = (first_id, count + 1)
        call = replace(call, same_as=first_id)
        if self._pending is not None:
            self.calls[self._pending] = summary_of(self.calls[self._pending])
            self._pending = None
        self.calls.append(call)
        if count + 1 > self.keep_first:
            self._pending = len(self.calls) - 1


def summary_of(call: CallInfo) -> CallInfo:
    """Drop a repeated call's graph, keeping its counts, grads, norms, scalars, line and error."""
    return replace(call, nodes=[], tensors=[], storages=[], roots=[], snapshot="summary", edge_grads={})


def _bind(func, args, kwargs) -> dict:
    try:
        return dict(inspect.signature(func).bind(*args, **kwargs).arguments)
    except TypeError:
        return {}


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, torch.autograd.graph.GradientEdge):
        return [value]
    try:
        return list(value)
    except TypeError:
        return [value]


def _safe_metadata(node) -> dict:
    try:
        return node.metadata
    except Exception:
        return {}


def module_classes(nodes, classes: dict[str, str]) -> dict[str, str]:
    """Class names of the modules the call's nodes were made in, and of the modules around them."""
    paths = set()
    for n in nodes:
        if n.module and n.module not in paths:
            parts = n.module.split(".")
            paths.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {p: classes[p] for p in sorted(paths) if p in classes}
