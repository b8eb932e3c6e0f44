"""Run a user's script and capture every autograd graph it builds (worker side, imports torch).

``Capture.run()`` runs the script as ``python`` would (its own ``__main__``, ``sys.argv``,
``sys.path[0]``) with three things installed: the wrapped backward entry points, which
snapshot each call's graph (``core.worker.capture.call_record``); a TorchFunctionMode and module hooks,
which tag each new node with its line, module and device (``core.worker.capture.creation``); and a
``sys.settrace`` hook on the user's own files, which remembers the names of tensors local
to functions that returned (``core.worker.capture.names``). Graphs never backwarded are captured from the
script's namespace when it ends.
"""

from __future__ import annotations

import builtins
import gc
import linecache
import logging
import os
import sys
import threading
import time
import traceback
import types
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from core.worker.capture.call_record import _ORIG_BACKWARD, _ORIG_GRAD, _ORIG_TENSOR_BACKWARD, CallRecording, ThreadState
from core.worker.capture.creation import CreationTags, _CreationMode, _register_post_hook, clear_call_sites, is_device_error
from core.worker.capture.compile_skip import hide_when_compiling
from core.worker.capture.cuts import CutRecorder
from core.worker.capture.edge_grads import EdgeGradRecorder
from core.worker.capture.grad_norms import GradNorms, script_line as current_line
from core.worker.capture.loop_scalars import LoopScalars
from core.worker.saved_bytes import live_storages
from core.worker.capture.names import NameTable, untraced
from core.worker.capture.numpy_peers import numpy_peers
from core.programs.model_files import loss_terms
from core.programs.program import ProgramError, load_program
from core.worker.capture.script_errors import FailedOp, error_info, failed_op_record, failing_op, format_tb, script_line
from core.worker.capture.node_graph import label_nodes
from core.worker.capture.snapshot import Snapshotter
from core.worker.capture.node_graph import grad_fn_of, gradient_node, number_nodes
from core.model.trace import CallInfo, ErrorInfo, Trace

log = logging.getLogger(__name__)

KEEP_FIRST = 3  # full snapshots kept for the first calls of each repeated structure
DEVICE_ENV = "BACKPROP_STUDIO_DEVICE"


class Capture(CreationTags, CallRecording):
    """One script run with its captured calls. ``run()`` returns the Trace."""

    def __init__(
        self,
        script: str,
        device: str = "cpu",
        mode: str = "auto",
        on_event: Callable[[dict], None] | None = None,
        keep_first: int = KEEP_FIRST,
        call_hook: Callable[..., Any] | None = None,
        load: dict | None = None,
    ):
        self.script = str(Path(script).resolve())
        self.device = device
        self.mode = mode
        self.on_event = on_event or (lambda event: None)
        self.keep_first = keep_first
        self.call_hook = call_hook
        self.script_ended: Callable[[], None] = lambda: None  # called once the script's code has ended
        self.load = load or {}  # how to open the file: weights, trust_pickle, input_shapes
        self.program = None
        self.names = NameTable(self.script)
        self.calls: list[CallInfo] = []
        self.call_count = 0
        self._local = ThreadState()  # calls running on each thread, whether its ops tag nodes
        self._lock = threading.RLock()  # held while a call's graph is read and stored
        self._structures: dict[str, tuple[str, int]] = {}  # hash -> (first call id, count)
        self._pending: int | None = None  # index into calls of the last full repeated call
        self._module_stack: list[int] = []
        self.inplace: dict[int, list[tuple[int, int | None, str]]] = {}
        self.device_error: str | None = None
        self.cuts = CutRecorder()
        self._extra: dict[int, dict] = {}  # call index -> options known before the call ran
        self._grad_before: dict[int, dict[str, str]] = {}  # call index -> named leaves' .grad state before it
        self._nested: dict[int, list[int]] = {}  # call index -> indices of the calls nested in it
        self._running: list[int] = []  # indices of the calls running now, on every thread
        self._edge_grads: dict[int, EdgeGradRecorder] = {}  # call index -> hooks recording edge gradients
        self.phase = "starting"  # the first op of the script emits "forward"
        self.on_node: Callable[[Any], None] | None = None  # each new graph node, as the forward pass makes it
        self.namespace: dict = {}
        self.started = 0.0
        self.hook_call: tuple | None = None  # what ``call_before`` needs while a call_hook runs
        self.nan_check = None  # a core.worker.capture.nan_check.NanCheck when the NaN/Inf check is on
        self.grad_norms = GradNorms(self.names.name_of, current_line(self.names))  # norms, clipping, steps
        self.loop_scalars = LoopScalars(self.names.name_of)  # each call's loss and small leaves (CallInfo.scalars)


    # -- running ---------------------------------------------------------------------------------
    def install(self) -> None:
        hide_when_compiling(type(self))  # torch.compile compiles none of the capture's own frames
        torch.Tensor.backward = lambda t, *a, **k: self._tensor_backward(t, *a, **k)
        torch.autograd.backward = self._autograd_backward
        torch.autograd.grad = self._autograd_grad
        self._hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._pre_forward),
            _register_post_hook(self._post_forward),
        ]
        if self.nan_check is not None:  # beneath the creation mode, which must see the script's frames first
            self.nan_check.enter(self, self._module_stack)
        self._mode = _CreationMode(self)
        self._mode.__enter__()
        self._real_import = builtins.__import__
        builtins.__import__ = self.names.untraced_import(self._real_import)
        self.grad_norms.install()
        sys.settrace(self.names.tracer)

    def uninstall(self) -> None:
        sys.settrace(None)
        builtins.__import__ = self._real_import
        try:
            self._mode.__exit__(None, None, None)
        except Exception:
            log.exception("leaving the creation mode failed")
        if self.nan_check is not None:
            self.nan_check.exit()
        for h in self._hooks:
            h.remove()
        self.grad_norms.remove()
        clear_call_sites()
        torch.Tensor.backward = _ORIG_TENSOR_BACKWARD
        torch.autograd.backward = _ORIG_BACKWARD
        torch.autograd.grad = _ORIG_GRAD

    def live_saved_bytes(self) -> int:
        """Bytes held by saved tensors of every graph the script can still reach."""
        return sum(self.live_saved_storages().values())

    def live_saved_storages(self) -> dict:
        """The storages (key -> bytes) held by saved tensors of every graph the script can still reach,
        with the bytes each list keeps alive (``core.worker.saved_bytes.LiveStorages``)."""
        with torch._C.DisableTorchFunction(), untraced():
            kept: dict = {}
            roots = self.names.graph_roots(self.names.user_frames(sys._getframe(1)), kept)
            return live_storages(roots, kept)

    def run(self) -> Trace:
        self.started = self.started or time.perf_counter()
        error = None
        try:
            self.program = program = load_program(self.script, self.load)
        except ProgramError as exc:
            err = ErrorInfo(type="OpenError", message=str(exc), kind="load", file=self.script, reason=exc.reason)
            return self._trace([], err, "")
        source = program.source
        if program.kind != "script":
            # Tracebacks quote the lines that ran (a notebook's cells, a model's driver), not the file's bytes.
            linecache.cache[self.script] = (len(source), None, source.splitlines(keepends=True), self.script)
        for note in program.notes:
            print(note, file=sys.stderr)
        try:
            code = compile(source, self.script, "exec")
        except SyntaxError as exc:
            err = ErrorInfo(type="SyntaxError", message=exc.msg or str(exc), line=exc.lineno, kind="syntax",
                            traceback="".join(traceback.format_exception_only(type(exc), exc)), file=self.script)
            return self._trace([], err, source)
        module = types.ModuleType("__main__")
        module.__file__ = self.script
        module.__builtins__ = __builtins__
        self.namespace = module.__dict__
        self.namespace.update(program.globals)
        self.names.globals = self.namespace
        saved_main, saved_argv, saved_path0 = sys.modules.get("__main__"), sys.argv, sys.path[:1]
        sys.modules["__main__"] = module
        sys.argv = [self.script]
        sys.path.insert(0, str(Path(self.script).parent))
        os.environ[DEVICE_ENV] = self.device
        self.install()
        failure: FailedOp | None = None  # the torch op the script's error came from
        try:
            try:
                try:
                    exec(code, self.namespace)
                    if program.after_exec is not None:
                        program.after_exec(self.namespace)
                    if self.mode in ("auto", "model"):
                        self._run_model()
                finally:
                    self.script_ended()  # a Stop from now on would only lose the trace
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    error = ErrorInfo(type="SystemExit", message=f"the script called sys.exit({exc.code!r})",
                                      line=script_line(exc, self.names), kind="exit", file=self.script,
                                      traceback=format_tb(exc, self.names))
            except KeyboardInterrupt as exc:
                error = ErrorInfo(type="KeyboardInterrupt", message="the run was cancelled", kind="cancelled",
                                  line=script_line(exc, self.names), file=self.script)
            except BaseException as exc:
                if self.device_error and is_device_error(exc):
                    exc.args = (f"{exc}\n{self.device_error}",) + tuple(exc.args[1:])
                if type(exc).__name__ == "StepperStopped":
                    error = ErrorInfo(type="StepperStopped", message="stepping was stopped before backward finished",
                                      line=script_line(exc, self.names), kind="cancelled", file=self.script)
                else:
                    error = error_info(exc, None, self.names)
                    failure = failing_op(exc, self.names)
        finally:
            self.uninstall()
            sys.modules["__main__"] = saved_main
            sys.argv = saved_argv
            if sys.path[:1] != saved_path0:
                sys.path.pop(0)
        # Unreachable cycles (frames, closures) can still hold tensors the script no longer names;
        # the young generations hold them (the frames of the last calls), a full pass is not needed.
        gc.collect(1)
        # refreshes the name table first; nothing runs between it and the trace
        record = self._capture_unreached(failure, error)
        if record is not None:
            error = replace(error, failed_op=record)
        return self._trace(self.calls, error, source, names_fresh=True)

    def _run_model(self) -> None:
        """A model file: forward ``example_input``, sum the outputs and backward."""
        ns = self.namespace
        if self.call_count or (self.mode == "auto" and not _is_model_file(ns)):
            return
        if self.mode == "model" and not _is_model_file(ns):
            raise ValueError("a model file defines `model` (an nn.Module) and `example_input`, "
                             "or a `build()` that returns both")
        if callable(ns.get("build")) and not isinstance(ns.get("model"), torch.nn.Module):
            model, example_input = ns["build"]()
        else:
            model, example_input = ns["model"], ns["example_input"]
        model = model.to(self.device)
        inputs = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
        inputs = tuple(x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs)
        ns.update(model=model, example_input=inputs[0] if len(inputs) == 1 else inputs)
        self.model_mode = True
        output = model(*inputs)
        sums = [o.sum() for o in loss_terms(output)]
        if not sums:
            raise ValueError("the model's output holds no floating-point tensor to take a loss of")
        loss = sums[0]
        for s in sums[1:]:
            loss = loss + s
        ns.update(output=output, loss=loss)
        loss.backward()

    def _capture_unreached(self, failure: FailedOp | None = None, error: ErrorInfo | None = None) -> dict | None:
        """Graphs left in the namespace that no captured call ran backward through. When the script
        failed in a torch op (``failure``), the graphs of that op's inputs and of the script's frames
        at it join them, and the op's record (``core.model.forward_errors``) is returned."""
        self.names.refresh(failure.frames if failure is not None else [])
        with torch._C.DisableTorchFunction():
            inputs = [(t, gradient_node(t)) for _, t in failure.tensors()] if failure is not None else []
        candidates = [fn for _, fn in inputs if fn is not None]
        for _, t in self.names.named_tensors():
            fn = grad_fn_of(t)
            if fn is not None and "bps_seen" not in _safe_metadata(fn):
                candidates.append(fn)
        ids: dict = {}
        if candidates:
            children = set()
            for node in number_nodes(candidates)[0]:
                for fn, _ in node.next_functions:
                    if fn is not None:
                        children.add(id(fn))
            roots, seen = [], set()
            for fn in candidates:
                if id(fn) not in children and id(fn) not in seen:
                    seen.add(id(fn))
                    roots.append(fn)
            snap = Snapshotter(self.names.name_of, self.names.module_paths, origin=self.cuts.origin)
            nodes, ids, structure = snap.walk(roots)
            for _, t in self.names.named_tensors():
                fn = grad_fn_of(t)
                if fn is not None and id(fn) in ids:
                    snap.tensor_id(t)
            for t, fn in inputs:
                if fn is not None and id(fn) in ids:
                    snap.tensor_id(t)
            tensors = snap.finish_tensors(ids)
            nodes = label_nodes(nodes, tensors)
            index = self.call_count
            self.calls.append(CallInfo(
                id=f"c{index}", index=index, api="unreached", line=None, roots=[ids[id(r)] for r in roots],
                nodes=nodes, tensors=tensors, storages=snap.finish_storages(tensors), structure=structure,
                node_count=len(nodes), edge_count=sum(1 for n in nodes for e in n.next if e is not None),
            ))
        if failure is None or error is None:
            return None
        nodes_of = {t._cdata: ids.get(id(fn)) for t, fn in inputs if fn is not None}
        record = failed_op_record(failure, self.names.name_of, lambda t: nodes_of.get(t._cdata))
        where = self.program.where(failure.line) if self.program is not None and self.program.cells else ""
        if where:
            record["where"] = where
        if not ids:
            return {**record, "call": None}
        call = self.calls[-1]
        call.options["failed_op"] = {**record, "type": error.type, "message": error.message}
        return {**record, "call": call.id}

    def _named_tensor_snapshot(self):
        snap = Snapshotter(self.names.name_of, self.names.module_paths, origin=self.cuts.origin)
        for _, t in self.names.named_tensors(bound_only=True):
            snap.tensor_id(t)
        tensors = snap.finish_tensors(None)
        return tensors, numpy_peers(self.namespace, snap.storages, snap.finish_storages(tensors))

    def _trace(self, calls, error, source, names_fresh: bool = False) -> Trace:
        """The run's Trace; ``names_fresh``: the name table was just rebuilt after the script
        ended (a second walk of a big model's modules costs 0.3 s at 16,667 modules)."""
        cells = self.program.cells if self.program is not None else []
        if error is not None and cells:
            error = replace(error, where=self.program.where(error.line),
                            traceback=self.program.map_traceback(error.traceback, self.script))
        tensors, storages = ([], [])
        if self.namespace:
            if not names_fresh:
                self.names.refresh([])
            tensors, storages = self._named_tensor_snapshot()
            self.names.release()
        return Trace(
            calls=list(calls),
            error=error,
            script=self.script,
            source=source,
            device=self.device,
            mode="model" if getattr(self, "model_mode", False) else "script",
            duration_s=time.perf_counter() - self.started,
            torch_version=torch.__version__,
            call_count=self.call_count,
            tensors=tensors,
            storages=storages,
            cells=cells,
            grad_events=list(self.grad_norms.events),
            nan_check=self.nan_check.record() if self.nan_check is not None else None,
        )


def capture_script(path: str, device: str = "cpu", mode: str = "auto", on_event=None, **kwargs) -> Trace:
    """Run ``path`` in this process and return its Trace (the worker calls this)."""
    return Capture(path, device=device, mode=mode, on_event=on_event, **kwargs).run()


# -- helpers ----------------------------------------------------------------------------------------


def _is_model_file(ns: dict) -> bool:
    if callable(ns.get("build")) and not isinstance(ns.get("build"), type):
        return True
    return isinstance(ns.get("model"), torch.nn.Module) and "example_input" in ns


def _safe_metadata(node) -> dict:
    try:
        return node.metadata
    except Exception:
        return {}


