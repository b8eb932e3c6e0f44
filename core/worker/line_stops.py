"""Where a paused script stops next by line: breakpoints and Step Over / Into / Out (worker side, torch-free).

A debug run pauses the script's thread before a breakpoint's line and steps it line by line
(``core.worker.forward_pause``, which reads the graph at each pause). This module decides *where* it
stops: which of the script's frames get line events, and whether a line event is a stop. It knows
nothing of torch, so the same rules are tested on every Python the project runs on with plain
functions (``tests/core/worker/test_line_stops.py``).

Line events come from one of two sources, chosen once per run:

- ``sys.monitoring`` (PEP 669, Python 3.12 and newer): ``LINE`` events are switched on per code
  object, only for the script's code that holds a breakpoint line and, while stepping, the code a
  step may stop in. A line that is not a breakpoint answers ``DISABLE`` and is not reported again
  until a step or a new breakpoint restarts the events, so a breakpoint on a branch never taken
  inside a 1,000-iteration loop costs a handful of calls, not one per line per iteration. Step
  Over / Out see the stepped frame return through ``PY_RETURN`` / ``PY_YIELD`` and, while stepping
  only, ``PY_UNWIND``. Monitoring reports every thread: events of other threads are ignored.
- ``sys.settrace``'s local tracer (Python 3.10 and 3.11, or where another tool holds the debugger's
  monitoring id): ``f_trace_lines`` is turned on only for frames whose code holds a breakpoint line
  and, while stepping, for the frames a step can stop in; each line of such a frame is one Python call.

Either way the new frames are seen through the capture's name tracer (``sys.settrace``,
``core.worker.capture.names.NameTable.tracer``), which calls ``on_call`` for each new frame of the
script's own files while a breakpoint or a step is set; torch's and the app's frames are never traced,
and without breakpoints or a step nothing is installed. Written by hand: ``bdb`` stops in every frame
of every file and owns the process's tracer, which the capture needs for the script's names.
"""

from __future__ import annotations

import sys
import threading
from types import CodeType, FrameType

STEP_KINDS = ("over", "into", "out")
_MONITORING = getattr(sys, "monitoring", None)
TOOL_NAME = "Backprop Studio"


class LineStops:
    """Breakpoints and stepping over the script's frames.

    A subclass says what the run wants: ``breakpoints()`` (the line numbers that stop, in
    ``script``), ``quiet()`` (true: the run goes on free, nothing stops), ``held()`` (true:
    breakpoints wait, as after Next Call), ``install(hook)`` (gives the name tracer ``on_call``, or
    None) and ``pause(frame, reason)``, which calls ``watch_stack`` and, once answered, ``go``.
    ``is_user_frame(frame)``: a frame of the script's own code (Step Out returns to the nearest).
    ``monitoring``: None chooses by the Python version; False keeps ``sys.settrace``."""

    def __init__(self, script: str, is_user_frame, monitoring: bool | None = None):
        self.script = script
        self.is_user_frame = is_user_frame
        self.mode: str | None = None  # stepping: over | into | out
        self.target: FrameType | None = None  # the frame Step Over / Out is about
        self.return_tracer = None  # settrace: also told each traced frame's return (the names of its locals)
        self.line_events = 0  # line events received (the benchmark and the tests read it)
        self._lines_of: dict[CodeType, frozenset[int]] = {}
        use = _MONITORING is not None if monitoring is None else (monitoring and _MONITORING is not None)
        self.monitor = _Monitor(self) if use else None
        if self.monitor is not None and not self.monitor.claim():
            self.monitor = None  # another debugger holds sys.monitoring's id: line tracing as on 3.11

    @property
    def source(self) -> str:
        """Where line events come from: ``sys.monitoring`` or ``sys.settrace``."""
        return "sys.monitoring" if self.monitor is not None else "sys.settrace"

    # -- what the run wants (subclasses) ------------------------------------------------------
    def breakpoints(self) -> frozenset[int]:
        return frozenset()

    def quiet(self) -> bool:
        return False

    def held(self) -> bool:
        return False

    def install(self, hook) -> None:
        raise NotImplementedError

    def pause(self, frame: FrameType, reason: str) -> None:
        raise NotImplementedError

    # -- which frames get line events -------------------------------------------------------
    def refresh(self) -> None:
        """Watch new frames for lines only while a breakpoint or a step may stop in one."""
        wanted = not self.quiet() and (bool(self.breakpoints()) or self.mode is not None)
        self.install(self.on_call if wanted else None)
        if self.monitor is not None:
            self.monitor.update(wanted, stepping=self.mode is not None)

    def code_lines(self, code: CodeType) -> frozenset[int]:
        found = self._lines_of.get(code)
        if found is None:
            found = self._lines_of[code] = frozenset(line for _, _, line in code.co_lines() if line is not None)
        return found

    def holds_breakpoint(self, code: CodeType, lines: frozenset[int]) -> bool:
        return code.co_filename == self.script and not self.code_lines(code).isdisjoint(lines)

    def on_call(self, frame: FrameType):
        """The name tracer's question for each new frame of the script's files: a local tracer with
        line events on, or None (the name tracer's own, lines off)."""
        lines = self.breakpoints()
        if self.mode is None and not lines:
            self.refresh()
            return None
        code = frame.f_code
        name = code.co_name
        if name.startswith("<") and name != "<module>":  # comprehensions, and the capture's op frames
            return None
        if self.mode == "into" or self.holds_breakpoint(code, lines):
            return self.watch(frame)
        return None

    def watch(self, frame: FrameType):
        """Line events for ``frame`` (monitoring: for its code); the settrace local tracer or None."""
        if self.monitor is not None and self.monitor.watch(frame.f_code):
            return None
        frame.f_trace = self.local
        frame.f_trace_lines = True
        return self.local

    def watch_stack(self, frames: list[FrameType]) -> None:
        """At a pause: Step Over and Out stop in these frames once the inner ones return."""
        for f in frames:
            self.watch(f)
        if self.monitor is not None:
            self.monitor.restart()

    def watch_running(self, frame: FrameType | None) -> None:
        """Breakpoints changed while the script runs (another thread): frames already running that
        hold a new line get line events, as pdb sets its tracer on the stack."""
        lines = self.breakpoints()
        while frame is not None and lines:
            if self.holds_breakpoint(frame.f_code, lines) and frame.f_trace is not self.local:
                self.watch(frame)
            frame = frame.f_back
        if self.monitor is not None:
            self.monitor.restart()  # lines disabled before they were breakpoints report again

    def close(self) -> None:
        """The run ended: give sys.monitoring's id back."""
        if self.monitor is not None:
            self.monitor.release()

    # -- the events ---------------------------------------------------------------------------
    def local(self, frame: FrameType, event: str, arg):
        """The settrace local tracer of a watched frame."""
        if event == "line":
            self.line_events += 1
            if self.quiet():
                frame.f_trace_lines = False
                return self.local
            self.line(frame)
        elif event == "return":
            self.returning(frame)
            if self.return_tracer is not None and not frame.f_code.co_name.startswith("<"):
                self.return_tracer(frame, event, arg)
        return self.local

    def line(self, frame: FrameType) -> None:
        reason = self.stops(frame)
        if reason is not None:
            self.pause(frame, reason)

    def stops(self, frame: FrameType) -> str | None:
        mode = self.mode
        if mode == "into" or (mode == "over" and frame is self.target):
            return "step"
        if self.held():  # Next Call: breakpoints wait until the next backward call has paused
            return None
        if frame.f_code.co_filename == self.script and frame.f_lineno in self.breakpoints():
            return "breakpoint"
        return None

    def returning(self, frame: FrameType) -> None:
        """A watched frame returns (or yields, or unwinds)."""
        if frame is self.target:
            self._returned(frame)

    def _returned(self, frame: FrameType) -> None:
        """The frame a Step Over / Out is about returns: the step stops at its caller's next line."""
        caller = self.user_caller(frame)
        self.target = caller
        if caller is None:
            self.mode = None
            self.refresh()
            return
        self.mode = "over"
        self.watch(caller)
        if self.monitor is not None:
            self.monitor.restart()  # the caller's lines may have been disabled before the step

    def user_caller(self, frame: FrameType) -> FrameType | None:
        f = frame.f_back
        while f is not None:
            if self.is_user_frame(f):
                return f
            f = f.f_back
        return None

    def go(self, kind: str, arg, frame: FrameType) -> None:
        """The pause was answered: ``step`` (``arg``: over, into, out) or go on to the next stop."""
        if kind == "step":
            self.mode = arg if arg in STEP_KINDS else "over"
            self.target = frame
        else:
            self.mode, self.target = None, None
        self.refresh()


class _Monitor:
    """The ``sys.monitoring`` source of line events (Python 3.12+): local events on watched code."""

    def __init__(self, stops: LineStops):
        self.stops = stops
        self.mon = _MONITORING
        self.tool = _MONITORING.DEBUGGER_ID
        self.events = _MONITORING.events
        self.local_events = self.events.LINE | self.events.PY_RETURN | self.events.PY_YIELD
        self.watched: set[CodeType] = set()
        self.thread = threading.main_thread().ident  # the script runs in the worker's main thread
        self.claimed = False

    def claim(self) -> bool:
        mon = self.mon
        holder = mon.get_tool(self.tool)
        if holder == TOOL_NAME:  # left by an earlier run in this process
            mon.free_tool_id(self.tool)
        elif holder is not None:
            return False
        mon.use_tool_id(self.tool, TOOL_NAME)
        disable = mon.DISABLE
        stops, thread = self.stops, self.thread
        get_ident, getframe = threading.get_ident, sys._getframe

        def on_line(code, line):
            if get_ident() != thread:
                return None
            stops.line_events += 1
            if stops.quiet():
                return disable
            if stops.mode is None and (line not in stops.breakpoints() or code.co_filename != stops.script):
                return disable  # not a stop until a step or a new breakpoint restarts the events
            stops.line(getframe(1))
            return None

        def on_return(code, offset, value):
            if get_ident() != thread:
                return None
            if stops.target is None:
                return disable
            stops.returning(getframe(1))
            return None

        def on_unwind(code, offset, exc):
            if get_ident() == thread and stops.target is not None:
                stops.returning(getframe(1))

        events = self.events
        mon.register_callback(self.tool, events.LINE, on_line)
        mon.register_callback(self.tool, events.PY_RETURN, on_return)
        mon.register_callback(self.tool, events.PY_YIELD, on_return)
        mon.register_callback(self.tool, events.PY_UNWIND, on_unwind)
        self.claimed = True
        return True

    def watch(self, code: CodeType) -> bool:
        """Local events on ``code``; False where monitoring refuses them (a PEP 523 frame evaluator,
        as torch.compile's Dynamo sets while it runs, forbids changing events): the frame is traced."""
        if code not in self.watched:
            try:
                self.mon.set_local_events(self.tool, code, self.local_events)
            except ValueError:
                return False
            self.watched.add(code)
        return True

    def update(self, wanted: bool, stepping: bool) -> None:
        if not self.claimed:
            return
        try:
            if not wanted:
                self._unwatch()
                return
            # A stepped frame that ends by an exception is seen unwinding (a global event, while stepping only).
            self.mon.set_events(self.tool, self.events.PY_UNWIND if stepping else 0)
        except ValueError:  # a PEP 523 frame evaluator runs: the events stay as they were
            return
        if stepping:
            self.restart()

    def restart(self) -> None:
        if self.claimed:
            self.mon.restart_events()

    def _unwatch(self) -> None:
        mon = self.mon
        for code in self.watched:
            mon.set_local_events(self.tool, code, 0)
        self.watched.clear()
        mon.set_events(self.tool, 0)

    def release(self) -> None:
        if not self.claimed:
            return
        try:
            self._unwatch()
        except ValueError:
            pass
        for event in (self.events.LINE, self.events.PY_RETURN, self.events.PY_YIELD, self.events.PY_UNWIND):
            self.mon.register_callback(self.tool, event, None)
        self.mon.free_tool_id(self.tool)
        self.claimed = False
