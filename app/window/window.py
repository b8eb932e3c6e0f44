"""The main window: builds the views and wires them to the session.

The state (trace, current call, selection, run / debug / stepping) is the session's
(``app.session.session.Session``); a node picked in the graph, the inspector, the source, the calls
list or the problems list becomes the session's one selection, and every view follows it.
What the window does is in focused mixins: ``app.window.views`` (docks, status bar, settings),
``app.window.run`` (opening and running), ``app.window.selection`` (showing and selecting).
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QFileSystemWatcher, QTimer, Signal
from PySide6.QtWidgets import QMainWindow, QMessageBox

from app.window.actions import build_actions, build_menus, build_toolbar
from app.window.export_dialog import add_export_action
from app.session.forward_debug import install as install_forward_debug
from app.session.host_devices import install as install_hosts
from app.session.host_devices import keep_picked
from app.session.open_trace import add_open_trace_action
from app.session.ranks import install as install_ranks
from app.window.resources import icon
from app.window.screen_fit import fit_window
from app.session.session import Session
from app.session.stepping import StepController
from app.window.run import RunWiring
from app.window.selection import SelectionWiring
from app.window.title import TitleWiring
from app.window.views import WindowViews, settings
from app.session.worker_handle import WorkerHandle
from core.model.trace import CallInfo, Trace

log = logging.getLogger(__name__)


class MainWindow(RunWiring, SelectionWiring, TitleWiring, WindowViews, QMainWindow):
    sig_trace_shown = Signal()
    """A run's result is on screen (graph laid out and drawn, or its error shown)."""

    def __init__(self, handle: WorkerHandle | None = None, timeout: float = 600.0):
        super().__init__()
        self.setWindowTitle("Backprop Studio")
        self.setWindowIcon(icon("app"))
        self.setAcceptDrops(True)
        self.resize(1400, 860)
        self.last_error = None
        # False with --screenshot: nobody can answer a dialog, so a fix that needs one is not offered
        self.interactive = True
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
        install_hosts(self)  # saved hosts' devices join the picker
        install_ranks(self)  # Run > Run with torchrun…, and the DDP rank picker over the Calls list
        install_forward_debug(self)  # pauses in forward: Step Over / Into / Out, the new nodes' marks

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
        """How the open file is loaded: weights, input_shapes, trust_pickle (see core.programs.program)."""
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

    def debug_to_nan(self) -> None:
        """Run > Run to First NaN/Inf: debug with the NaN/Inf check on, pausing at the first one."""
        if self._prepare_run():
            self.session.debug(to_nan=True)

    # -- wiring ---------------------------------------------------------------------------------------
    def _connect(self) -> None:
        h = self.handle
        h.sig_devices.connect(self.set_devices)
        h.sig_state.connect(lambda s: self._update_actions())
        h.sig_output.connect(self.output.append)
        h.sig_progress.connect(self._on_progress)
        h.sig_bad_message.connect(self._on_bad_message)
        s = self.session
        s.sig_result.connect(self._on_finished)
        self._connect_title()  # after _on_finished: a result is titled once it is shown
        s.sig_state.connect(self._on_session_state)
        s.sig_trace.connect(self.calls.set_trace)
        s.sig_call.connect(self._on_call)
        self._follow_selection()
        self.calls.sig_debug_to_call.connect(self.debug_to_call)
        h.sig_memory.connect(self.memory.chart.append_samples)
        h.sig_step_memory.connect(self._on_step_memory)
        self.memory.chart.sig_call_selected.connect(self._select_call_index)
        self.memory.sig_node_selected.connect(self.select_node)
        self.calls.sig_call_selected.connect(self.show_call)
        self.graph.sig_select_requested.connect(self.select_node)
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
        if index < 0:  # a saved host's device: its host fills the rest
            index = keep_picked(self.device_box, current, self.handle.hosts)
        self.device_box.setCurrentIndex(max(index, 0))
        self._update_actions()

    def _update_zoom_label(self) -> None:
        self.zoom_label.setText(f"zoom {self.graph.zoom_percent():.0f} %")

    def closeEvent(self, event) -> None:
        s = settings()
        s.setValue("geometry", self.saveGeometry())
        s.setValue("window_state", self.saveState())
        s.setValue("device", self.device_box.currentData() or "cpu")
        self.handle.close()
        super().closeEvent(event)

    def about(self) -> None:
        QMessageBox.about(
            self,
            "About Backprop Studio",
            "<b>Backprop Studio</b><br>See PyTorch's autograd: every grad_fn graph a script builds, "
            "every tensor's state, and backward step by step.",
        )
