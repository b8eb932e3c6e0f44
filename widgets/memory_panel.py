"""The memory tab: the live chart beside the nodes that hold saved tensors in the selected call."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHeaderView, QLabel, QSplitter, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from core.held_memory import format_bytes, held_by_nodes
from core.trace import CallInfo
from widgets.memory_chart import MemoryChart


class MemoryPanel(QWidget):
    sig_node_selected = Signal(str)
    """A node in the "who holds memory" list was chosen; carries the node id."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.chart = MemoryChart(self)
        self.held = QTreeWidget(self)
        self.held.setHeaderLabels(["node", "saved bytes", "tensors"])
        self.held.setRootIsDecorated(False)
        self.held.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.total = QLabel("Select a call to see which nodes hold its saved tensors.", self)
        self.total.setWordWrap(True)
        side = QWidget(self)
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 0, 0)
        side_layout.addWidget(self.total)
        side_layout.addWidget(self.held)
        split = QSplitter(Qt.Orientation.Horizontal, self)
        split.addWidget(self.chart)
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
