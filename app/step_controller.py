"""Stepping backward from the app: Step, Step to Selected, Continue, Restart, Stop.

A stepping session re-runs the script in a fresh worker with backward call N under the
stepper; the engine pauses before every node and the worker streams each pause and each
finished node here. The graph shows executed nodes, the current one and the ready frontier,
gradients on the edges they travelled and leaf grads as they fill; the step log keeps every
step, and clicking a past one replays the recorded steps (nothing is re-run).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from core.step_state import StepTracker, short_values, step_texts, step_view
from core.trace import CallInfo


class StepController(QObject):
    sig_changed = Signal()
    """The stepping state changed (session started, paused, stepped or ended)."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.handle = window.handle
        self.call: CallInfo | None = None
        self.steps: list[dict] = []
        self.tracker: StepTracker | None = None
        self.pending: dict | None = None
        self.state = "idle"  # idle, starting, paused, running, finished, failed, stopped
        self.run_id: int | None = None
        self._queued: list[tuple[str, dict]] = []
        self._unlogged: list[dict] = []  # steps not yet in the log (drawn in batches while running)
        self._redraw = QTimer(self, singleShot=True, interval=100)
        self._redraw.timeout.connect(self._flush)
        self.handle.sig_step_begin.connect(self._on_begin)
        self.handle.sig_step_paused.connect(self._on_paused)
        self.handle.sig_step.connect(self._on_step)
        self.handle.sig_step_end.connect(self._on_end)

    @property
    def active(self) -> bool:
        return self.state in ("starting", "paused", "running")

    # -- commands ----------------------------------------------------------------------------------
    def step(self) -> None:
        self._command("step", count=1)

    def step_to(self, node_id: str | None) -> None:
        if node_id:
            self._command("step_to", node=node_id)

    def resume(self) -> None:
        self._command("continue")

    def restart(self) -> None:
        if self.active:
            self.stop()
        self._start()

    def stop(self) -> None:
        if self.active:
            self.handle.control("stop_step")
            self.handle.cancel()
            self.state = "stopped"
            self._status("Stepping stopped: the worker released the graph.")
            self.sig_changed.emit()

    def _command(self, cmd: str, **args) -> None:
        if not self.active:
            self._queued = [(cmd, args)]
            self._start()
            return
        if self.state == "starting":
            self._queued.append((cmd, args))
            return
        self.state = "running"
        self.handle.control(cmd, **args)
        self.sig_changed.emit()

    def _start(self) -> None:
        w = self.window
        call = w.call
        if call is None or w.script_path is None:
            self._status("Open a script and pick a backward call to step through.")
            return
        if call.api == "unreached":
            self._status("This graph was never backwarded: there is no backward call to step.")
            return
        self.call = call
        self.steps = []
        self._unlogged = []
        self.tracker = StepTracker(call)
        self.pending = None
        self.state = "starting"
        w.step_log.set_steps(call, [])
        w.step_log.set_status(f"Re-running {Path(w.script_path).name} up to call #{call.index} ({call.api}, "
                              f"line {call.line})…")
        w.graph.clear_states()
        w.memory.chart.clear()
        w._last_saved = None
        device = w.device_box.currentData() or "cpu"
        self.run_id = self.handle.run(w.script_path, device=device, timeout=w.timeout,
                                      step={"call": call.index, "mode": "interactive"},
                                      load=getattr(w, "load_options", None))
        w.begin_busy(f"Starting a stepping session for call #{call.index}")
        w.docks["steps"].show()
        w.docks["steps"].raise_()
        self.sig_changed.emit()

    # -- worker messages ------------------------------------------------------------------------------
    def _on_begin(self, event: dict) -> None:
        if self.state != "starting":
            return
        self.state = "paused"
        self.window.end_busy()
        queued, self._queued = self._queued, []
        for cmd, args in queued:
            if cmd == "step":
                continue  # the first Step is the pause before the first node
            self.state = "running"
            self.handle.control(cmd, **args)
        self.sig_changed.emit()

    def _flush(self) -> None:
        """Log the steps that arrived since the last frame and draw the graph once."""
        self._redraw.stop()
        if self._unlogged:
            self.window.step_log.append_steps(self._unlogged)
            self._unlogged = []
        self._draw()

    def _on_paused(self, event: dict) -> None:
        if not self.active:
            return
        self.state = "paused"
        self.pending = event.get("pending")
        self._flush()
        node = self.call.node(self.pending.get("node")) if self.call and self.pending else None
        if node is not None:
            grads = ", ".join(short_values(g) for g in self.pending.get("grad_outputs") or [])
            label = f" ({node.label})" if node.label else ""
            self._status(f"Step {len(self.steps)}: paused before {node.name}{label}; gradient in: {grads}. "
                         "F10 steps, F5 continues.")
            self.window.show_step_node(node.id)
        self.sig_changed.emit()

    def _on_step(self, event: dict) -> None:
        if self.call is None or event.get("call") != self.call.index:
            return
        record = event["record"]
        self.steps.append(record)
        self.tracker.add(record)
        self._unlogged.append(record)
        if not self._redraw.isActive():
            # Continue streams thousands of steps: draw at most ten frames a second.
            self._redraw.start()

    def _on_end(self, event: dict) -> None:
        if self.call is None or event.get("call") != self.call.index:
            return
        self.state = event.get("state") or "finished"
        self.pending = None
        self._flush()
        error = event.get("error")
        if error:
            failed = next((s for s in self.steps if s.get("error")), None)
            node = self.call.node(failed["node"]) if failed else None
            where = f" at {node.name}" if node else ""
            self._status(f"Backward failed{where}: {error['type']}: {error['message'].splitlines()[0]}")
            if node is not None:
                self.window.show_step_node(node.id)
        elif self.state == "finished":
            self._status(f"Backward finished: {len(self.steps)} nodes executed. Click a step in the log to replay it.")
        self.sig_changed.emit()

    # -- drawing ------------------------------------------------------------------------------------------
    def replay(self, count: int) -> None:
        """Show the graph as it was after ``count`` recorded steps."""
        if self.call is None or not self.steps:
            return
        self._draw(upto=count)
        self.window.step_log.select_step(count)
        record = self.steps[count - 1]
        self._status(f"Replaying step {count - 1}: {record.get('name')} (of {len(self.steps)} recorded)")

    def _draw(self, upto: int | None = None) -> None:
        w = self.window
        if self.call is None or w.call is None or w.call.structure != self.call.structure:
            return
        if upto is None:
            view = self.tracker.view(self.pending)
            texts = view.edge_texts  # the tracker keeps leaf .grad values on their edges
        else:
            view = step_view(self.call, self.steps, None, upto=upto)
            texts = step_texts(self.call, view)
        w.graph.set_node_states(view.states)
        w.graph.set_edge_texts(texts)

    def _status(self, text: str) -> None:
        self.window.step_log.set_status(text)
        self.window.state_label.setText(text)
