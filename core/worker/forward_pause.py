"""Pausing a debug run in forward, before a line of the script runs (worker side, imports torch).

``c = a + b`` adds a node to the graph while the code runs; a breakpoint on any line of the script
pauses the script's thread *before* that line, sends ``forward_paused`` with the graph alive there
(``core.worker.capture.live_graph``) and waits for the command thread: ``forward_step`` (over, into,
out), ``continue``, ``next_call``, ``resume_all``, ``stop_step`` or a cancel.

Where it stops is ``core.worker.line_stops.LineStops``'s: the capture's own ``sys.settrace`` tracer
(``core.worker.capture.names.NameTable.tracer``) asks ``on_call`` for each new frame of the script's
own files, which gives line events only to code that holds a breakpoint line (``co_lines``) and,
while stepping, to the frames a step can stop in; line events come from ``sys.monitoring`` on Python
3.12+ (a line that is not a breakpoint is disabled after its first event) and from the frame's local
tracer on 3.10 and 3.11. At a pause every frame of the script's stack gets line events, as pdb sets
its tracer, so Step Over can stop in the caller once the frame returns. Torch's and the app's frames
are never traced. Without breakpoints and stepping ``on_call`` is not installed at all, and the run
costs what it did.

A breakpoint on a line whose statement calls ``.backward(`` or ``autograd.grad(`` keeps pausing at the
backward call (``core.worker.debug``), not in forward: those lines are found with ``ast``.

Two pauses come from the ops instead of the lines, from the capture's modes: "pause on autograd errors"
(an in-place op on a leaf that requires grad, or on a tensor a live node saved for backward, paused
before it runs) and "run to the first NaN/Inf" (right after the first op whose output is not finite).
"""

from __future__ import annotations

import ast
import logging
import sys
import threading
from types import FrameType

import torch
from torch.utils.weak import WeakIdKeyDictionary

from core.model.trace_json import call_to_dict
from core.protocol import messages as protocol
from core.worker.capture.live_graph import live_call
from core.worker.capture.nan_check import _finite, op_name
from core.worker.capture.names import OP_FRAME, untraced
from core.worker.capture.node_graph import node_name, number_nodes, saved_attr_names, version_of
from core.worker.interrupts import INTERRUPTS
from core.worker.line_stops import LineStops
from core.worker.stepper import BackwardStepper, StepperStopped

__all__ = ["BackwardStepper", "ForwardPauser", "backward_lines", "nonfinite"]

log = logging.getLogger(__name__)


def nonfinite(grads) -> bool:
    """Whether any of a node's incoming gradients holds a NaN or an infinity (the backward stepper's
    stop for Run to First NaN/Inf)."""
    with torch._C.DisableTorchFunction():
        return any(isinstance(g, torch.Tensor) and not _finite(g) for g in grads)


def backward_lines(source: str) -> frozenset[int]:
    """The lines of every statement that calls ``.backward(``, ``autograd.grad(`` or
    ``autograd.backward(``: a breakpoint there pauses at the backward call, not in forward."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    lines: set[int] = set()
    for stmt in ast.walk(tree):
        if not isinstance(stmt, ast.stmt) or isinstance(stmt, _COMPOUND):
            continue
        if any(_is_backward_call(n) for n in ast.walk(stmt)):
            lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return frozenset(lines)


# Python operators that change their left operand in place (``b += 1``, ``x[0] = 2``).
_INPLACE_OPERATORS = frozenset(f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow",
                                                        "matmul", "and", "or", "xor", "lshift", "rshift")) \
    | {"__setitem__"}
_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
             ast.AsyncFunctionDef, ast.ClassDef) + ((ast.Match,) if hasattr(ast, "Match") else ())


def _is_backward_call(node) -> bool:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    attr = node.func.attr
    if attr == "backward":
        return True
    owner = node.func.value
    return attr == "grad" and ((isinstance(owner, ast.Name) and owner.id == "autograd")
                               or (isinstance(owner, ast.Attribute) and owner.attr == "autograd"))


class ForwardPauser(LineStops):
    """The forward half of a debug run: where it pauses in forward, and the pause itself.

    ``plan`` is the run's ``core.worker.debug.DebugPlan`` (its ``lines`` change from the command
    thread); ``send`` sends a message. ``headless``: each pause is sent and the run goes on to its end
    without waiting (``main.py step --at-line``). Which lines stop, and where a step stops, is
    ``core.worker.line_stops.LineStops``'s (line events from ``sys.monitoring`` where Python has it)."""

    def __init__(self, capture, plan, send, headless: bool = False):
        names = capture.names
        super().__init__(capture.script, lambda f: names.is_user_file(f.f_code.co_filename)
                         and f.f_code.co_name != OP_FRAME)
        self.capture = capture
        self.names = names
        self.plan = plan
        self.send = send
        self.headless = headless
        self.return_tracer = names._local_tracer  # the names of a traced frame's locals, as without lines
        # Headless, the line asked for pauses in forward even where it calls backward. Read from the
        # program the capture runs (a notebook's cells as one script) once it is loaded.
        self.backward: frozenset[int] | None = frozenset() if headless else None
        self.pauses = 0
        self._source_lines = None
        self._lines: frozenset[int] = frozenset()
        self._cond = threading.Condition()
        self._paused = False
        self._reply: tuple | None = None
        self._in_op = False  # pausing from an op's mode: no second pause from the ops it runs
        self._leaves = WeakIdKeyDictionary()  # leaf tensor -> the pause that first saw it (live_graph)
        self._saved_key: tuple | None = None  # what _saved_storages read last: its roots and call count
        self._saved: dict[int, list[tuple[str, int]]] = {}
        self.refresh()
        capture.before_op = self.before_op if plan.pause_on_errors else None
        check = getattr(capture, "nan_check", None)
        if plan.to_nan and check is not None:
            check.on_found = self.on_nan

    # -- what the run wants (LineStops) ---------------------------------------------------------
    def forward_lines(self) -> frozenset[int]:
        """The breakpoint lines that pause in forward (the plan's lines less the backward ones)."""
        lines = self.plan.lines
        if self.backward is None and self.capture.program is not None:
            self.backward = backward_lines(self.capture.program.source)
            self._source_lines = None
        if lines is not self._source_lines:  # replaced whole by the command thread
            self._source_lines = lines
            self._lines = frozenset(lines) - (self.backward or frozenset())
        return self._lines

    breakpoints = forward_lines

    def quiet(self) -> bool:
        return self.plan.free

    def held(self) -> bool:
        return self.plan.next_call  # Next Call: breakpoints wait until the next backward call has paused

    def install(self, hook) -> None:
        self.names.line_tracer = hook

    # -- the pause -----------------------------------------------------------------------------
    def pause(self, frame: FrameType, reason: str, note: str = "", extra=()) -> None:
        """Pause the script's thread before ``frame``'s current line; returns when it may go on."""
        self.mode, self.target = None, None
        self.pauses += 1
        frames = self.names.user_frames(frame)
        self.watch_stack(frames)  # Step Over and Out stop in these frames once the inner ones return
        with self._cond:
            self._paused, self._reply = not self.headless, None
        try:
            self._send(frame, frames, reason, note, extra)
        except Exception:
            log.exception("reading the graph at a forward pause failed")
        if self.headless:
            self.plan.free = True
            self.refresh()
            return
        with self._cond:
            while self._reply is None:
                self._cond.wait()
            kind, arg = self._reply
            self._reply, self._paused = None, False
        self._go(kind, arg, frame)

    def _send(self, frame, frames, reason, note, extra) -> None:
        call, new = live_call(self.capture, frames, self.pauses, extra, self._leaves)
        graph = call_to_dict(call)
        del call
        stack = [{"function": f.f_code.co_name, "line": f.f_lineno, "file": f.f_code.co_filename,
                  "module": self._module_of(f)} for f in reversed(frames)]
        module = next((s["module"] for s in reversed(stack) if s["module"] is not None), None)
        if module is None and self.capture._module_stack:
            module = self.names.module_paths.get(self.capture._module_stack[-1])
        self.send(protocol.ForwardPaused(pause=self.pauses, line=frame.f_lineno, file=frame.f_code.co_filename,
                                         function=frame.f_code.co_name, stack=stack, module=module, reason=reason,
                                         graph=graph, new=new, note=note).to_dict())

    def _module_of(self, frame: FrameType) -> str | None:
        """The nn.Module path whose method ``frame`` runs (the variable's name for the script's one model)."""
        owner = frame.f_locals.get("self")
        if not issubclass(type(owner), torch.nn.Module):
            return None
        path = self.names.module_paths.get(id(owner))
        if path:
            return path
        for name, value in list(self.names.globals.items()):
            if value is owner and type(name) is str and not name.startswith("_"):
                return name
        return type(owner).__name__

    def _go(self, kind: str, arg, frame: FrameType) -> None:
        if kind == "stop":
            raise StepperStopped(f"stopped at line {frame.f_lineno}")
        if kind == "cancel":
            INTERRUPTS.fired = True  # this is the run's one KeyboardInterrupt: the Stop's own is dropped
            raise KeyboardInterrupt
        self.go(kind, arg, frame)

    # -- the command thread --------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._paused

    def command(self, kind: str, cmd: dict) -> bool:
        """A debug command while paused in forward (False: not paused, the command is not for it)."""
        replies = {"forward_step": ("step", cmd.get("kind", "over")), "continue": ("go", None),
                   "next_call": ("go", None), "resume_all": ("go", None), "stop_step": ("stop", None)}
        if kind not in replies:
            return self._paused
        return self._answer(*replies[kind])

    def stop(self) -> None:
        """The run is cancelled: a pause ends it with KeyboardInterrupt."""
        self._answer("cancel", None)

    def _answer(self, kind: str, arg) -> bool:
        with self._cond:
            if not self._paused or self._reply is not None:
                return False
            self._reply = (kind, arg)
            self._cond.notify_all()
            return True

    def plan_changed(self) -> None:
        """The breakpoints changed (command thread): frames already running that hold a new line get
        line events, as pdb sets its tracer on the stack."""
        self.capture.before_op = self.before_op if self.plan.pause_on_errors else None
        self.refresh()
        frame = sys._current_frames().get(threading.main_thread().ident)
        self.watch_running(frame)
        del frame

    # -- pauses from the ops ----------------------------------------------------------------------
    def before_op(self, func, args, site) -> None:
        """Before each op of the script (the capture's mode): an in-place op that will break backward
        pauses at its line first."""
        if self._in_op or self.plan.free or not args or not isinstance(args[0], torch.Tensor):
            return
        name = getattr(func, "__name__", "")
        if not ((name.endswith("_") and not name.endswith("__")) or name in _INPLACE_OPERATORS):
            return
        with torch._C.DisableTorchFunction(), untraced():
            note = self._inplace_note(args[0], op_name(func), site)
        if note:
            self._pause_in_op(site, "inplace", note)

    def _inplace_note(self, t: torch.Tensor, op: str, site) -> str:
        if t.requires_grad and t.is_leaf and torch.is_grad_enabled():
            who = self._name(t, site) or "a leaf"
            return (f"{who} is a leaf that requires grad; the in-place {op} on it raises "
                    f"'a leaf Variable that requires grad is being used in an in-place operation' "
                    f"(version {version_of(t)})")
        base = t._base
        if base is not None and base.requires_grad and base.is_leaf and torch.is_grad_enabled():
            who = self._name(base, site) or "a leaf"
            return (f"this is a view of {who}, a leaf that requires grad; the in-place {op} on it raises "
                    f"'a view of a leaf Variable that requires grad is being used in an in-place operation'")
        saver = self._saved_by(t, site)
        if saver is None:
            return ""
        who = self._name(t, site) or "the tensor"
        node, version = saver
        return (f"{who} was saved by {node} at version {version}; the in-place {op} makes it version "
                f"{version + 1}: backward will fail")

    def _name(self, t, site) -> str | None:
        frame = site
        while frame is not None:
            if self.names.is_user_file(frame.f_code.co_filename) and frame.f_code.co_name != OP_FRAME:
                scopes = [frame.f_locals] if frame.f_code.co_name != "<module>" else []
                for scope in scopes + [self.names.globals]:
                    for key, value in list(scope.items()):
                        if value is t and type(key) is str:
                            return key
            frame = frame.f_back
        return None

    def _saved_by(self, t: torch.Tensor, site) -> tuple[str, int] | None:
        """(node name, version) of a live node that saved ``t``'s data for backward, if one did and
        that saved value is still the tensor's (not already changed in place)."""
        try:
            ptr = t.untyped_storage().data_ptr()
        except Exception:
            return None
        if not ptr:
            return None
        for name, version in self._saved_storages(site).get(ptr, ()):
            if version == version_of(t):
                return name, version
        return None

    def _saved_storages(self, site) -> dict[int, list[tuple[str, int]]]:
        """Storage address -> (node, version) of every tensor the live graph saved. Kept while the
        graph's roots and the backward calls made stay the same: an optimizer's loop of in-place
        steps over the parameters reads the graph once, not once per parameter."""
        roots = self.names.graph_roots(self.names.user_frames(site))
        key = (tuple(id(r) for r in roots), self.capture.call_count)
        if self._saved_key == key:
            return self._saved
        saved: dict[int, list[tuple[str, int]]] = {}
        if roots:
            nodes = number_nodes(roots)[0]
            for node in nodes:
                for attr in saved_attr_names(node):
                    try:
                        value = getattr(node, attr)
                    except Exception:  # freed by a backward, or stale already
                        continue
                    for v in value if isinstance(value, (list, tuple)) else (value,):
                        if isinstance(v, torch.Tensor):
                            try:
                                where = v.untyped_storage().data_ptr()
                            except Exception:
                                continue
                            saved.setdefault(where, []).append((node_name(node), version_of(v)))
            del nodes
        self._saved_key, self._saved = key, saved
        return saved

    def on_nan(self, record: dict, out, frame) -> None:
        """The NaN/Inf check found the first non-finite output (just after its op ran)."""
        if self.plan.free:  # the check finds one op per run: this is the only pause it makes
            return
        bad = [f"{record.get(k)} {w}" for k, w in (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf"))
               if record.get(k)]
        note = (f"{record.get('text') or record.get('op')} made the first non-finite values: "
                f"{', '.join(bad)} of {record.get('numel')}")
        self._pause_in_op(frame, "nan", note, extra=[(f"{record.get('op')} output", out)])

    def _pause_in_op(self, site, reason: str, note: str, extra=()) -> None:
        frames = self.names.user_frames(site)
        if not frames:
            return
        self._in_op = True
        try:
            self.pause(frames[0], reason, note, extra)
        finally:
            self._in_op = False

