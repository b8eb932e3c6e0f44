"""Script variable names for tensors, found in the user's frames, globals and modules.

A module's parameters are named by their path in it (``fc1.weight``), after the variable that holds
the module (``model.fc1.weight``) unless a script holds one module only; a notebook always names the
variable. Names are keyed by the tensor's C++ impl pointer (``Tensor._cdata``): a saved input
unpacks as a new Python object over the same impl, so it still finds its name. Locals of
functions that already returned are remembered by a ``sys.settrace`` hook limited to the
user's files (line events are switched off, so it costs one call per user frame).
"""

from __future__ import annotations

import sys
import weakref
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import torch
from torch.autograd.graph import Node

from core.worker.capture.compile_skip import on_import
from core.worker.capture.node_graph import grad_fn_of
from core.worker.capture.values import own_ops

MAX_LIST_ITEMS = 64
OP_FRAME = "<op>"  # name of the capture's call frames that carry the script's file and line


@contextmanager
def untraced():
    """The capture's own work (a graph snapshot: tens of thousands of Python calls) runs without the
    name tracer, which would otherwise be called for each of its frames, and with the script's
    dispatch modes set aside (``core.worker.capture.values.own_ops``): its ops are not the script's."""
    tracer = sys.gettrace()
    with own_ops():
        if tracer is None:
            yield
            return
        sys.settrace(None)
        try:
            yield
        finally:
            sys.settrace(tracer)


def is_notebook(path: str) -> bool:
    """A notebook run as a script (``.ipynb``), or a cell of a running Jupyter kernel."""
    name = str(path)
    return name.lower().endswith(".ipynb") or "ipykernel_" in name or name.startswith("<ipython-input-")


class NameTable:
    def __init__(self, script_path: str):
        self.script_path = str(Path(script_path).resolve())
        self.script_dir = str(Path(script_path).resolve().parent)
        self.globals: dict = {}
        self.remembered: dict[int, tuple[weakref.ref, str]] = {}
        self._names: dict[int, str] = {}
        self._tensors: list[tuple[str, torch.Tensor]] = []
        self._bound = 0
        self.module_paths: dict[int, str] = {}
        self.module_classes: dict[str, str] = {}  # module path -> class name (folded boxes show it)
        self._user_files: dict[str, bool] = {}
        # A notebook names every module's parameters through its variable (model.2.weight): its
        # namespace outlives any one model, and the variable is how its cells refer to the model.
        self.notebook = is_notebook(script_path)
        # frame -> its local tracer with line events on, or None: set while a debug run may pause on a line
        self.line_tracer = None

    # -- which frames are the user's ------------------------------------------------------
    def is_user_file(self, filename: str) -> bool:
        known = self._user_files.get(filename)
        if known is None:
            known = filename == self.script_path
            if not known and not filename.startswith("<"):
                try:
                    resolved = str(Path(filename).resolve())
                except OSError:
                    resolved = filename
                known = resolved == self.script_path or (
                    resolved.startswith(self.script_dir + "/")
                    and "site-packages" not in resolved
                    and Path(resolved).parent == Path(self.script_dir)
                )
            self._user_files[filename] = known
        return known

    def user_frames(self, start: FrameType | None = None) -> list[FrameType]:
        frames = []
        f = start or sys._getframe(1)
        while f is not None:
            if self.is_user_file(f.f_code.co_filename) and f.f_code.co_name != OP_FRAME:
                frames.append(f)
            f = f.f_back
        return frames

    def user_line(self, start: FrameType | None = None) -> int | None:
        f = start or sys._getframe(1)
        while f is not None:
            if self.is_user_file(f.f_code.co_filename):
                return f.f_lineno
            f = f.f_back
        return None

    # -- settrace: remember locals of returning user functions -----------------------------
    def tracer(self, frame, event, arg):
        # Called for every new frame of the script and of every library it runs: the known files
        # are looked up inline (a method call here would double the cost of each frame).
        code = frame.f_code
        user = self._user_files.get(code.co_filename)
        if user is None:
            user = self.is_user_file(code.co_filename)
        if user and event == "call":
            if self.line_tracer is not None:  # a debug run's breakpoints and steps (core.worker.forward_pause)
                local = self.line_tracer(frame)
                if local is not None:
                    return local
            # Comprehensions and generator expressions (<genexpr>, <listcomp>) hold loop variables only.
            if not code.co_name.startswith("<"):
                frame.f_trace_lines = False
                return self._local_tracer
        return None

    def untraced_import(self, real_import):
        """``builtins.__import__`` that switches the tracer off while a module loads.

        The tracer is a Python call on every new frame; importing a big library (transformers
        runs tens of thousands of frames while it loads) would cost seconds under it, and
        module-level code leaves no function locals to remember."""
        tracer = self.tracer

        def __import__(name, globals=None, locals=None, fromlist=(), level=0):
            if sys.gettrace() != tracer:
                module = real_import(name, globals, locals, fromlist, level)
            else:
                sys.settrace(None)
                try:
                    module = real_import(name, globals, locals, fromlist, level)
                finally:
                    sys.settrace(tracer)
            on_import()  # torch.compile's Dynamo, once loaded, is told to leave the capture's frames alone
            return module

        return __import__

    def _local_tracer(self, frame, event, arg):
        if event == "return":
            for name, value in frame.f_locals.items():
                # type(), not isinstance(): an object's own __getattribute__ (which isinstance may
                # call for __class__) is the script's code and may raise.
                if issubclass(type(value), torch.Tensor) and name != "self" and not name.startswith("__"):
                    try:
                        self.remembered[value._cdata] = (weakref.ref(value), name)
                    except Exception:
                        pass
        return self._local_tracer

    # -- building the table ----------------------------------------------------------------
    def refresh(self, frames: list[FrameType] | None = None) -> None:
        """Rebuild the name table from live frames (innermost first), globals and memory."""
        # Drop the previous table first: its strong references would keep every remembered
        # local alive into this refresh, and so on, leaking one tensor per call.
        self.release()
        names: dict[int, str] = {}
        tensors: list[tuple[str, torch.Tensor]] = []
        modules: list[tuple[str, torch.nn.Module]] = []

        def add(name: str, value) -> None:
            # Types are read with type(): the script's objects may define __getattribute__ (or
            # __class__, __len__, __iter__) to do anything, raising included.
            cls = type(value)
            if issubclass(cls, torch.Tensor):
                key = value._cdata
                if key not in names:
                    names[key] = name
                    tensors.append((name, value))
            elif issubclass(cls, torch.nn.Module):
                if all(m is not value for _, m in modules):
                    modules.append((name, value))
            elif issubclass(cls, (list, tuple)) and 0 < len(value) <= MAX_LIST_ITEMS:
                for i, item in enumerate(value):
                    if issubclass(type(item), torch.Tensor):
                        add(f"{name}[{i}]", item)

        scopes = [f.f_locals for f in (frames or []) if f.f_code.co_name != "<module>"]
        scopes.append(self.globals)
        for scope in scopes:
            for name, value in list(scope.items()):
                if type(name) is not str or name == "self" or name.startswith("__"):
                    continue
                try:
                    add(name, value)
                except Exception:  # a tensor or list subclass of the script's that refuses to be read
                    continue
        self._bound = len(tensors)
        self._add_module_names(modules, names, tensors)
        for key, (ref, name) in list(self.remembered.items()):
            t = ref()
            if t is None:
                del self.remembered[key]
            elif key not in names:
                names[key] = name
                tensors.insert(self._bound, (name, t))
                self._bound += 1
        self._names = names
        self._tensors = tensors
        # ``add`` refers to itself through its closure: a reference cycle that would keep this
        # table (and every tensor in it) alive until the next garbage collection.
        add = None  # noqa: F841

    def _add_module_names(self, modules, names, tensors) -> None:
        # One walk of each module tree gives paths, parameters and buffers: named_parameters()
        # and named_buffers() would walk the tree again each (thousands of calls on big models).
        paths: dict[int, str] = {}
        classes: dict[str, str] = {}
        single = len(modules) == 1 and not self.notebook
        for var, module in modules:
            params, buffers = [], []
            try:
                prefix = "" if single and module._modules else f"{var}."
                for path, sub in module.named_modules():
                    if path or prefix:  # the script's one model: its own forward is the top level, not a group
                        full = (prefix + path).rstrip(".") if path else var
                        paths.setdefault(id(sub), full)
                        classes.setdefault(full, type(sub).__name__)
                    base = f"{prefix}{path}." if path else prefix
                    params.extend((base + n, p) for n, p in sub._parameters.items() if p is not None)
                    buffers.extend((base + n, b) for n, b in sub._buffers.items() if b is not None)
            except Exception:  # a module of the script's whose attributes raise: the names found so far
                pass
            for name, t in params + buffers:
                key = t._cdata
                if key not in names:
                    names[key] = name
                    tensors.append((name, t))
        self.module_paths = paths
        self.module_classes = classes

    def graph_roots(self, frames: list[FrameType], kept: dict | None = None) -> list:
        """grad_fn nodes of every tensor the script can reach by name (lists included), and of
        every graph node it holds itself (``fns.append(loss.grad_fn)``), without touching the name
        table: the sampler calls this in the middle of a capture. ``kept`` gets, by list name, the
        roots held in that list: the graphs a loop keeps alive from one iteration to the next."""
        roots, seen = [], set()

        def add(value, depth=0, name=None, keeper=None) -> None:
            cls = type(value)  # not isinstance(): see refresh
            fn = grad_fn_of(value) if issubclass(cls, torch.Tensor) else value if issubclass(cls, Node) else None
            if fn is not None:
                if id(fn) not in seen:
                    seen.add(id(fn))
                    roots.append(fn)
                if keeper is not None and kept is not None:
                    kept.setdefault(keeper, []).append(fn)
            elif depth == 0 and issubclass(cls, (list, tuple)) and 0 < len(value) <= 100_000:
                for item in value:
                    add(item, 1, keeper=name)

        scopes = [f.f_locals for f in frames if f.f_code.co_name != "<module>"] + [self.globals]
        for scope in scopes:
            for name, value in list(scope.items()):
                if type(name) is str and not name.startswith("__"):
                    try:
                        add(value, name=name)
                    except Exception:
                        continue
        add = None  # noqa: F841  (breaks the closure's cycle, see refresh)
        return roots

    def release(self) -> None:
        """Forget the table's strong references (call when a snapshot is done)."""
        self._tensors = []
        self._names = {}
        self._bound = 0

    def name_of(self, t: torch.Tensor) -> str | None:
        return self._names.get(t._cdata)

    def named_tensors(self, bound_only: bool = False) -> list[tuple[str, torch.Tensor]]:
        """Tensors with a name; ``bound_only`` leaves out module parameters and buffers."""
        return list(self._tensors[: self._bound] if bound_only else self._tensors)
