"""The GUI's one session: what is on screen and what the worker is doing, with Qt signals.

The session owns the trace, the current call, the one selection, and the run / debug /
stepping state; views listen to its signals and call its methods, the window only builds and
wires them (one selection that every view watches, as napari's ``Selection``; named states
with documented signals, as Spyder's kernel handler).

States (``SessionState``, ``sig_state``):

- ``IDLE``: no run; a trace may be on screen.
- ``RUNNING``: a plain Run (Ctrl+R) is executing the script.
- ``DEBUGGING``: a debug run (F9) is executing the script between pauses.
- ``STARTING``: a re-run is on its way to the call picked for stepping after a plain Run.
- ``PAUSED``: the script is paused inside a backward call, before the node in ``pending``.
- ``FORWARD``: a debug run is paused in forward, before line ``paused_line`` (``forward``: the live
  graph, its new nodes, the frames); Step runs one line (Step Over), ``forward_step`` into or out.
- ``STEPPING``: the engine is executing nodes (after Step, Step to, Continue).

A debug run pauses at each backward / ``autograd.grad`` call a breakpoint selects (every call
when no line has one; ``skip_to`` pauses first at call N); the graph of that call arrives with
the pause and the call is stepped in the same live run. A breakpoint also pauses forward before
its line runs, with the graph alive at that moment (``app.session.forward_pause``). Stepping a
call of a finished plain Run needs a new run: it reuses the seeds the trace recorded and checks
that the call's graph and its leaf values match the trace, and says so when they do not. Commands given while the
worker is not paused are queued and sent at the next pause (the status names them): no key
press is lost.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.session.forward_pause import ForwardPause, read_pause
from app.session.opening import opening_call, opening_node
from core.protocol import messages as protocol
from core.model.step_state import StepTracker, same_run_check
from core.model.trace import CallInfo, Trace, TraceFormatError
from core.model.trace_json import call_from_dict
from core.model.nan_check import hold_nan_check


class SessionState(str, Enum):
    """What the session is doing (the module's docstring says what each state means)."""

    IDLE = "idle"
    RUNNING = "running"
    DEBUGGING = "debugging"
    STARTING = "starting"
    PAUSED = "paused"
    STEPPING = "stepping"
    FORWARD = "forward"

    def __str__(self) -> str:
        return self.value


ACTIVE = frozenset((SessionState.DEBUGGING, SessionState.STARTING, SessionState.PAUSED, SessionState.STEPPING,
                    SessionState.FORWARD))


@dataclass(frozen=True)
class Selection:
    """The one selection: a node of the current call and the tensor it holds, or a tensor picked
    itself and the node that holds it. Each view draws the part it shows."""

    node: str | None = None  # a node id of the current call, or ``group:<path>`` (a folded group)
    tensor: str | None = None  # a tensor id in ``scope``
    scope: str = "call"  # "call": the current call's tensors; "top": those named when the script ended
    origin: str = "node"  # what the user picked, "node" or "tensor": the inspector describes that one


class Session(QObject):
    sig_state = Signal(object)
    """The session state changed: a ``SessionState``."""
    sig_trace = Signal(object)
    """A trace is now the session's (a core.model.trace.Trace, or None)."""
    sig_call = Signal(object)
    """The current call changed (a CallInfo, or None)."""
    sig_selection = Signal(object)
    """The one selection changed (a ``Selection``: node and tensor); every view shows it."""
    sig_result = Signal(object)
    """A plain run finished: a core.client.handle.RunResult (the window decides how to show it)."""
    sig_step_begin = Signal(object)
    """A call is being stepped (its CallInfo): stepping views start from a clean graph."""
    sig_step = Signal(object)
    """One node finished executing: its step record (a dict)."""
    sig_paused = Signal(dict)
    """The engine is paused before the node in this pending record."""
    sig_step_end = Signal(object)
    """The stepped call ended: a protocol.StepEnd (``state`` finished, stopped or failed, and ``error``)."""
    sig_status = Signal(str)
    """A sentence for the status bar and the step log."""
    sig_queued = Signal(int)
    """Step presses waiting for the next pause (``queued_steps``) changed: carries their number."""
    sig_warning = Signal(str)
    """Something the user must know about what stepping shows (a nondeterministic re-run)."""
    sig_breakpoints = Signal(list)
    """The breakpoint lines changed."""
    sig_forward_paused = Signal(object)
    """A debug run paused in forward: an app.session.forward_pause.ForwardPause (the call is its live graph)."""

    def __init__(self, handle, parent=None):
        super().__init__(parent)
        self.handle = handle
        self.state = SessionState.IDLE
        self.script_path: str | None = None
        self.device = "cpu"
        self.timeout = 600.0
        self.load_options: dict = {}  # how the file is opened: weights, input_shapes, trust_pickle
        self.ddp: dict | None = None  # run under torchrun: {"nproc", "rank", "script"} (app.session.ranks)
        self.nan_check = False  # plain runs name the first NaN/Inf op and node (Trace.nan_check)
        self.trace: Trace | None = None
        self.call: CallInfo | None = None
        self.selection = Selection()
        self.run_id: int | None = None
        self.run_kind: str | None = None  # run, debug or rerun
        self.breakpoints: list[int] = []
        self.skip_to: int | None = None
        self.pause_on_errors = False  # debug runs pause in forward before an in-place op that breaks backward
        self.forward: ForwardPause | None = None  # the pause in forward shown (state FORWARD), else None
        # The call being stepped, its steps so far and the node the engine is paused before.
        self.step_call: CallInfo | None = None
        self.steps: list[dict] = []
        self.tracker: StepTracker | None = None
        self.pending: dict | None = None
        # The stepped call as the worker captured it when backward began, when the call stepped
        # is the traced one (captured after backward): the leaves' .grad before the call.
        self.step_before: CallInfo | None = None
        # What the engine is doing while STEPPING: the command sent ("step", "step_to", "continue",
        # "next_call", "resume_all") and its arguments.
        self.running: tuple[str, dict] | None = None
        # While a finished debug run's trace is being shown: the index of the call last stepped,
        # the one the window opens the trace on (``show_trace``), instead of its first call.
        self.opens_on: int | None = None
        self.paused_line: int | None = None
        self.live_calls: list[CallInfo] = []
        self.queued: list[tuple[str, dict]] = []
        self.warning = ""
        self._rerun_of: CallInfo | None = None
        handle.sig_step_begin.connect(self._on_begin)
        handle.sig_step_paused.connect(self._on_paused)
        handle.sig_step.connect(self._on_step)
        handle.sig_steps.connect(self._on_steps)
        handle.sig_step_end.connect(self._on_end)
        handle.sig_finished.connect(self._on_finished)
        handle.sig_forward_paused.connect(self._on_forward_paused)

    # -- what is shown -------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """A debug run or a stepping re-run is in progress."""
        return self.state in ACTIVE

    def set_trace(self, trace: Trace | None) -> None:
        self.trace = trace
        if trace is not None:
            hold_nan_check(trace)  # the graph marks the first non-finite op's node and gradient's node
        settle_heap(trace)
        self.sig_trace.emit(trace)

    @property
    def selected(self) -> str | None:
        """The selected node's id (None when no node is selected)."""
        return self.selection.node

    def opening_call(self) -> CallInfo | None:
        """The call the trace opens on (see ``app.session.opening``)."""
        return opening_call(self.trace, self.opens_on)

    def opening_node(self) -> str | None:
        """The node described while the current call has no selection (see ``app.session.opening``)."""
        return opening_node(self.call)

    def set_call(self, call: CallInfo | None) -> None:
        self.call = call
        self.selection = Selection()
        self.sig_call.emit(call)

    def select(self, node_id: str | None) -> None:
        """Make ``node_id`` (of the current call, or a folded ``group:<path>``) the one selection,
        with the tensor it holds; every view follows. An id the call does not have is ignored."""
        call = self.call
        if node_id and not node_id.startswith("group:") and (call is None or call.node(node_id) is None):
            return
        tensor, scope = None, "call"
        node = call.node(node_id) if node_id and call is not None else None
        if node is not None:
            held = node.variable or node.tensor
            if held is not None and call.tensor(held) is not None:
                tensor = held
            elif node.label and self.trace is not None:  # e.g. an AccumulateGrad whose leaf the call did not keep
                leaf = next((t for t in self.trace.tensors if t.name == node.label), None)
                tensor, scope = (leaf.id, "top") if leaf is not None else (None, "call")
        self._set_selection(Selection(node=node_id or None, tensor=tensor, scope=scope, origin="node"))

    def select_tensor(self, tensor_id: str, scope: str = "call") -> None:
        """Make a tensor the one selection (``scope`` "call": the current call's tensors, "top": the
        ones named when the script ended), with the node of the current call that holds it."""
        if scope == "call" and self.call is None:
            scope = "top"
        tensors = self.call.tensors if scope == "call" else (self.trace.tensors if self.trace is not None else [])
        tensor = next((t for t in tensors if t.id == tensor_id), None)
        if tensor is None:
            return
        node = None
        if self.call is not None:
            if scope == "call":
                node = next((n for n in self.call.nodes if (n.variable or n.tensor) == tensor_id), None)
            elif tensor.name:
                node = next((n for n in self.call.nodes if n.label == tensor.name), None)
        self._set_selection(Selection(node=node.id if node is not None else None, tensor=tensor_id, scope=scope,
                                      origin="tensor"))

    def _set_selection(self, selection: Selection) -> None:
        self.selection = selection
        self.sig_selection.emit(selection)

    def set_breakpoints(self, lines: list[int]) -> None:
        self.breakpoints = sorted(set(lines))
        if self.run_kind == "debug" and self.active:
            self.handle.control("breakpoints", lines=self.breakpoints, pause_all=not self.breakpoints,
                                pause_on_errors=self.pause_on_errors)
        self.sig_breakpoints.emit(self.breakpoints)

    def set_pause_on_errors(self, on: bool) -> None:
        """Debug runs pause in forward before an in-place op that would break backward (a running one too)."""
        self.pause_on_errors = bool(on)
        self.set_breakpoints(self.breakpoints)

    # -- runs ------------------------------------------------------------------------------------------
    def run(self) -> None:
        """A plain run: capture every call, no pause."""
        if not self.script_path:
            return
        self._reset_stepping()
        self._start("run")

    def debug(self, skip_to: int | None = None, to_nan: bool = False) -> None:
        """A debug run: pause at each call a breakpoint selects (``skip_to``: first at call N), and in
        forward before each breakpoint's line (``to_nan``: at the first NaN/Inf, with the check on)."""
        if not self.script_path:
            self.sig_status.emit("Open a script to debug it.")
            return
        self._reset_stepping()
        self.skip_to = skip_to
        self.live_calls = []
        self._start("debug", debug={"lines": self.breakpoints, "pause_all": not self.breakpoints,
                                    "skip_to": skip_to, "pause_on_errors": self.pause_on_errors, "to_nan": to_nan},
                    **({"nan_check": True} if to_nan else {}))
        where = f"call #{skip_to}" if skip_to is not None else (
            f"line {', '.join(map(str, self.breakpoints))}" if self.breakpoints else "every backward call")
        self.sig_status.emit(f"Debugging {Path(self.script_path).name}{self.one_rank_note()}: pausing at {where}…")

    def stop(self) -> None:
        """Stop the run (a debug run is stopped where it is paused; the worker is released)."""
        if self.active:
            self.handle.control("stop_step")
            self.handle.cancel()
            self.pending = None
            self.queued = []
            self.run_id = None  # its last messages and result are not shown
            self.paused_line = None
            self.forward = None
            self._set_state(SessionState.IDLE)
            self.sig_status.emit("Stopped: the worker released the script and its graph.")
        elif self.handle.running:
            self.sig_status.emit("Stopping…")
            self.handle.cancel()

    def restart(self) -> None:
        """Start the same debugging again: the same call, from its first node, in a new run."""
        index = self.step_call.index if self.step_call is not None else (self.call.index if self.call else None)
        index = None if self.forward is not None else index  # paused in forward: from the start
        kind = self.run_kind
        if self.active:
            self.stop()
        if kind == "rerun" and self._rerun_of is not None:
            self._start_rerun(self._rerun_of)
        else:
            self.debug(skip_to=index)

    # -- stepping commands -------------------------------------------------------------------------------
    def step(self) -> None:
        """Execute exactly one node (a press while not paused waits for the pause)."""
        self._command("step", count=1)

    def step_to(self, node_id: str | None = None) -> None:
        node_id = node_id or self.selected
        if node_id:
            self._command("step_to", node=node_id)
        else:
            self.sig_status.emit("Select a node first: Step to Selected runs backward until it is next.")

    def continue_(self) -> None:
        """Run this backward to its end; a debug run then pauses at its next breakpoint."""
        self._command("continue")

    def next_call(self) -> None:
        """Run this backward to its end and pause at the script's next call."""
        if self.state is SessionState.DEBUGGING:
            self.handle.control("next_call")
            self.sig_status.emit("Running to the next backward call…")
            return
        self._command("next_call")

    def resume_all(self) -> None:
        """Run the rest of the script without pausing again."""
        if self.state is SessionState.DEBUGGING:
            self.handle.control("resume_all")
            return
        self._command("resume_all")

    def forward_step(self, kind: str) -> None:
        """Paused in forward: Step Into ("into") or Step Out ("out"); Step Over is ``step``."""
        if self.state is SessionState.FORWARD:
            self._command("forward_step", kind=kind)
        else:
            self.sig_status.emit(f"Step {kind.title()} works while a debug run is paused in forward: set a "
                                 f"breakpoint in the Source gutter and press F9.")

    def _command(self, cmd: str, **args) -> None:
        before = self.queued_steps()
        self._give(cmd, args)
        if self.queued_steps() != before:
            self.sig_queued.emit(self.queued_steps())

    def _give(self, cmd: str, args: dict) -> None:
        if self.state is SessionState.IDLE or self.state is SessionState.RUNNING:
            if cmd in ("next_call", "resume_all") or self.call is None or self.call.api == "unreached" \
                    or self.trace is None:
                if cmd != "resume_all":
                    self.debug()
                    if cmd != "next_call":  # the first pause is at the next call already
                        self.queued.append((cmd, args))
                return
            # Stepping a call of a plain Run: a new run, reseeded and checked.
            self._start_rerun(self.call)
            self.queued.append((cmd, args))
            return
        if self.state is SessionState.PAUSED:
            self._send(cmd, args)
            return
        if self.state is SessionState.FORWARD:
            self._send_forward(cmd, args)
            return
        # Not paused yet (the worker is getting there): queued, and said.
        if cmd in ("step", "step_to", "continue") or self.run_kind == "rerun":
            self.queued.append((cmd, args))
            presses = sum(1 for c, _ in self.queued if c == "step")
            self.sig_status.emit(f"Waiting for the pause: {len(self.queued)} command(s) queued"
                                 f"{f' ({presses} step(s))' if presses else ''}.")
        else:
            self.handle.control(cmd, **args)

    def _send(self, cmd: str, args: dict) -> None:
        self.running = (cmd, dict(args))
        self.pending = None
        self._set_state(SessionState.STEPPING)
        self.handle.control(cmd, **args)

    def _send_forward(self, cmd: str, args: dict) -> None:
        """Paused in forward: Step runs one line (``forward_step`` over); Continue, Next Call and
        Resume go on as from a backward pause; Step to Selected has no node to run to yet."""
        if cmd == "step_to":
            self.sig_status.emit("Paused in forward: Step to Selected runs backward, so press F5 to reach "
                                 "the backward call first.")
            return
        if cmd == "step":
            cmd, args = "forward_step", {"kind": "over"}
        self.running = (cmd, dict(args))
        self._set_state(SessionState.DEBUGGING)
        self.handle.control(cmd, **args)

    def queued_steps(self) -> int:
        """Step presses waiting for the next pause."""
        return sum(int(a.get("count", 1)) for c, a in self.queued if c == "step")

    def _flush_queue(self) -> None:
        """At a pause: send what was pressed meanwhile, merging Step presses into one command."""
        queued, self.queued = self.queued, []
        steps = sum(int(a.get("count", 1)) for c, a in queued if c == "step")
        self.sig_queued.emit(0)
        others = [(c, a) for c, a in queued if c != "step"]
        if steps:
            self._send("step", {"count": steps})
        for cmd, args in others:
            self._send(cmd, args)

    # -- internals -----------------------------------------------------------------------------------------
    def _start(self, kind: str, **run_args) -> None:
        self.run_kind = kind
        self.queued = []
        self.warning = ""
        ddp = self.torchrun_options()
        if ddp:  # a run starts every rank under torchrun; debug and stepping one process (core.worker.ddp)
            run_args["ddp"] = {"nproc": ddp["nproc"], "rank": ddp["rank"]}
        if self.nan_check and kind == "run":
            run_args["nan_check"] = True
        self.run_id = self.handle.run(self.script_path, device=self.device, timeout=self.timeout,
                                      load=self.load_options or None, **run_args)
        self._set_state({"run": SessionState.RUNNING, "debug": SessionState.DEBUGGING,
                         "rerun": SessionState.STARTING}[kind])

    def torchrun_options(self) -> dict | None:
        """The torchrun settings of the open script (None: it runs plainly)."""
        ddp = self.ddp
        return ddp if ddp and ddp.get("script") == self.script_path else None

    def one_rank_note(self) -> str:
        """For the status of a debug run of a DDP script: it runs as one process, not under torchrun."""
        ddp = self.torchrun_options()
        if not ddp:
            return ""
        return f" as one process, rank 0 of 1 (Run starts all {ddp['nproc']} ranks with torchrun)"

    def _start_rerun(self, call: CallInfo) -> None:
        self._reset_stepping()
        self._rerun_of = call
        seeds = self.trace.seeds if self.trace is not None else None
        self._start("rerun", debug={"pause_all": False, "skip_to": call.index}, seeds=seeds or None)
        self.sig_status.emit(f"Re-running {Path(self.script_path).name}{self.one_rank_note()} up to call "
                             f"#{call.index} ({call.api}, line {call.line}) with the seeds of the traced run…")

    def _reset_stepping(self) -> None:
        self.step_call = None
        self.step_before = None
        self.running = None
        self.steps = []
        self.tracker = None
        self.pending = None
        self.paused_line = None
        self.forward = None
        self._rerun_of = None

    def _set_state(self, state: SessionState) -> None:
        if state != self.state:
            self.state = state
            self.sig_state.emit(state)

    def _current(self, event: protocol._Base) -> bool:
        return self.run_id is not None and self.handle.current_run == self.run_id and self.active

    def _stepped(self, event) -> bool:
        """The message is about the call this session is stepping, in its current run."""
        return self._current(event) and self.step_call is not None and event.call == self.step_call.index

    def _on_begin(self, event: protocol.StepBegin) -> None:
        if not self._current(event):
            return
        graph = event.graph
        call = None
        if graph is not None:
            try:
                call = call_from_dict(graph, f"call #{event.call}")
            except TraceFormatError as exc:
                self.sig_warning.emit(str(exc))
        before = None
        if self.run_kind == "rerun" and self._rerun_of is not None:
            traced = self._rerun_of
            problem = same_run_check(traced, event.structure, event.leaves)
            if problem:
                self.warning = problem
                self.sig_warning.emit(problem)
            if call is None or call.structure == traced.structure:
                before, call = call, traced  # the graph on screen: its node ids are the live graph's
        if call is None:
            return
        self.step_call = call
        self.step_before = before
        self.forward = None
        self.running = None
        self.steps = []
        self.tracker = StepTracker(call)
        self.pending = None
        self.paused_line = event.line
        if self.run_kind == "debug":
            self.live_calls = [c for c in self.live_calls if c.index != call.index] + [call]
            self.set_trace(Trace(calls=list(self.live_calls), script=self.script_path or "",
                                 call_count=call.index + 1))
        if self.call is None or self.call.structure != call.structure or self.run_kind == "debug":
            self.set_call(call)
        self.sig_step_begin.emit(call)

    def _on_forward_paused(self, event: protocol.ForwardPaused) -> None:
        if not self._current(event) or self.run_kind != "debug":
            return
        try:
            pause = read_pause(event, self.forward)
        except TraceFormatError as exc:
            self.sig_status.emit(f"Paused in forward at line {event.line}, but its graph cannot be read: {exc}")
            return
        self.forward, self.running, self.pending, self.paused_line = pause, None, None, pause.line
        live = pause.call
        self.set_trace(Trace(calls=[*self.live_calls, live], script=self.script_path or "", tensors=live.tensors,
                             storages=live.storages, call_count=len(self.live_calls)))
        self.set_call(live)
        self._set_state(SessionState.FORWARD)
        self.sig_forward_paused.emit(pause)
        if self.queued:  # one press made while the script ran per pause: a line each
            cmd, args = self.queued.pop(0)
            self.sig_queued.emit(self.queued_steps())
            self._send_forward(cmd, args)

    def _on_paused(self, event: protocol.StepPaused) -> None:
        if not self._stepped(event):
            return
        self.pending = event.pending
        self.running = None
        self._set_state(SessionState.PAUSED)
        self.sig_paused.emit(self.pending or {})
        if self.queued:
            self._flush_queue()

    def _on_step(self, event: protocol.Step) -> None:
        if not self._stepped(event):
            return
        record = event.record
        self.steps.append(record)
        self.tracker.add(record)
        self.sig_step.emit(record)

    def _on_steps(self, event: protocol.Steps) -> None:
        if not self._stepped(event):
            return
        for record in event.records:
            self.steps.append(record)
            self.tracker.add(record)
            self.sig_step.emit(record)

    def _on_end(self, event: protocol.StepEnd) -> None:
        if not self._stepped(event):
            return
        self.pending = None
        self.paused_line = None
        self.running = None
        self.sig_step_end.emit(event)
        if self.run_kind == "debug":
            self._set_state(SessionState.DEBUGGING)
            # Presses made while backward ran on belong to the next pause; Continue did its work.
            self.queued = [(c, a) for c, a in self.queued if c == "step"]
        else:
            self._set_state(SessionState.IDLE)
            self.queued = []

    def _on_finished(self, result) -> None:
        if result.run_id != self.run_id:
            return  # a run that was stopped or replaced: its result is not shown
        kind, self.run_id = self.run_kind, None
        self.queued = []
        if kind == "run":
            self._set_state(SessionState.IDLE)
            self.sig_result.emit(result)
            return
        was = self.state
        self._set_state(SessionState.IDLE)
        trace: Trace = result.trace
        if kind == "rerun":
            if was is SessionState.STARTING:
                reached = trace.error.message if trace.error else "the script ended before reaching that call"
                self.sig_status.emit(f"Stepping ended: {reached}")
            return
        # A debug run that ran to its end: its trace is the one stepped, opened on the call last
        # stepped (not on its first call and then on that one: two graphs drawn, one flashed).
        self.opens_on = self.step_call.index if self.step_call is not None else None
        try:
            self.sig_result.emit(result)
        finally:
            self.opens_on = None


#: A trace with at least this many nodes settles the heap when it arrives (see ``settle_heap``).
SETTLE_NODES = 20_000


def settle_heap(trace: Trace | None) -> bool:
    """Collect once and freeze the heap after a big trace arrives; True when it did.

    A big trace is hundreds of thousands of long-lived objects: left to the collector, a full
    collection walks them all, seconds later, wherever it lands (in a fold, in a step). Collecting
    here, while the trace is being opened anyway, and freezing what survives keeps later
    collections to the objects made since; the previous trace's frozen objects are unfrozen first,
    so what it leaves behind is still collected. A small trace (or none) after a big one unfreezes
    and collects without freezing: frozen objects in reference cycles are never collected, and
    the big trace's (its view's items, the run that carried it) would stay in memory for good."""
    if trace is None or sum(len(c.nodes) for c in trace.calls) < SETTLE_NODES:
        if gc.get_freeze_count():
            gc.unfreeze()
            gc.collect()
        return False
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return True

