"""Stepping drawn: the session's stepped call on the graph and in the step log.

The graph shows executed nodes, the current one and the ready frontier, gradients on the
edges they travelled and leaf grads as they fill; the step log keeps every step, and clicking
a past one replays the recorded steps (nothing is re-run). Steps that stream in while the
engine runs (Continue on thousands of nodes) are drawn in batches, a first frame after
0.5 s and then one a second; a pause draws at once, and a frame redraws only the nodes and
edges that changed since the last one. The state itself lives in ``app.session.session.Session``.
"""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.session.session import SessionState
from core.protocol import messages as protocol
from core.model.step_state import leaf_chip_lines, short_values, step_texts, step_view
from core.protocol.switch_interval import quick_switch
from core.model.trace import CallInfo, ErrorInfo
from core.programs.notebook import where as line_where

STEPPING_STATES = (SessionState.PAUSED, SessionState.STEPPING, SessionState.DEBUGGING, SessionState.STARTING,
                   SessionState.FORWARD)
UNFOLD_MS = 150  # stepping rests this long on a node in a folded module before the fold opens
PROGRESS_MS = 200  # while backward runs on, the status's count of nodes done is this fresh


class StepController(QObject):
    sig_changed = Signal()
    """The stepping state changed (started, paused, stepped or ended)."""

    def __init__(self, session, views, status: Callable[[str], None], parent=None):
        """``views``: an object with the window's ``graph``, ``step_log``, ``inspector``, ``source``,
        ``problems``, ``calls`` and ``steps_dock``; ``status`` shows a sentence in the status bar."""
        super().__init__(parent)
        self.session = session
        self.views = views
        self.graph = views.graph
        self.step_log = views.step_log
        self._status_bar = status
        self._unlogged: list[dict] = []
        self._frames = 0  # frames drawn since the last pause
        self._synced = None  # (tracker, graph states token) when the graph last got a live frame
        self._inspect: tuple = (None, None)  # (call, node id) the inspector is to describe
        self._inspect_timer = QTimer(self, singleShot=True, interval=0)
        self._inspect_timer.timeout.connect(self._show_inspected)
        self._unfold: str | None = None  # the paused node whose folds open when stepping rests
        self._unfold_timer = QTimer(self, singleShot=True, interval=UNFOLD_MS)
        self._unfold_timer.timeout.connect(self._open_folds)
        self.graph.sig_scene_ready.connect(self._on_scene_ready)
        self._redraw = QTimer(self, singleShot=True, interval=100)
        self._redraw.timeout.connect(self._flush)
        # While backward runs on, the status counts the nodes done as their records arrive
        # (at most every PROGRESS_MS: a Continue of thousands of nodes sends them in batches).
        self._progress_timer = QTimer(self, singleShot=True, interval=PROGRESS_MS)
        self._progress_timer.timeout.connect(self._show_progress)
        session.sig_state.connect(self._on_state)
        session.sig_step_begin.connect(self._on_begin)
        session.sig_paused.connect(self._on_paused)
        session.sig_step.connect(self._on_step)
        session.sig_step_end.connect(self._on_end)
        session.sig_state.connect(lambda _s: self.sig_changed.emit())
        session.sig_queued.connect(self._on_queued)
        # While stepping, the pause message crosses from the reader thread to this one at once
        # (core.protocol.switch_interval); idle or running a plain run, the default interval is back.
        owner = f"steps-view-{id(self)}"
        session.sig_state.connect(lambda s: quick_switch(s in STEPPING_STATES, owner))
        self.destroyed.connect(lambda *_: quick_switch(False, owner))
        session.sig_status.connect(self._status)
        session.sig_warning.connect(self._on_warning)
        session.sig_step_end.connect(lambda _e: views.source.set_paused_line(None))
        session.sig_state.connect(lambda s: views.source.set_paused_line(None) if s is SessionState.IDLE else None)
        views.source.sig_breakpoints_changed.connect(session.set_breakpoints)

    def _status(self, text: str) -> None:
        self.step_log.set_status(text)
        self._status_bar(text)

    def _show_node(self, node_id: str, *, at_rest: bool = False) -> None:
        """Keep the node backward is at in view, and describe it in the inspector.

        The inspector follows once the graph's frame is out (its page costs as much as the
        frame): presses in quick succession render it once, for the last node, while the
        worker runs the next one. A node inside a folded module is shown on the module's box at
        once, and the fold opens when stepping rests (``UNFOLD_MS`` without a new pause, or
        ``at_rest``): a burst of steps through a 800-block model lays the graph out once, not
        once per block."""
        call = self.session.call
        if call is None or call.node(node_id) is None:
            return
        folded = self.graph.box_of(node_id) not in (node_id, None)
        self.graph.ensure_visible(node_id, open_folds=at_rest or not folded)
        self._unfold = node_id if folded and not at_rest else None
        if self._unfold is not None:
            self._unfold_timer.start()
        self._inspect = (call, node_id)
        self._inspect_timer.start()

    def _on_scene_ready(self, _call_id: str) -> None:
        """A new layout (a fold opened) while paused: the inspector keeps describing the node
        backward is at (the window describes the loss on a new scene with nothing selected)."""
        pending = self.session.pending
        if self.session.state is SessionState.PAUSED and pending and self._inspect[1] == pending.get("node"):
            self._inspect_timer.start()

    def _open_folds(self) -> None:
        """Stepping rests on a node inside a folded module: open the folds around it."""
        pending = self.session.pending
        if self._unfold is not None and pending and pending.get("node") == self._unfold:
            self.graph.ensure_visible(self._unfold)
        self._unfold = None

    def _show_inspected(self) -> None:
        call, node_id = self._inspect
        if call is not None and self.session.call is call:
            self.views.inspector.show_node(call, node_id)

    def _on_warning(self, text: str) -> None:
        self.views.problems.show_error(ErrorInfo(type="NotDeterministic", message=text, kind="stepping"),
                                       title="Stepping does not show the traced numbers")
        self._status(text)

    # -- the session's stepping, as the exporters and tests read it ---------------------------------------
    @property
    def call(self) -> CallInfo | None:
        return self.session.step_call

    @property
    def steps(self) -> list[dict]:
        return self.session.steps

    @property
    def state(self) -> SessionState:
        return self.session.state

    @property
    def active(self) -> bool:
        return self.session.active

    # -- commands (the session's) ------------------------------------------------------------------------
    def step(self) -> None:
        self.session.step()

    def step_to(self, node_id: str | None) -> None:
        self.session.step_to(node_id)

    def resume(self) -> None:
        self.session.continue_()

    def progress_text(self) -> str | None:
        """What backward is doing while it runs on: "Call #0: continuing: 1,234 / 4,802 nodes"
        (None when it is not running a command)."""
        s, call = self.session, self.call
        if s.state is not SessionState.STEPPING or s.running is None or call is None:
            return None
        cmd, args = s.running
        if cmd == "step":
            count = int(args.get("count", 1))
            doing = "running one node" if count == 1 else f"running {count:,} nodes"
        elif cmd == "step_to":
            node = call.node(args.get("node"))
            doing = f"running to {node.name if node is not None else 'the selected node'}"
        elif cmd == "next_call":
            doing = "running to the next call"
        elif cmd == "resume_all":
            doing = "running to the end of the script"
        else:
            doing = "continuing"
        queued = s.queued_steps()
        presses = "1 step press waits" if queued == 1 else f"{queued} step presses wait"
        waiting = f"; {presses} for the next pause" if queued else ""
        return f"Call #{call.index}: {doing}: {len(s.steps):,} / {call.node_count:,} nodes{waiting}"

    def _show_progress(self) -> None:
        text = self.progress_text()
        if text is not None:
            self._status(text)

    def _on_queued(self, _count: int) -> None:
        """Presses kept for the next pause: the Step button counts them, the status too while
        backward runs on."""
        self._show_progress()
        self.sig_changed.emit()

    def _on_state(self, state: SessionState) -> None:
        if state is SessionState.STEPPING:
            self._show_progress()
        else:
            self._progress_timer.stop()

    def restart(self) -> None:
        self.session.restart()

    def stop(self) -> None:
        self.session.stop()

    # -- session signals --------------------------------------------------------------------------------
    def _on_begin(self, call: CallInfo) -> None:
        self._unlogged = []
        self.step_log.set_steps(call, [])
        self.graph.clear_states()
        self.views.steps_dock.show()
        self.views.steps_dock.raise_()
        s = self.session
        if s.run_kind == "debug":
            self.views.calls.select_call(call.id)
        warning = f" {s.warning}." if s.warning else ""
        where = line_where(self.views.source.cells, call.line) or "no line"  # "cell 4, line 2" in a notebook
        self._status(f"Paused at call #{call.index} ({call.api}, {where}) before backward: "
                     f"{call.node_count} nodes. F10 runs one node, F5 the whole call.{warning}")
        self.sig_changed.emit()

    def _flush(self) -> None:
        """Log the steps that arrived since the last frame and draw the graph once."""
        self._redraw.stop()
        if self._unlogged:
            self.step_log.append_steps(self._unlogged)
            self._unlogged = []
        self._draw()

    def _on_paused(self, pending: dict) -> None:
        self._frames = 0
        self._flush()
        self.views.source.set_paused_line(self.session.paused_line)
        call = self.call
        node = call.node(pending.get("node")) if call and pending else None
        if node is not None:
            grads = ", ".join(short_values(g) for g in pending.get("grad_outputs") or [])
            label = f" ({node.label})" if node.label else ""
            warning = f" {self.session.warning}." if self.session.warning else ""
            self._status(f"Call #{call.index}, step {len(self.steps)}: paused before {node.name}{label}; "
                         f"gradient in: {grads}. F10 steps, F5 continues.{warning}")
            self._show_node(node.id)
        self.sig_changed.emit()

    def _on_step(self, record: dict) -> None:
        self._unlogged.append(record)
        if not self._progress_timer.isActive() and self.session.state is SessionState.STEPPING:
            self._progress_timer.start()
        if not self._redraw.isActive():
            # While backward runs on (Continue), a frame costs O(nodes it changed) and shares two
            # cores with the run: a first frame after half a second, later ones every second, so
            # a Continue of a few thousand nodes draws once, at its end (a pause or the end
            # draws at once), and a long one still shows its progress.
            self._redraw.start(500 if self._frames == 0 else 1000)
            self._frames += 1

    def _on_end(self, event: protocol.StepEnd) -> None:
        self._flush()
        call = self.call
        error = event.error
        if call is None:
            return
        if error:
            failed = next((s for s in self.steps if s.get("error")), None)
            node = call.node(failed["node"]) if failed else None
            where = f" at {node.name}" if node else ""
            self._status(f"Backward failed{where}: {error['type']}: {error['message'].splitlines()[0]}")
            if node is not None:
                self._show_node(node.id, at_rest=True)
        elif event.state == protocol.StepperState.FINISHED:
            more = " The script runs on to its next breakpoint." if self.session.run_kind == "debug" else ""
            self._status(f"Backward of call #{call.index} finished: {len(self.steps)} nodes executed. "
                         f"Click a step in the log to replay it.{more}")
        self.sig_changed.emit()

    # -- drawing ------------------------------------------------------------------------------------------
    def replay(self, count: int) -> None:
        """Show the graph as it was after ``count`` recorded steps."""
        if self.call is None or not self.steps or count < 1:
            return
        count = min(count, len(self.steps))
        self._draw(upto=count)
        self.step_log.select_step(count)
        record = self.steps[count - 1]
        self._status(f"Replaying step {count - 1}: {record.get('name')} (of {len(self.steps)} recorded)")

    def _draw(self, upto: int | None = None) -> None:
        """Draw the live state (``upto`` None) or a replayed one.

        Live, a frame sends the graph only what changed since the last one (the tracker's
        delta): O(changed nodes) however big the graph. It sends everything when the graph's
        states were replaced meanwhile (a new call shown, a replay, cleared states)."""
        call, shown, tracker = self.call, self.session.call, self.session.tracker
        if call is None or shown is None or shown.structure != call.structure or tracker is None:
            return
        if upto is not None:
            view = step_view(call, self.steps, None, upto=upto)
            self.graph.set_node_states(view.states)
            self.graph.set_edge_texts(step_texts(call, view))
            self.graph.set_leaf_lines(self._leaf_lines(view.leaf_grads), replace=True)
            self.graph.set_step_grads(view.leaf_grads)
            return
        pending = self.session.pending
        tracker.set_current(pending.get("node") if pending else None)
        if self._synced is not None and self._synced == (tracker, self.graph.states_token()):
            delta = tracker.delta()
            if delta:
                self.graph.update_step(delta.states, delta.edge_texts)
            if delta.leaves:
                self.graph.set_leaf_lines(self._leaf_lines(tracker.leaf_grads, delta.leaves))
        else:
            tracker.delta()  # everything is drawn now
            view = tracker.view(pending)
            self.graph.set_node_states(view.states)
            self.graph.set_edge_texts(view.edge_texts)  # the tracker keeps leaf .grad values on their edges
            self.graph.set_leaf_lines(self._leaf_lines(tracker.leaf_grads), replace=True)
        self.graph.set_step_grads(tracker.leaf_grads)  # retained grads on their nodes, at this step
        self._synced = (tracker, self.graph.states_token())

    def _leaf_lines(self, leaf_grads: dict, nodes=None) -> dict[str, list[str]]:
        """The value chips of the leaves (``nodes``: these AccumulateGrad ids; None: all), as
        they are with ``leaf_grads`` recorded: each leaf's .grad at this step."""
        call, before = self.call, self.session.step_before
        if nodes is None:
            nodes = [n.id for n in call.nodes if n.kind == "accumulate_grad"]
        out = {}
        for node_id in nodes:
            node = call.node(node_id)
            lines = leaf_chip_lines(call, node, leaf_grads, before) if node is not None else []
            if lines:
                out[node_id] = lines
        return out
