"""The main window's opening and running: files in, runs and debug runs started, results shown.

A mixin of ``app.window.window.MainWindow``: the window builds the views, this wires what a run does to
them (the status bar while it runs, the result or its error when it ends, actions enabled by
the session's state). The session (``app.session.session.Session``) owns the run itself.
"""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QFileDialog

from app.session import open_files
from app.session.open_trace import is_trace_path, open_trace
from app.session.session import SessionState
from app.window.views import settings
from core.client.handle import ClientState
from core.protocol import messages as protocol
from core.model.trace import ErrorInfo, Trace
from core.programs.notebook import where as line_where


class RunWiring:
    """Opening files, Run / Debug / Stop, and what the window shows while and after a run goes."""

    def open_dialog(self) -> None:
        start = str(Path(self.script_path).parent) if self.script_path else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Open a script, notebook or model", start, open_files.OPEN_FILTER)
        if path:
            self.open_script(path)

    def open_folder_dialog(self) -> None:
        start = str(Path(self.script_path).parent) if self.script_path else str(Path.home())
        path = QFileDialog.getExistingDirectory(self, "Open a Hugging Face model folder", start)
        if path:
            self.open_script(path)

    def open_script(self, path: str, run: bool = True, load: dict | None = None) -> bool:
        """Open a script, notebook, saved model or Hugging Face folder (``load``: weights,
        input_shapes, trust_pickle), or a saved trace, and run it."""
        p = Path(path)
        if not (p.is_file() or (p.is_dir() and open_files.is_openable(p))):
            self._show_problem(f"{path}: no such file")
            return False
        if is_trace_path(str(p)):
            return open_trace(self, str(p))
        try:
            text, cells = open_files.display_source(p)
        except (OSError, ValueError) as exc:
            self._show_problem(f"{path}: cannot read the file: {exc}")
            return False
        self.load_options = dict(load or {})
        if self.script_path:
            self._watcher.removePath(self.script_path)
        self.script_path = str(p.resolve())
        self._watcher.addPath(self.script_path)
        self._update_title()
        self.source.set_source(text, self.script_path, cells)
        self._add_recent(self.script_path)
        self._update_actions()
        if run:
            self.run_script()
        return True

    def _prepare_run(self) -> bool:
        if not self.script_path:
            return False
        try:
            text, cells = open_files.display_source(self.script_path)
            self.source.set_source(text, self.script_path, cells)
        except (OSError, ValueError):
            pass
        self.output.clear()
        self.memory.chart.clear()
        self._last_saved = None
        self.session.device = self.device_box.currentData() or "cpu"
        self._busy_text = None
        return True

    def run_script(self) -> None:
        """Run (Ctrl+R): capture every call, no pause."""
        if self._prepare_run():
            self.session.run()

    def debug_script(self) -> None:
        """Debug (F9): run the script and pause at each backward call a breakpoint selects."""
        if self._prepare_run():
            self.session.debug()

    def debug_to_call(self, index: int) -> None:
        """Debug, pausing first at call ``index`` (a loop's later call)."""
        if self._prepare_run():
            self.session.debug(skip_to=index)

    def stop(self) -> None:
        self.session.stop()

    def step_to_selected(self) -> None:
        self.session.step_to(self.session.selected)

    def state_label_text(self, text: str) -> None:
        self.state_label.setText(text)

    def _on_session_state(self, state: SessionState) -> None:
        waiting = state in (SessionState.RUNNING, SessionState.DEBUGGING, SessionState.STARTING)
        if waiting:
            if not self._elapsed_timer.isActive():
                self._run_started = time.monotonic()
            if state is not SessionState.RUNNING:
                name = Path(self.script_path or "").name
                note = self.session.one_rank_note()  # a DDP script: one process, not torchrun's ranks
                self._busy_text = f"Debugging {name}{note}" if state is SessionState.DEBUGGING else \
                    f"Re-running {name}{note} to the call"
            self._elapsed_timer.start()
            self.busy.show()
            self._tick()
        else:
            self._elapsed_timer.stop()
            self.busy.hide()
            self._busy_text = None
        self._update_actions()

    def _tick(self) -> None:
        elapsed = time.monotonic() - self._run_started
        device = (self.device_box.currentData() or "cpu").replace("::", ": ")  # "gpu-box: cuda:0"
        text = getattr(self, "_busy_text", None) or f"Running {Path(self.script_path or '').name} on {device}"
        self.state_label.setText(f"{text}… {elapsed:.1f} s")

    def _on_progress(self, event: protocol.CallStarted | protocol.CallDone) -> None:
        if isinstance(event, protocol.CallStarted):
            self.memory.chart.add_call(event.index, float(event.t))
            self.counts_label.setText(f"backward call #{event.index} at {line_where(self.source.cells, event.line)}")

    def _on_finished(self, result) -> None:
        trace: Trace = result.trace
        self._update_actions()
        if trace.error is not None:
            self.last_error = trace.error
            fix = open_files.ask_fix(self, trace.error, self.load_options, self.script_path) \
                if trace.error.reason and self.interactive else None
            if fix is not None:
                script = fix.pop("script", None)
                if script:  # weights opened alone: run them with the script of their model
                    self.open_script(script, load=fix)
                    return
                self.load_options = fix
                self.run_script()
                return
        else:
            self.last_error = None
        keep_previous = not trace.calls and self.trace is not None and trace.error is not None
        if keep_previous:
            # The failed run built no graph: the previous graph stays on screen beside the error.
            self.problems.show_error(trace.error, title=f"Run of {Path(trace.script or '').name} failed")
            self._raise_problems()
            self.state_label.setText(f"Failed after {result.elapsed:.1f} s: {trace.error.type}: "
                                     f"{_first_line(trace.error.message)} — showing the previous result")
            self.sig_trace_shown.emit()
            return
        self.show_trace(trace)
        for error in result.bad_messages:  # kept in Problems with the trace they came with
            self._show_bad_message(error)
        where = f"{self.handle.host}: {trace.device}" if self.handle.host else trace.device
        status = f"Finished in {result.elapsed:.1f} s on {where}"
        if trace.error is not None:
            status = f"Failed after {result.elapsed:.1f} s: {trace.error.type}: {_first_line(trace.error.message)}"
            self._raise_problems()
        self.state_label.setText(status)

    def _on_bad_message(self, error: str) -> None:
        """A worker message did not match the protocol: said at once; the run goes on."""
        self.output.append(f"[Backprop Studio] the worker sent a message the app cannot read: {error}\n")
        self.state_label.setText(f"The worker sent a message the app cannot read: {error}")

    def _show_bad_message(self, error: str) -> None:
        self.problems.show_error(ErrorInfo(type="ProtocolError", message=error, kind="protocol"),
                                 title="The worker sent a message the app cannot read")

    def _on_step_memory(self, event: protocol.StepMemory) -> None:
        """Mark on the chart the saved-tensor memory each stepped node released."""
        saved = int(event.saved_bytes)
        previous = getattr(self, "_last_saved", None)
        if previous is not None and saved < previous:
            self.memory.chart.mark_freed(float(event.t), previous - saved)
        self._last_saved = saved

    def _update_actions(self) -> None:
        running = self.handle.running
        state = self.session.state
        has_script = bool(self.script_path)
        self.act_run.setEnabled(has_script)
        self.act_debug.setEnabled(has_script)
        self.act_stop.setEnabled(running or self.session.active)
        can_step = has_script and (self.session.active or (self.call is not None and self.call.api != "unreached")
                                   or self.trace is None)
        for action in (self.act_step, self.act_continue, self.act_step_to):
            action.setEnabled(can_step)
        self.act_restart.setEnabled(has_script and (self.session.active or self.session.step_call is not None))
        self.act_next_call.setEnabled(has_script)
        self.act_resume.setEnabled(self.session.active)
        # While the worker gets to the pause, Step says that its presses wait for it, and how many do.
        waiting = state in (SessionState.DEBUGGING, SessionState.STARTING, SessionState.STEPPING)
        queued = self.session.queued_steps() if waiting else 0
        self.act_step.setIconText(f"Step ({queued} queued)" if queued else "Step")
        self.act_step.setStatusTip("Presses now wait for the next pause" if waiting
                                   else "Run backward one node at a time: the next node")
        if not running and self.handle.client.state is ClientState.STARTING:
            self.state_label.setText("Starting the worker…")
        elif not running and self.state_label.text().startswith("Starting"):
            self.state_label.setText("Ready")

    def _set_watch(self, on: bool) -> None:
        settings().setValue("rerun_on_change", on)

    def _on_file_changed(self, path: str) -> None:
        # Editors replace files on save: watch the new file under the same path again.
        if Path(path).exists() and path not in self._watcher.files():
            self._watcher.addPath(path)
        if self.act_rerun_on_change.isChecked() and path == self.script_path:
            self._rerun_timer.start()

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if any(open_files.is_openable(u.toLocalFile()) for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        # A .json is a saved trace: opened, not run; a script dropped with weights runs with them.
        path, load = open_files.split_dropped([u.toLocalFile() for u in event.mimeData().urls()])
        if path is not None:
            self.open_script(path, load=load)
            event.acceptProposedAction()

    def open_sent_trace(self, path: str, title: str | None = None) -> None:
        """A trace sent by ``show()``: open it, titled ``title`` (its caller's file:line), and come
        to the front."""
        if open_trace(self, path):
            if title:
                self.name_shown(title)
            self.showNormal()
            self.raise_()
            self.activateWindow()

    def _show_problem(self, message: str) -> None:
        self.problems.show_error(ErrorInfo(type="OpenError", message=message, kind="load"))
        self._raise_problems()
        self.state_label.setText(message)

    def _raise_problems(self) -> None:
        self.docks["problems"].show()
        self.docks["problems"].raise_()


def _first_line(text: str) -> str:
    """The first line of an error message, cut for the status bar (Problems has the rest: a
    label lays out all of its text, and a one-line 1 MB message took minutes)."""
    text = (text or "").strip()
    end = text.find("\n")
    line = text if end < 0 else text[:end]
    line = line.splitlines()[0] if line.strip() else ""
    return line if len(line) <= 300 else line[:300] + "…"
