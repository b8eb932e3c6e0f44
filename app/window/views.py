"""The main window's views: the centre tabs, the docks, the status bar, settings and recent files.

A mixin of ``app.window.window.MainWindow`` (construction only: the wiring is in ``app.window.window``).
"""

from __future__ import annotations

import os

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer
from PySide6.QtWidgets import QDockWidget, QLabel, QProgressBar, QTabWidget, QWidget

from widgets.panels.calls import CallsPanel
from widgets.panels.curves import CurvesPanel
from widgets.panels.grad_health import GradHealthPanel
from widgets.graph.view import GraphView
from widgets.graph.replay import ForwardReplayer
from widgets.panels.inspector import InspectorPanel
from widgets.memory.panel import MemoryPanel
from widgets.panels.output import OutputPanel
from widgets.panels.problems import ProblemsPanel
from widgets.panels.source import SourcePanel
from widgets.panels.step_log import StepLogPanel
from widgets.storage.view import StorageView
from widgets.panels.tensors import TensorsPanel

MAX_RECENT = 10


def settings() -> QSettings:
    path = os.environ.get("BACKPROP_STUDIO_SETTINGS")
    if path:
        return QSettings(path, QSettings.Format.IniFormat)
    return QSettings("Backprop Studio", "Backprop Studio")


class WindowViews:
    """Builds the window's views and docks and restores what the user arranged."""

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
        self.grad_health = GradHealthPanel(self)
        self.replay = ForwardReplayer(self.graph, self.source, self.memory.chart)  # View > Replay Forward
        self.grad_health.sig_call_selected.connect(self._select_call_index)
        self.curves = CurvesPanel(self)  # the loss and the small leaves over the calls
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
        self.left_tabs.addTab(self.grad_health, "Gradients")
        self.left_tabs.addTab(self.curves, "Curves")
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
