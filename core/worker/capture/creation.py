"""Tagging each new autograd node as the script makes it (worker side, imports torch).

A TorchFunctionMode sees every torch call of the script: it writes the script line, the
current ``nn.Module``, the device and the storages the op touched into each new node's
``metadata``, notes why inputs carry no gradient (``core.worker.capture.cuts``), remembers in-place ops
per storage (to name the op that made a saved tensor stale) and, when an op fails on a
device mismatch, which of the script's tensors were on which device. Module forward
pre/post hooks keep the stack of modules running. The graph itself is read later, once per
backward call (``core.worker.capture.call_record``).
"""

from __future__ import annotations

import sys
import time
import types
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from core.worker.capture.compile_skip import hide_code, register_codes
from core.worker.capture.names import OP_FRAME
from core.worker.capture.nesting import saved_by_checkpoint
from core.worker.capture.node_graph import grad_fn_of, shape_of, version_of
from core.worker.capture.retained import note_retained
from core.worker.capture.values import own_ops


class _CreationMode(TorchFunctionMode):
    """Tags each new grad_fn with the script line and module that created it."""

    def __init__(self, capture: "CreationTags"):
        super().__init__()
        self.capture = capture

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        if _compiling():
            # torch.compile traces this mode into its graph: it must see the op alone, as it would
            # without the capture (no frame reads, no settrace, no graph breaks), and AOTAutograd's
            # fake and functional tensors are not the script's to tag.
            return func(*args, **(kwargs or {}))
        # Under the name tracer (``sys.settrace``) every Python call made here costs a call of
        # the tracer too, so the common path is inline: a hit in two caches, the op, and for an
        # output that needs no gradient a check that needs no call.
        caller = sys._getframe(1)
        site = caller.f_back if caller.f_code is _HANDLE_CODE else caller
        call = _call_sites.get((site.f_code, site.f_lineno)) or _call_at(site)
        if self.capture.before_op is not None:  # a debug run pauses before an in-place op that breaks backward
            self.capture.before_op(func, args, site)
        try:
            out = call(func, args, kwargs or {})
        except RuntimeError as exc:
            if self.capture.tagging and is_device_error(exc):
                self.capture.note_device_error(func, args, kwargs or {})
            raise
        cap = self.capture
        if not cap.tagging:
            return out
        try:
            kind = _op_kinds.get(func) or _op_kind(func)
        except TypeError:  # an unhashable callable
            kind = _op_kind(func)
        if isinstance(out, torch.Tensor):
            if not out.requires_grad and not kind[1]:
                # Nothing to tag; only a cut-off tensor's origin is noted (detach, no_grad, or made
                # from a tensor that was).
                if kind[0] == "detach" or cap.cuts.origins or not torch.is_grad_enabled():
                    cap.cuts.note_free(out, kind[0], args)
                return out
        elif not kind[1]:
            if not isinstance(out, (tuple, list)) or isinstance(out, torch.Size):
                if kind[0] == "item":  # a number out of the graph: a cut stub names it by this call
                    cap.cuts.note_item(out, site, cap.names.is_user_file)
                elif kind[0] == "retain_grad" and args:  # its .grad is kept even if it has no name
                    note_retained(args[0])
                return out
            for o in out:
                if isinstance(o, torch.Tensor):
                    break
            else:
                return out
        # Tagging makes several calls: the tracer is off meanwhile (two settrace calls cost less).
        tracer = sys.gettrace()
        if tracer is not None:
            sys.settrace(None)
        try:
            if _dispatch_modes():  # the script's TorchDispatchMode sees none of the tagging's ops
                with own_ops():
                    self._tag_all(cap, out, args, kind, caller)
            else:
                self._tag_all(cap, out, args, kind, caller)
        finally:
            if tracer is not None:
                sys.settrace(tracer)
        return out

    @staticmethod
    def _tag_all(cap, out, args, kind, caller) -> None:
        name, inplace = kind
        if inplace and args and isinstance(args[0], torch.Tensor):
            cap.record_inplace(args[0], name, caller)
        if isinstance(out, torch.Tensor):
            cap.tag(out, args, name, caller)
        elif isinstance(out, (tuple, list)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    cap.tag(o, args, name, caller)


_op_kinds: dict = {}  # torch function -> (its name, whether it works in place)


def _op_kind(func) -> tuple[str, bool]:
    """(name, whether it works in place) of a torch function, cached."""
    name = getattr(func, "__name__", "")
    kind = (name, (name.endswith("_") and not name.endswith("__")) or name == "__setitem__")
    try:
        _op_kinds[func] = kind
    except TypeError:
        pass
    return kind


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
    """A caller of ops that warnings attribute to ``frame``'s file and line (for a Python-level
    torch function, ``frame`` is its caller, not ``handle_torch_function``)."""
    code, line = frame.f_code, frame.f_lineno
    fn = _call_sites.get((code, line))
    if fn is None:
        site = _OP_CODE.replace(co_filename=code.co_filename, co_firstlineno=line or 1)
        hide_code(site)  # a compiled region's eager ops run through it: not a graph of its own
        fn = types.FunctionType(site, frame.f_globals)
        _call_sites[(code, line)] = fn
    return fn


register_codes(lambda: [fn.__code__ for fn in list(_call_sites.values())])


def clear_call_sites() -> None:
    """Forget the call-site functions: they hold the script's globals, and with them its tensors."""
    _call_sites.clear()


class CreationTags:
    """The per-op half of a capture (mixed into ``core.worker.capture.recorder.Capture``)."""

    # Called with (func, args, calling frame) before each op of the script, where set
    # (``core.worker.forward_pause``: pause on autograd errors).
    before_op: Callable | None = None

    def tag(self, t: torch.Tensor, args=(), op: str = "", caller=None) -> None:
        """Tag the node that made ``t`` (once: a node is tagged by the op that created it).
        ``caller`` is the frame that called the op (the script line is found from it)."""
        fn = grad_fn_of(t) if t.requires_grad else None
        if fn is None:
            self.cuts.note_free(t, op, args)
            return
        md = fn.metadata
        if "bps_line" in md:
            return
        # Why inputs carry no gradient matters only where the node has a None input.
        for f, _ in fn.next_functions:
            if f is None:
                self.cuts.note_inputs(md, args)
                break
        if saved_by_checkpoint():
            md["bps_recomputed"] = True
        if self.phase != "forward":
            # The first node after a backward: the script builds its next graph.
            self.phase = "forward"
            self.on_event({"type": "forward", "t": time.perf_counter() - self.started})
        md["bps_line"] = self.names.user_line(caller or sys._getframe(2))
        md["bps_created"] = time.perf_counter() - self.started  # the memory samples' clock: the replay's cursor
        if self._module_stack:
            md["bps_module"] = self._module_stack[-1]
        # The storages this op read and wrote: an in-place change to one of them later
        # is what makes a saved tensor of this node stale.
        md["bps_storages"] = _storage_ptrs(args, t)
        device = t.device
        name = _device_names.get(device)
        if name is None:
            name = _device_names[device] = str(device)
        md["bps_device"] = name
        if self.on_node is not None:
            self.on_node(fn)

    def record_inplace(self, t: torch.Tensor, op: str, caller=None) -> None:
        """Remember each in-place op (version after it, line, name) per storage."""
        ptr = _storage_ptr(t)
        if ptr:
            line = self.names.user_line(caller or sys._getframe(2))
            self.inplace.setdefault(ptr, []).append((version_of(t), line, op))
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
                parts.append(f"{name} is on {t.device} (shape {shape_of(t)})")
            op = getattr(func, "__name__", str(func))
            line = self.names.user_line(sys._getframe(2))
            self.device_error = f"In {op}() at line {line}: " + "; ".join(parts) + "."
        finally:
            self.names.release()

    def _pre_forward(self, module, args):
        if not _compiling():  # a compiled module's graph holds no hooks of the capture's
            self._module_stack.append(id(module))

    def _post_forward(self, module, args, output):
        if not _compiling() and self._module_stack and self._module_stack[-1] == id(module):
            self._module_stack.pop()


# torch.compile folds this to True in what it traces (and holds it True while AOTAutograd traces).
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
_dispatch_modes = torch._C._len_torch_dispatch_stack


def is_device_error(exc: BaseException) -> bool:
    text = safe_str(exc)
    return "same device" in text or "on the expected device" in text


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, or what it raised: an exception of the script's may define ``__str__``."""
    try:
        return str(exc)
    except Exception as err:
        return f"<str() raised {type(err).__name__}>"


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:
        return 0


def _register_post_hook(fn):
    try:
        return torch.nn.modules.module.register_module_forward_hook(fn, always_call=True)
    except TypeError:
        return torch.nn.modules.module.register_module_forward_hook(fn)


_device_names: dict = {}  # torch.device -> its name (str() of a device costs a microsecond)


def _storage_ptrs(args, out: torch.Tensor) -> tuple[int, ...]:
    """Storage addresses of the op's tensor arguments and its output (0 where there is none)."""
    try:
        ptrs = [a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)]
        ptrs.append(out.untyped_storage().data_ptr())
        return tuple(ptrs)
    except Exception:  # sparse, nested and other storage-less tensors: one at a time
        return tuple(_storage_ptr(a) for a in (*args, out) if isinstance(a, torch.Tensor))
