"""Run a user's script and capture every autograd graph it builds (worker side, imports torch).

``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad`` are wrapped
while the script runs. Each call is snapshotted *before* the real call (the engine frees
saved tensors as it goes) and completed after it (leaf ``.grad``, retained grads, results,
the error if it raised). A TorchFunctionMode writes the script line and the current
``nn.Module`` into each new node's ``metadata``; graphs never backwarded are captured from
the script's namespace when it ends. Calls in a loop whose graph has the same structure as
an earlier call keep a summary only, except the first few and the last.
"""

from __future__ import annotations

import builtins
import gc
import inspect
import linecache
import logging
import os
import sys
import time
import tokenize
import traceback
import types
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from core.cuts import CutRecorder
from core.edge_grads import LIMIT as EDGE_GRAD_LIMIT
from core.edge_grads import EdgeGradRecorder
from core.memory import saved_storages, saved_tensor_bytes
from core.names import OP_FRAME, NameTable
from core.nesting import (
    grad_states, inside_gradcheck, inside_reentrant_checkpoint, nested_options, saved_by_checkpoint,
)
from core.numpy_peers import numpy_peers
from core.programs import ProgramError, load_program
from core.snapshot import Snapshotter, grad_fn_of, label_nodes, number_nodes, values_of
from core.snapshot import root_nodes as shared_root_nodes
from core.trace import CallInfo, ErrorInfo, Trace, paused_gc

log = logging.getLogger(__name__)

KEEP_FIRST = 3  # full snapshots kept for the first calls of each repeated structure
DEVICE_ENV = "BACKPROP_STUDIO_DEVICE"

_ORIG_TENSOR_BACKWARD = torch.Tensor.backward
_ORIG_BACKWARD = torch.autograd.backward
_ORIG_GRAD = torch.autograd.grad


class _CreationMode(TorchFunctionMode):
    """Tags each new grad_fn with the script line and module that created it."""

    def __init__(self, capture: "Capture"):
        super().__init__()
        self.capture = capture

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        try:
            out = _call_at(sys._getframe(1))(func, args, kwargs or {})
        except RuntimeError as exc:
            if self.capture.tagging and _is_device_error(exc):
                self.capture.note_device_error(func, args, kwargs or {})
            raise
        cap = self.capture
        if cap.tagging:
            name = getattr(func, "__name__", "")
            if args and isinstance(args[0], torch.Tensor) and (
                (name.endswith("_") and not name.endswith("__")) or name == "__setitem__"
            ):
                cap.record_inplace(args[0], name)
            if isinstance(out, torch.Tensor):
                cap.tag(out, args, name)
            elif isinstance(out, (tuple, list)):
                for o in out:
                    if isinstance(o, torch.Tensor):
                        cap.tag(o, args, name)
        return out


# A warning raised inside an op (PyTorch's C++ warns at stack level 1) is reported at the
# innermost Python frame, which under the mode would be ``__torch_function__``. So the op is
# called from a one-line function whose code claims the caller's file and line and whose
# globals are the caller's: the warning then names the script's line, lands in the script's
# ``__warningregistry__`` and is shown once per line, exactly as under plain ``python``.
_OP_CODE = next(c for c in compile("def _(f, a, k): return f(*a, **k)", "<op>", "exec").co_consts
                if isinstance(c, types.CodeType)).replace(co_name=OP_FRAME)
_HANDLE_CODE = torch.overrides.handle_torch_function.__code__
_call_sites: dict[tuple, Callable] = {}


def _call_at(frame) -> Callable:
    """A caller of ops that warnings attribute to ``frame``'s file and line."""
    if frame.f_code is _HANDLE_CODE:  # a Python-level torch function: attribute to its caller
        frame = frame.f_back
    code, line = frame.f_code, frame.f_lineno
    fn = _call_sites.get((code, line))
    if fn is None:
        fn = types.FunctionType(_OP_CODE.replace(co_filename=code.co_filename, co_firstlineno=line or 1),
                                frame.f_globals)
        _call_sites[(code, line)] = fn
    return fn


class Capture:
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
        self.load = load or {}  # how to open the file: weights, trust_pickle, input_shapes
        self.program = None
        self.names = NameTable(self.script)
        self.calls: list[CallInfo] = []
        self.call_count = 0
        self.tagging = True
        self._depth = 0
        self._structures: dict[str, tuple[str, int]] = {}  # hash -> (first call id, count)
        self._pending: int | None = None  # index into calls of the last full repeated call
        self._module_stack: list[int] = []
        self.inplace: dict[int, list[tuple[int, int | None, str]]] = {}
        self.device_error: str | None = None
        self.cuts = CutRecorder()
        self._seed = None  # gradient / grad_tensors / grad_outputs of the call being recorded
        self._extra: dict[int, dict] = {}  # call index -> options known before the call ran
        self._grad_before: dict[int, dict[str, str]] = {}  # call index -> named leaves' .grad state before it
        self._nested: dict[int, list[int]] = {}  # call index -> indices of the calls nested in it
        self._running: list[int] = []  # indices of the calls running now (nested: reentrant checkpointing)
        self._edge_grads: dict[int, EdgeGradRecorder] = {}  # call index -> hooks recording edge gradients
        self.phase = "starting"  # the first op of the script emits "forward"
        self.on_node: Callable[[Any], None] | None = None  # each new graph node, as the forward pass makes it
        self.namespace: dict = {}
        self.started = 0.0
        self.hook_call: tuple | None = None  # what ``call_before`` needs while a call_hook runs

    # -- creation tagging -------------------------------------------------------------------
    def tag(self, t: torch.Tensor, args=(), op: str = "") -> None:
        fn = grad_fn_of(t)
        if fn is None:
            self.cuts.note_free(t, op, args)
            return
        md = fn.metadata
        if "bps_line" not in md:
            self.cuts.note_inputs(md, args)
            if saved_by_checkpoint():
                md["bps_recomputed"] = True
            if self.phase != "forward":
                # The first node after a backward: the script builds its next graph.
                self.phase = "forward"
                self.on_event({"type": "forward", "t": time.perf_counter() - self.started})
            md["bps_line"] = self.names.user_line(sys._getframe(2))
            if self._module_stack:
                md["bps_module"] = self._module_stack[-1]
            # The storages this op read and wrote: an in-place change to one of them later
            # is what makes a saved tensor of this node stale.
            md["bps_storages"] = tuple(_storage_ptr(a) for a in (*args, t) if isinstance(a, torch.Tensor))
            md["bps_device"] = str(t.device)
            if self.on_node is not None:
                self.on_node(fn)

    def record_inplace(self, t: torch.Tensor, op: str) -> None:
        """Remember each in-place op (version after it, line, name) per storage."""
        ptr = _storage_ptr(t)
        if ptr:
            self.inplace.setdefault(ptr, []).append((t._version, self.names.user_line(sys._getframe(2)), op))
        fn = grad_fn_of(t)
        if fn is not None:
            fn.metadata.setdefault("bps_inplace", op)

    def note_device_error(self, func, args, kwargs) -> None:
        """Which op and which tensors a device mismatch involved, by their script names."""
        frames = self.names.user_frames(sys._getframe(2))
        self.names.refresh(frames)
        try:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            parts = []
            for i, t in enumerate(tensors):
                name = self.names.name_of(t) or f"argument {i}"
                parts.append(f"{name} is on {t.device} (shape {list(t.shape)})")
            op = getattr(func, "__name__", str(func))
            line = self.names.user_line(sys._getframe(2))
            self.device_error = f"In {op}() at line {line}: " + "; ".join(parts) + "."
        finally:
            self.names.release()

    def _pre_forward(self, module, args):
        self._module_stack.append(id(module))

    def _post_forward(self, module, args, output):
        if self._module_stack and self._module_stack[-1] == id(module):
            self._module_stack.pop()

    # -- wrapped entry points -----------------------------------------------------------------
    def _tensor_backward(self, tensor, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        def real():
            return _ORIG_TENSOR_BACKWARD(tensor, gradient, retain_graph, create_graph, inputs=inputs)

        if self._depth:
            return real()
        self._seed = gradient
        return self._record("Tensor.backward", [tensor], real, retain_graph, create_graph, inputs)

    def _autograd_backward(self, *args, **kwargs):
        def real():
            return _ORIG_BACKWARD(*args, **kwargs)

        if self._depth and not inside_reentrant_checkpoint(sys._getframe(1)):
            return real()
        bound = _bind(_ORIG_BACKWARD, args, kwargs)
        self._seed = bound.get("grad_tensors")
        return self._record(
            "autograd.backward",
            _as_list(bound.get("tensors")),
            real,
            bound.get("retain_graph"),
            bound.get("create_graph", False),
            bound.get("inputs"),
        )

    def _autograd_grad(self, *args, **kwargs):
        def real():
            return _ORIG_GRAD(*args, **kwargs)

        if self._depth:
            return real()
        bound = _bind(_ORIG_GRAD, args, kwargs)
        self._seed = bound.get("grad_outputs")
        return self._record(
            "autograd.grad",
            _as_list(bound.get("outputs")),
            real,
            bound.get("retain_graph"),
            bound.get("create_graph", False),
            bound.get("inputs"),
        )

    # -- one captured call ---------------------------------------------------------------------
    def _record(self, api, roots, real, retain_graph, create_graph, inputs):
        index = self.call_count
        self.call_count += 1
        line = self.names.user_line(sys._getframe(2))
        # A backward run by reentrant checkpointing inside another call's backward: captured as
        # its own call, marked as nested in the running one (core.nesting).
        outer = self._running[-1] if self._running else None
        seed, self._seed = self._seed, None  # the gradient argument backward starts from (None: ones)
        within = inside_gradcheck(sys._getframe(2))
        self._running.append(index)
        self._depth += 1
        was_tagging, self.tagging = self.tagging, False
        t0 = time.perf_counter()
        # Options known before the call, merged in by _after (a stored call is streamed at once).
        extra: dict = {}
        if within is not None:
            extra["within"] = within
        with torch._C.DisableTorchFunction():
            seeds = [{k: v for k, v in values_of(g, full_limit=16).__dict__.items()
                      if v is not None and not (k == "approx" and v is False)}
                     if isinstance(g, torch.Tensor) else None for g in _as_list(seed)]
        if any(v is not None for v in seeds):
            extra["seed"] = seeds
        if outer is not None:
            extra.update(nested_options(outer))
            self._nested.setdefault(outer, []).append(index)
        self._extra[index] = extra
        try:
            with torch._C.DisableTorchFunction(), paused_gc():
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
                error = _error_info(exc, line, self.names)
                raise
            finally:
                with torch._C.DisableTorchFunction(), paused_gc():
                    self._after(api, index, line, snap, nodes, ids, structure, root_ids, input_ids, result,
                            error, retain_graph, create_graph, t0)
            return result
        finally:
            if outer is None:
                self.names.release()
            self.tagging = was_tagging
            self._running.pop()
            self._depth -= 1

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
        input_ids = [snap.tensor_id(t) for t in _as_list(inputs) if isinstance(t, torch.Tensor)]
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
        # Previews are taken now, and every reference backward would otherwise free is dropped:
        # the snapshot must not hold activations (device memory) the script does not hold.
        snap.release(ids)
        if self.call_hook is None:
            self.names.release()
        return snap, nodes, ids, structure, roots_ids, input_ids

    def call_before(self) -> CallInfo:
        """The call a ``call_hook`` is running, as captured before backward (no grads read yet)."""
        api, index, line, snap, nodes, ids, structure, root_ids = self.hook_call
        with torch._C.DisableTorchFunction(), paused_gc():
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
        )
        self._store(call)
        self.phase = "between"
        self.on_event({"type": "call_done", "index": index, "error": error is not None,
                       "t": time.perf_counter() - self.started})

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

    # -- running ---------------------------------------------------------------------------------
    def install(self) -> None:
        torch.Tensor.backward = lambda t, *a, **k: self._tensor_backward(t, *a, **k)
        torch.autograd.backward = self._autograd_backward
        torch.autograd.grad = self._autograd_grad
        self._hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._pre_forward),
            _register_post_hook(self._post_forward),
        ]
        self._mode = _CreationMode(self)
        self._mode.__enter__()
        self._real_import = builtins.__import__
        builtins.__import__ = self.names.untraced_import(self._real_import)
        sys.settrace(self.names.tracer)

    def uninstall(self) -> None:
        sys.settrace(None)
        builtins.__import__ = self._real_import
        try:
            self._mode.__exit__(None, None, None)
        except Exception:
            log.exception("leaving the creation mode failed")
        for h in self._hooks:
            h.remove()
        _call_sites.clear()  # its functions hold the script's globals, and with them its tensors
        torch.Tensor.backward = _ORIG_TENSOR_BACKWARD
        torch.autograd.backward = _ORIG_BACKWARD
        torch.autograd.grad = _ORIG_GRAD

    def live_saved_bytes(self) -> int:
        """Bytes held by saved tensors of every graph the script can still reach."""
        return sum(self.live_saved_storages().values())

    def live_saved_storages(self) -> dict:
        """The storages (key -> bytes) held by saved tensors of every graph the script can still reach."""
        with torch._C.DisableTorchFunction():
            roots = self.names.graph_roots(self.names.user_frames(sys._getframe(1)))
            return saved_storages(roots)

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
        try:
            try:
                exec(code, self.namespace)
                if program.after_exec is not None:
                    program.after_exec(self.namespace)
                if self.mode in ("auto", "model"):
                    self._run_model()
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    error = ErrorInfo(type="SystemExit", message=f"the script called sys.exit({exc.code!r})",
                                      line=_script_line(exc, self.names), kind="exit", file=self.script,
                                      traceback=_format_tb(exc, self.names))
            except KeyboardInterrupt as exc:
                error = ErrorInfo(type="KeyboardInterrupt", message="the run was cancelled", kind="cancelled",
                                  line=_script_line(exc, self.names), file=self.script)
            except BaseException as exc:
                if self.device_error and _is_device_error(exc):
                    exc.args = (f"{exc}\n{self.device_error}",) + tuple(exc.args[1:])
                if type(exc).__name__ == "StepperStopped":
                    error = ErrorInfo(type="StepperStopped", message="stepping was stopped before backward finished",
                                      line=_script_line(exc, self.names), kind="cancelled", file=self.script)
                else:
                    error = _error_info(exc, None, self.names)
        finally:
            self.uninstall()
            sys.modules["__main__"] = saved_main
            sys.argv = saved_argv
            if sys.path[:1] != saved_path0:
                sys.path.pop(0)
        # Unreachable cycles (frames, closures) can still hold tensors the script no longer names;
        # the young generations hold them (the frames of the last calls), a full pass is not needed.
        gc.collect(1)
        self._capture_unreached()
        return self._trace(self.calls, error, source)

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
        outs = output if isinstance(output, (tuple, list)) else (output,)
        sums = [o.sum() for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]
        if not sums:
            raise ValueError("the model's output holds no floating-point tensor to take a loss of")
        loss = sums[0]
        for s in sums[1:]:
            loss = loss + s
        ns.update(output=output, loss=loss)
        loss.backward()

    def _capture_unreached(self) -> None:
        """Graphs left in the namespace that no captured call ran backward through."""
        self.names.refresh([])
        candidates = []
        for _, t in self.names.named_tensors():
            fn = grad_fn_of(t)
            if fn is not None and "bps_seen" not in _safe_metadata(fn):
                candidates.append(fn)
        if not candidates:
            return
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
        tensors = snap.finish_tensors(ids)
        nodes = label_nodes(nodes, tensors)
        index = self.call_count
        self.calls.append(CallInfo(
            id=f"c{index}", index=index, api="unreached", line=None, roots=[ids[id(r)] for r in roots],
            nodes=nodes, tensors=tensors, storages=snap.finish_storages(tensors), structure=structure,
            node_count=len(nodes), edge_count=sum(1 for n in nodes for e in n.next if e is not None),
        ))

    def _named_tensor_snapshot(self):
        snap = Snapshotter(self.names.name_of, self.names.module_paths, origin=self.cuts.origin)
        for _, t in self.names.named_tensors(bound_only=True):
            snap.tensor_id(t)
        tensors = snap.finish_tensors(None)
        return tensors, numpy_peers(self.namespace, snap.storages, snap.finish_storages(tensors))

    def _trace(self, calls, error, source) -> Trace:
        cells = self.program.cells if self.program is not None else []
        if error is not None and cells:
            error = replace(error, where=self.program.where(error.line),
                            traceback=self.program.map_traceback(error.traceback, self.script))
        tensors, storages = ([], [])
        if self.namespace:
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
        )


def summary_of(call: CallInfo) -> CallInfo:
    """Drop a repeated call's graph, keeping its counts, grads, line and error."""
    return replace(call, nodes=[], tensors=[], storages=[], roots=[], snapshot="summary", edge_grads={})


def capture_script(path: str, device: str = "cpu", mode: str = "auto", on_event=None, **kwargs) -> Trace:
    """Run ``path`` in this process and return its Trace (the worker calls this)."""
    return Capture(path, device=device, mode=mode, on_event=on_event, **kwargs).run()


# -- helpers ----------------------------------------------------------------------------------------


def _is_device_error(exc: BaseException) -> bool:
    text = str(exc)
    return "same device" in text or "on the expected device" in text


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return 0


def _is_model_file(ns: dict) -> bool:
    if callable(ns.get("build")) and not isinstance(ns.get("build"), type):
        return True
    return isinstance(ns.get("model"), torch.nn.Module) and "example_input" in ns


def _register_post_hook(fn):
    try:
        return torch.nn.modules.module.register_module_forward_hook(fn, always_call=True)
    except TypeError:
        return torch.nn.modules.module.register_module_forward_hook(fn)


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


def _script_line(exc: BaseException, names: NameTable) -> int | None:
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if names.is_user_file(frame.f_code.co_filename) and frame.f_code.co_filename == names.script_path:
            line = lineno
    return line


def _format_tb(exc: BaseException, names: NameTable) -> str:
    """The traceback from the script's first frame on, without the capture's own frames."""
    tb = exc.__traceback__
    while tb is not None and not names.is_user_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    here = str(Path(__file__).resolve())
    # Each frame is one chunk (its "File" line with its source lines); the exception's own
    # message is the last chunk and is always kept.
    return "".join(chunk for chunk in lines
                   if not (chunk.lstrip().startswith(f'File "{here}"') or f", in {OP_FRAME}\n" in chunk))


def _error_info(exc: BaseException, line: int | None, names: NameTable) -> ErrorInfo:
    kind = "syntax" if isinstance(exc, SyntaxError) else "exception"
    if isinstance(exc, torch.OutOfMemoryError) or "CUDA error" in str(exc) or "CUDA out of memory" in str(exc):
        kind = "device"
    return ErrorInfo(
        type=type(exc).__name__,
        message=str(exc),
        line=_script_line(exc, names) or line,
        traceback=_format_tb(exc, names),
        kind=kind,
        file=names.script_path,
    )


def module_classes(nodes, classes: dict[str, str]) -> dict[str, str]:
    """Class names of the modules the call's nodes were made in, and of the modules around them."""
    paths = set()
    for n in nodes:
        if n.module and n.module not in paths:
            parts = n.module.split(".")
            paths.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {p: classes[p] for p in sorted(paths) if p in classes}
