"""The memory tab: the live chart beside the nodes that hold saved tensors in the selected call.

A row of controls above the chart: zoom to one call's iteration, overlay every iteration,
keep this run as a reference for the next one (a leak beside its fix on one scale), export.
A note under it says what the chart measures on this device and what CUDA adds; under that, when
the run checkpoints a model it also runs plain, the peak saved bytes of both (``show_trace``).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from core.model.memory import format_bytes, held_by_nodes
from core.model.memory_lessons import checkpoint_saving
from core.model.trace import CallInfo, Trace
from widgets.memory.chart import MemoryChart
from widgets.memory.export import export_chart
from widgets.memory.lessons import checkpoint_notes, keeper_texts

CPU_NOTE = "CPU: RSS and saved tensors; allocated / reserved appear on CUDA"
CUDA_NOTE = "CUDA: allocated, reserved, the cache between them, saved tensors"
CPU_TIP = ("CPU run: process RSS (left) and the bytes autograd saves for backward (right, dashed). "
           "On CUDA the chart shows the allocator's allocated and reserved memory and the cache between them.")
CUDA_TIP = ("CUDA run: allocated (live tensors), reserved (held by the caching allocator), the shaded cache "
            "between them, and saved tensors (right). Hover the chart for details.")


class MemoryPanel(QWidget):
    sig_node_selected = Signal(str)
    """A node in the "who holds memory" list was chosen; carries the node id."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.chart = MemoryChart(self)
        self._samples: list = []
        self._script = ""
        self._pinned: tuple[list, str] | None = None
        self.call_box = QSpinBox(self, minimum=0, maximum=0, prefix="call #")
        self.call_box.setToolTip("Which backward call's iteration to zoom to")
        self.fit_button = QPushButton("Fit call", self, toolTip="Zoom the time axis to this call's iteration "
                                      "(forward, backward and what follows)")
        self.whole_button = QPushButton("Whole run", self, toolTip="Show the whole run, worker start included "
                                        "(double-click the chart); a finished run opens on its first call")
        self.overlay_box = QCheckBox("Overlay iterations", self,
                                     toolTip="Draw every iteration from its own start, one over the other")
        self.pin_button = QPushButton("Keep as reference", self, toolTip="Keep this run on the chart and draw the "
                                      "next run over it, on the same scale (a leak beside its fix)")
        self.unpin_button = QPushButton("Drop reference", self, toolTip="Stop drawing the reference run")
        self.export_button = QPushButton("Export…", self, toolTip="Save the chart as PNG or SVG (print theme)")
        self.note = QLabel(CPU_NOTE, self)  # what this run's chart measures; the tooltip says more
        self.note.setToolTip(CPU_TIP)
        self.note.setStyleSheet("color: palette(placeholder-text)")
        self.note.setWordWrap(True)
        self.chart.setMinimumHeight(170)  # the plot stays readable however short the dock
        controls = QHBoxLayout()
        controls.setContentsMargins(2, 0, 2, 0)
        for w in (self.call_box, self.fit_button, self.whole_button, self.overlay_box, self.pin_button,
                  self.unpin_button, self.export_button):
            controls.addWidget(w)
        controls.addStretch(1)
        self.fit_button.clicked.connect(lambda: self.chart.fit_call(self.call_box.value()))
        self.whole_button.clicked.connect(self.chart.show_whole_run)
        self.overlay_box.toggled.connect(self.chart.set_overlay)
        self.pin_button.clicked.connect(self.pin_reference)
        self.unpin_button.clicked.connect(self.drop_reference)
        self.export_button.clicked.connect(self._export_dialog)
        self.unpin_button.setEnabled(False)
        chart_box = QWidget(self)
        chart_layout = QVBoxLayout(chart_box)
        chart_layout.setContentsMargins(0, 0, 0, 0)
        chart_layout.setSpacing(2)
        chart_layout.addLayout(controls)
        chart_layout.addWidget(self.chart, 1)
        self.held = QTreeWidget(self)
        self.held.setHeaderLabels(["node", "saved bytes", "tensors"])
        self.held.setRootIsDecorated(False)
        self.held.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.total = QLabel("Select a call to see which nodes hold its saved tensors.", self)
        self.total.setWordWrap(True)
        self.lesson = QLabel("", self)  # "with checkpointing: peak saved 1.5 MB; without: 3.5 MB (calls #3 and #7)"
        self.lesson.setWordWrap(True)
        self.lesson.setStyleSheet("font-weight: 600")
        self.lesson.setToolTip("The most saved tensors held at once by a checkpointed call, counting the block "
                               "backward recomputes (its nested call), beside the same model without "
                               "checkpointing. The chart's saved line follows the graphs the script names, so "
                               "it leaves out a block recomputed inside backward.")
        self.lesson.hide()
        side = QWidget(self)
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 0, 0)
        side_layout.addWidget(self.note)
        side_layout.addWidget(self.lesson)
        side_layout.addWidget(self.total)
        side_layout.addWidget(self.held)
        split = QSplitter(Qt.Orientation.Horizontal, self)
        split.addWidget(chart_box)
        split.addWidget(side)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split)
        self.held.itemClicked.connect(
            lambda item, _c: self.sig_node_selected.emit(item.data(0, Qt.ItemDataRole.UserRole)))

    def set_call(self, call: CallInfo | None) -> None:
        self.held.clear()
        if call is None or not call.nodes:
            self.total.setText("This call keeps no graph snapshot (a repeated loop call): pick a full one.")
            return
        rows, total = held_by_nodes(call)
        self.total.setText(f"Call #{call.index}: {len(rows)} nodes hold {format_bytes(total)} of saved tensors "
                           "(freed by backward unless retain_graph=True).")
        for row in rows:
            label = f"{row.name} ({row.label})" if row.label else row.name
            item = QTreeWidgetItem([label, format_bytes(row.bytes), str(row.tensors)])
            item.setData(0, Qt.ItemDataRole.UserRole, row.node)
            item.setTextAlignment(1, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.held.addTopLevelItem(item)

    def row_count(self) -> int:
        return self.held.topLevelItemCount()

    # -- runs ----------------------------------------------------------------------------------------
    def show_trace(self, trace: Trace) -> None:
        """A finished run's trace: its samples, what keeps its graphs alive, checkpointing's saving."""
        if not trace.memory:
            return
        self.set_run(trace.memory, trace.script, trace.call_count)
        self.chart.set_lessons(keeper_texts(trace), trace.cells)
        notes = checkpoint_notes(trace)
        self.lesson.setText("\n".join(notes))
        self.lesson.setVisible(bool(notes))
        for s in checkpoint_saving(trace):  # a note at each call's start, the labels facing each other
            starts = {m.call: m.t for m in trace.memory if m.call in (s.with_call.index, s.without_call.index)}
            if len(starts) < 2:
                continue
            later = max(starts, key=starts.get)
            for call, nbytes, what in ((s.with_call, s.with_bytes, "with checkpointing"),
                                       (s.without_call, s.without_bytes, "without")):
                self.chart.add_marker(starts[call.index], f"#{call.index} {what}: peak saved {format_bytes(nbytes)}",
                                      left=call.index == later, position=0.6)

    def set_run(self, samples, script: str = "", call_count: int = 0) -> None:
        """A finished run: its samples (kept for pinning and export) and how many calls it made."""
        self._samples = list(samples)
        self._script = script
        self.call_box.setMaximum(max(call_count - 1, 0))
        cuda = bool(self._samples) and str(getattr(self._samples[-1], "device", "cpu")).startswith("cuda")
        self.note.setText(CUDA_NOTE if cuda else CPU_NOTE)
        self.note.setToolTip(CUDA_TIP if cuda else CPU_TIP)
        self.chart.set_samples(self._samples)
        if self._pinned is not None:
            self.chart.set_reference(*self._pinned)

    def pin_reference(self) -> None:
        """Keep the current run as the reference the next runs are drawn against."""
        if not self._samples:
            return
        self._pinned = (self._samples, Path(self._script).stem or "reference")
        self.unpin_button.setEnabled(True)
        self.pin_button.setText(f"Reference: {self._pinned[1]}")

    def drop_reference(self) -> None:
        self._pinned = None
        self.chart.clear_reference()
        self.chart.flush()
        self.unpin_button.setEnabled(False)
        self.pin_button.setText("Keep as reference")

    def export(self, path) -> Path:
        """Write the chart (with its reference and zoom) to ``path`` (.png or .svg) in the print theme."""
        return export_chart(self.chart, path)

    def _export_dialog(self) -> None:
        stem = Path(self._script).stem or "memory"
        path, _ = QFileDialog.getSaveFileName(self, "Export the memory chart", f"{stem}-memory.svg",
                                              "SVG (*.svg);;PNG (*.png)")
        if not path:
            return
        try:
            self.export(path)
        except (OSError, ValueError) as exc:
            QMessageBox.warning(self, "Export failed", str(exc))
