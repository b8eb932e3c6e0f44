"""The main window: builds the views and wires them to the session.

The state (trace, current call, selection, run / debug / stepping) is the session's
(``app.session.Session``); a node picked in the graph, the inspector, the source, the calls
list or the problems list becomes the session's one selection, and every view follows it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from PySide6.QtCore import QByteArray, QFileSystemWatcher, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QTabWidget,
    QWidget,
)

from app import open_files
from app.actions import build_actions, build_menus, build_toolbar
from app.open_trace import add_open_trace_action, is_trace_path, open_trace
from core.client import read_script
from app.export_dialog import add_export_action
from app.resources import icon
from app.screen_fit import fit_window
from app.session import Session
from app.step_controller import StepController
from app.worker_handle import WorkerHandle
from core.trace import CallInfo, Trace
from widgets.calls_panel import CallsPanel
from widgets.graph_view import GraphView
from widgets.inspector import InspectorPanel
from widgets.memory_panel import MemoryPanel
from widgets.output_panel import OutputPanel
from widgets.problems_panel import ProblemsPanel
from widgets.source_view import SourcePanel
from widgets.step_log import StepLogPanel
from widgets.storage_view import StorageView
from widgets.tensors_panel import TensorsPanel

log = logging.getLogger(__name__)

MAX_RECENT = 10


def settings() -> QSettings:
    import os

    path = os.environ.get("BACKPROP_STUDIO_SETTINGS")
    if path:
        return QSettings(path, QSettings.Format.IniFormat)
    return QSettings("Backprop Studio", "Backprop Studio")


class MainWindow(QMainWindow):
    sig_trace_shown = Signal()
    """A run's result is on screen (graph laid out and drawn, or its error shown)."""

    def __init__(self, handle: WorkerHandle | None = None, timeout: float = 600.0):
        super().__init__()
        self.setWindowTitle("Backprop Studio")
        self.setWindowIcon(icon("app"))
        self.setAcceptDrops(True)
        self.resize(1400, 860)
        self.last_error = None
        self._run_started = 0.0
        self.handle = handle or WorkerHandle(self)
        self.session = Session(self.handle, self)
        self.session.timeout = timeout
        self._build_views()
        self.steps_dock = self.docks["steps"]
        self.stepper = StepController(self.session, self, self.state_label_text, self)
        build_actions(self)
        build_toolbar(self)
        build_menus(self)
        add_export_action(self)
        add_open_trace_action(self)
        self._build_status()
        self._connect()
        self._watcher = QFileSystemWatcher(self)
        self._watcher.fileChanged.connect(self._on_file_changed)
        self._rerun_timer = QTimer(self, singleShot=True, interval=400)
        self._rerun_timer.timeout.connect(self.run_script)
        self._restore_settings()
        fit_window(self, settings())  # the first size follows the screen, remembered per screen
        self._update_actions()
        from app.host_devices import install as install_hosts

        install_hosts(self)  # saved hosts' devices join the picker
        from app.ranks import install as install_ranks

        install_ranks(self)  # Run > Run with torchrun…, and the DDP rank picker over the Calls list

    # -- the session's state, as the exporters and tests read it --------------------------------------
    @property
    def timeout(self) -> float:
        return self.session.timeout

    @property
    def script_path(self) -> str | None:
        return self.session.script_path

    @script_path.setter
    def script_path(self, path: str | None) -> None:
        self.session.script_path = path

    @property
    def load_options(self) -> dict:
        """How the open file is loaded: weights, input_shapes, trust_pickle (see core.programs)."""
        return self.session.load_options

    @load_options.setter
    def load_options(self, options: dict) -> None:
        self.session.load_options = dict(options)

    @property
    def trace(self) -> Trace | None:
        return self.session.trace

    @property
    def call(self) -> CallInfo | None:
        return self.session.call

    # -- construction ---------------------------------------------------------------------------------
    def _build_views(self) -> None:
        self.graph = GraphView(self)
        # The centre shows the graph, or a tensor's storage drawn large (Ctrl+1 / Ctrl+2).
        self.center = QTabWidget(self)
        self.center.setDocumentMode(True)
        self.center.setTabPosition(QTabWidget.TabPosition.South)
        self.setCentralWidget(self.center)
        self.calls = CallsPanel(self)
        self.inspector = InspectorPanel(self)
        self.source = SourcePanel(self)
        self.output = OutputPanel(self)
        self.problems = ProblemsPanel(self)
        self.step_log = StepLogPanel(self)
        self.memory = MemoryPanel(self)
        self.storage = StorageView(self)
        self.tensors = TensorsPanel(self)
        self.center.addTab(self.graph, "Graph")
        self.center.addTab(self.storage, "Storage")
        self._tensor_scope = "call"
        self.docks: dict[str, QDockWidget] = {}
        # Calls and Tensors share one dock as tabs: a second group of tabified docks left a
        # stale duplicate tab bar drawn over the panels.
        self.left_tabs = QTabWidget(self)
        self.left_tabs.setDocumentMode(True)
        self.left_tabs.setTabPosition(QTabWidget.TabPosition.South)
        self.left_tabs.addTab(self.calls, "Calls")
        self.left_tabs.addTab(self.tensors, "Tensors")
        self._dock("calls", "Calls and Tensors", self.left_tabs, Qt.DockWidgetArea.LeftDockWidgetArea)
        self._dock("inspector", "Inspector", self.inspector, Qt.DockWidgetArea.RightDockWidgetArea)
        bottom = Qt.DockWidgetArea.BottomDockWidgetArea
        self._dock("source", "Source", self.source, bottom)
        self._dock("output", "Output", self.output, bottom)
        self._dock("problems", "Problems", self.problems, bottom)
        self._dock("steps", "Step Log", self.step_log, bottom)
        self._dock("memory", "Memory", self.memory, bottom)
        for key in ("output", "problems", "steps", "memory"):
            self.tabifyDockWidget(self.docks["source"], self.docks[key])
        self.docks["source"].raise_()
        self.resizeDocks([self.docks["calls"], self.docks["inspector"]], [230, 360], Qt.Orientation.Horizontal)
        self.resizeDocks([self.docks["source"]], [230], Qt.Orientation.Vertical)

    def _dock(self, key: str, title: str, widget: QWidget, area) -> None:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"dock_{key}")
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        self.docks[key] = dock

    def _build_status(self) -> None:
        bar = self.statusBar()
        self.state_label = QLabel("Starting the worker…")
        self.busy = QProgressBar(self)
        self.busy.setRange(0, 0)
        self.busy.setFixedWidth(120)
        self.busy.setMaximumHeight(14)
        self.busy.hide()
        self.counts_label = QLabel("")
        self.zoom_label = QLabel("")
        bar.addWidget(self.state_label, 1)
        bar.addPermanentWidget(self.busy)
        bar.addPermanentWidget(self.counts_label)
        bar.addPermanentWidget(self.zoom_label)
        self._elapsed_timer = QTimer(self, interval=100)
        self._elapsed_timer.timeout.connect(self._tick)

    def _connect(self) -> None:
        h = self.handle
        h.sig_devices.connect(self.set_devices)
        h.sig_state.connect(lambda s: self._update_actions())
        h.sig_output.connect(self.output.append)
        h.sig_progress.connect(self._on_progress)
        s = self.session
        s.sig_result.connect(self._on_finished)
        s.sig_state.connect(self._on_session_state)
        s.sig_trace.connect(self.calls.set_trace)
        s.sig_call.connect(self._on_call)
        s.sig_selection.connect(self._on_selection)
        self.calls.sig_debug_to_call.connect(self.debug_to_call)
        h.sig_memory.connect(self.memory.chart.append_samples)
        h.sig_step_memory.connect(self._on_step_memory)
        self.memory.chart.sig_call_selected.connect(self._select_call_index)
        self.memory.sig_node_selected.connect(self.select_node)
        self.calls.sig_call_selected.connect(self.show_call)
        self.graph.sig_node_selected.connect(self.select_node)
        self.graph.sig_scene_ready.connect(self._on_scene_ready)
        self.graph.sig_open_call.connect(self._select_call_from_elsewhere)
        self.graph.sig_zoom_changed.connect(lambda p: self.zoom_label.setText(f"zoom {p} %"))
        self.inspector.sig_node_selected.connect(self.select_node)
        self.inspector.sig_tensor_selected.connect(self.select_tensor)
        self.inspector.sig_line_selected.connect(self.select_line)
        self.source.sig_line_clicked.connect(self.select_line)
        self.problems.sig_line_activated.connect(self.select_line)
        self.problems.sig_call_selected.connect(self._select_call_from_elsewhere)
        self.problems.sig_node_selected.connect(self.select_node)
        self.step_log.sig_step_selected.connect(self.stepper.replay)
        self.storage.sig_tensor_selected.connect(self.select_tensor)
        self.tensors.sig_tensor_selected.connect(lambda tid: self.select_tensor(tid, scope="top"))
        self.stepper.sig_changed.connect(self._update_actions)
        if h.devices:
            self.set_devices(h.devices)

    # -- opening and running ---------------------------------------------------------------------------
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
        self.setWindowTitle(f"{p.name} — Backprop Studio")
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
        self.session.step_to(self.session.selected or self.graph.selected_node())

    def state_label_text(self, text: str) -> None:
        self.state_label.setText(text)

    def _on_session_state(self, state: str) -> None:
        waiting = state in ("running", "debugging", "starting")
        if waiting:
            if not self._elapsed_timer.isActive():
                self._run_started = time.monotonic()
            if state != "running":
                name = Path(self.script_path or "").name
                self._busy_text = f"Debugging {name}" if state == "debugging" else f"Re-running {name} to the call"
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

    def _on_progress(self, event: dict) -> None:
        if event.get("type") == "call" and event.get("t") is not None:
            self.memory.chart.add_call(int(event.get("index", 0)), float(event["t"]))
        if event.get("type") == "call":
            self.counts_label.setText(f"backward call #{event.get('index')} at line {event.get('line')}")

    def _on_finished(self, result) -> None:
        trace: Trace = result.trace
        self._update_actions()
        if trace.error is not None:
            self.last_error = trace.error
            fix = open_files.ask_fix(self, trace.error, self.load_options, self.script_path) \
                if trace.error.reason else None
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
        status = f"Finished in {result.elapsed:.1f} s on {trace.device}"
        if trace.error is not None:
            status = f"Failed after {result.elapsed:.1f} s: {trace.error.type}: {_first_line(trace.error.message)}"
            self._raise_problems()
        self.state_label.setText(status)

    def show_trace(self, trace: Trace) -> None:
        """Show a trace: calls list, problems, memory, and the first call's graph."""
        self.inspector.cells = trace.cells
        if trace.source and (trace.cells or trace.mode == "model"):
            # What ran: a notebook's cells, or the script that opened a saved model.
            self.source.set_source(trace.source, trace.script, trace.cells)
        self.session.set_trace(trace)
        if trace.memory:
            self.memory.set_run(trace.memory, trace.script, trace.call_count)
        self.tensors.set_tensors(trace.tensors)
        self.problems.set_trace(trace)
        if trace.error is not None:
            self.problems.show_error(trace.error)
        nodes = sum(c.node_count for c in trace.calls)
        self.counts_label.setText(f"{len(trace.calls)} graph(s), {trace.call_count} backward call(s), {nodes} nodes")
        first = next((c for c in trace.calls if c.snapshot == "full" and c.nodes), None)
        if first is None:
            self.session.set_call(None)
            named = [t for t in trace.tensors if t.name]
            if named:
                # No graph: the script is about tensors themselves; show them.
                self.left_tabs.setCurrentWidget(self.tensors)
                self.select_tensor(named[0].id, scope="top")
                self.center.setCurrentWidget(self.storage)
            self.sig_trace_shown.emit()
            return
        self.left_tabs.setCurrentWidget(self.calls)
        self.calls.select_call(first.id)
        self.show_call(first.id)

    def show_call(self, call_id: str) -> None:
        if self.trace is None:
            return
        call = next((c for c in self.trace.calls if c.id == call_id), None)
        if call is None:
            return
        if call.snapshot == "summary" and call.same_as:
            # A repeated call keeps only its summary: show the graph it repeats.
            self.inspector.clear()
            same = next((c for c in self.trace.calls if c.id == call.same_as), None)
            if same is not None and same is not self.call:
                self.session.set_call(same)
            return
        if call is not self.call:
            self.session.set_call(call)

    def _on_call(self, call: CallInfo | None) -> None:
        """The session's current call changed: every view shows it."""
        self.inspector.clear()
        self.source.clear_highlight()
        if call is None:
            self.graph.set_call(None)
            self.storage.clear()
            self._update_actions()
            return
        self.graph.set_peer_calls(self.trace.calls if self.trace is not None else [])
        self.graph.set_call(call)
        self.memory.set_call(call)
        self.center.setCurrentWidget(self.graph)
        self._update_actions()

    def _on_scene_ready(self, _call_id: str = "") -> None:
        self._update_zoom_label()
        if self.call is not None and self.session.selected is None and self.call.roots:
            # Describe the root (the loss) without moving the fitted view.
            self.inspector.show_node(self.call, self.call.roots[0])
        self.sig_trace_shown.emit()

    def _select_call_index(self, index: int) -> None:
        if self.trace is None:
            return
        call = next((c for c in self.trace.calls if c.index == index), None)
        if call is not None:
            self._select_call_from_elsewhere(call.id)

    def _on_step_memory(self, event: dict) -> None:
        """Mark on the chart the saved-tensor memory each stepped node released."""
        saved = int(event.get("saved_bytes", 0))
        previous = getattr(self, "_last_saved", None)
        if previous is not None and saved < previous:
            self.memory.chart.mark_freed(float(event.get("t", 0.0)), previous - saved)
        self._last_saved = saved

    def _select_call_from_elsewhere(self, call_id: str) -> None:
        self.calls.select_call(call_id)
        self.show_call(call_id)

    # -- selection -----------------------------------------------------------------------------------
    def select_node(self, node_id: str) -> None:
        """Make a node the selection (the session's; every view follows)."""
        self.session.select(node_id)

    def _on_selection(self, node_id: str) -> None:
        if not node_id or self.call is None or self.call.node(node_id) is None:
            return
        self._tensor_scope = "call"
        node = self.call.node(node_id)
        tensor_id = node.variable or node.tensor
        if tensor_id is not None and self.call.tensor(tensor_id) is not None:
            self.storage.set_tensor(self.call.tensors, tensor_id, self.call.storages)
        elif node.label and self.trace is not None:  # e.g. an AccumulateGrad whose leaf the call did not keep
            leaf = next((t for t in self.trace.tensors if t.name == node.label), None)
            if leaf is not None:
                self.storage.set_tensor(self.trace.tensors, leaf.id, self.trace.storages)
        if self.graph.selected_node() != node_id:
            self.graph.select_node(node_id)
        self.inspector.show_node(self.call, node_id)
        if node.line:
            self.source.highlight_lines([node.line])
        else:
            self.source.clear_highlight()

    def select_tensor(self, tensor_id: str, scope: str | None = None) -> None:
        """Show a tensor in the inspector and its storage; ``scope`` is "call" (the graph's
        tensors) or "top" (the tensors named when the script ended); ids are per scope."""
        scope = scope or self._tensor_scope
        if scope == "call" and self.call is not None:
            tensors, storages = self.call.tensors, self.call.storages
        elif self.trace is not None:
            tensors, storages, scope = self.trace.tensors, self.trace.storages, "top"
        else:
            return
        by_id = {t.id: t for t in tensors}
        if tensor_id not in by_id:
            return
        self._tensor_scope = scope
        self.inspector.show_tensor(by_id, tensor_id)
        self.storage.set_tensor(tensors, tensor_id, storages)
        if scope == "top":
            self.tensors.select_tensor(tensor_id)

    def select_named(self, name: str) -> bool:
        """Select a node or tensor by its script name (used by --select for screenshots)."""
        if self.call is not None:
            node = next((n for n in self.call.nodes if n.label == name or n.name == name), None)
            if node is not None:
                self.select_node(node.id)
                return True
        if self.trace is not None:
            t = next((t for t in self.trace.tensors if t.name == name), None)
            if t is not None:
                self.left_tabs.setCurrentWidget(self.tensors)
                self.select_tensor(t.id, scope="top")
                self.center.setCurrentWidget(self.storage)
                return True
        return False

    def select_line(self, line: int) -> None:
        """Select the nodes a script line created (the first one is centred)."""
        if self.call is None:
            self.source.highlight_lines([line])
            return
        nodes = [n for n in self.call.nodes if n.line == line]
        if nodes:
            self.session.select(nodes[0].id)
            self.source.highlight_lines([line])
            self.state_label.setText(f"Line {line} created {len(nodes)} node(s)")
        else:
            self.source.highlight_lines([line])
            self.state_label.setText(f"Line {line} created no node of this graph")

    def focus_search(self) -> None:
        self.search_box.setFocus()
        self.search_box.selectAll()

    def search(self) -> None:
        text = self.search_box.text().strip()
        if not text:
            return
        matches = self.graph.search(text)
        if matches and self.call is not None:
            # A node whose variable or op name is exactly the text comes first.
            want = text.lower()
            exact = [m for m in matches
                     if want in ((self.call.node(m).label or "").lower(), self.call.node(m).name.lower())]
            matches = exact + [m for m in matches if m not in exact]
        if matches:
            self.select_node(matches[0])
            self.state_label.setText(f"{len(matches)} match(es) for '{text}'")
        else:
            self.state_label.setText(f"No node matches '{text}'")

    # -- devices, settings, files --------------------------------------------------------------------
    def set_devices(self, devices: list) -> None:
        current = self.device_box.currentData() or settings().value("device", "cpu")
        self.device_box.clear()
        for d in devices:
            if d.get("kind") == "error":
                continue
            label = d["name"] if d["id"] == "cpu" else f"{d['id']} — {d['name']}"
            self.device_box.addItem(label, d["id"])
        index = self.device_box.findData(current)
        self.device_box.setCurrentIndex(max(index, 0))
        self._update_actions()

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
        # While the worker gets to the pause, Step says that its presses wait for it.
        waiting = state in ("debugging", "starting", "stepping")
        self.act_step.setIconText("Step (queued)" if waiting else "Step")
        self.act_step.setStatusTip("Presses now wait for the next pause" if waiting
                                   else "Run backward one node at a time: the next node")
        if not running and self.handle.client.state == "starting":
            self.state_label.setText("Starting the worker…")
        elif not running and self.state_label.text().startswith("Starting"):
            self.state_label.setText("Ready")

    def _update_zoom_label(self) -> None:
        self.zoom_label.setText(f"zoom {self.graph.zoom_percent():.0f} %")

    def _set_watch(self, on: bool) -> None:
        settings().setValue("rerun_on_change", on)

    def _on_file_changed(self, path: str) -> None:
        # Editors replace files on save: watch the new file under the same path again.
        if Path(path).exists() and path not in self._watcher.files():
            self._watcher.addPath(path)
        if self.act_rerun_on_change.isChecked() and path == self.script_path:
            self._rerun_timer.start()

    def _add_recent(self, path: str) -> None:
        s = settings()
        recent = [p for p in (s.value("recent", []) or []) if p != path]
        recent.insert(0, path)
        s.setValue("recent", recent[:MAX_RECENT])
        self._fill_recent()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        recent = settings().value("recent", []) or []
        if isinstance(recent, str):
            recent = [recent]
        for path in recent:
            action = self.recent_menu.addAction(path)
            action.triggered.connect(lambda _=False, p=path: self.open_script(p))
        self.recent_menu.setEnabled(bool(recent))

    def _restore_settings(self) -> None:
        s = settings()
        geometry = s.value("geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        state = s.value("window_state")
        if isinstance(state, QByteArray):
            self.restoreState(state)
        self.act_rerun_on_change.setChecked(str(s.value("rerun_on_change", "false")).lower() == "true")
        self.graph.legend.set_folded(str(s.value("legend_folded", "false")).lower() == "true")
        self.graph.legend.sig_folded.connect(lambda folded: settings().setValue("legend_folded", folded))
        self._fill_recent()

    def closeEvent(self, event) -> None:
        s = settings()
        s.setValue("geometry", self.saveGeometry())
        s.setValue("window_state", self.saveState())
        s.setValue("device", self.device_box.currentData() or "cpu")
        self.handle.close()
        super().closeEvent(event)

    # -- drag and drop ---------------------------------------------------------------------------------
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if any(open_files.is_openable(u.toLocalFile()) for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        # A .json is a saved trace: opened, not run; a script dropped with weights runs with them.
        path, load = open_files.split_dropped([u.toLocalFile() for u in event.mimeData().urls()])
        if path is not None:
            self.open_script(path, load=load)
            event.acceptProposedAction()

    def open_sent_trace(self, path: str) -> None:
        """A trace sent by ``show()``: open it and come to the front."""
        if open_trace(self, path):
            self.showNormal()
            self.raise_()
            self.activateWindow()

    # -- messages ------------------------------------------------------------------------------------------
    def _show_problem(self, message: str) -> None:
        from core.trace import ErrorInfo

        self.problems.show_error(ErrorInfo(type="OpenError", message=message, kind="load"))
        self._raise_problems()
        self.state_label.setText(message)

    def _raise_problems(self) -> None:
        self.docks["problems"].show()
        self.docks["problems"].raise_()

    def about(self) -> None:
        QMessageBox.about(
            self,
            "About Backprop Studio",
            "<b>Backprop Studio</b><br>See PyTorch's autograd: every grad_fn graph a script builds, "
            "every tensor's state, and backward step by step.",
        )


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""
