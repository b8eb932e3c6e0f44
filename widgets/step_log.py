"""The step log: backward's executed nodes in order, with the gradients that flowed.

Clicking a past step asks for the graph as it was then (``sig_step_selected``); the
window replays the recorded steps, nothing is re-run.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QFontDatabase
from PySide6.QtWidgets import QHeaderView, QLabel, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from core.step_state import short_values
from core.trace import CallInfo


class StepLogPanel(QWidget):
    sig_step_selected = Signal(int)
    """A past step was clicked; carries the number of steps to replay (index + 1)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.status = QLabel("Press Step (F10) to run backward one node at a time.", self)
        self.status.setWordWrap(True)
        self.tree = QTreeWidget(self)
        self.tree.setHeaderLabels(["#", "node", "gradient in (grad_outputs)", "gradients out, per edge"])
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.setUniformRowHeights(True)
        header = self.tree.header()
        # Fixed widths: sizing columns to their contents re-measures every row on each append,
        # which made a 5,000-step Continue take minutes.
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        for column, width in enumerate((52, 260, 300)):
            header.resizeSection(column, width)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        mono.setPointSizeF(max(8.0, QFont().pointSizeF() - 0.5))
        self._mono = mono
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.status)
        layout.addWidget(self.tree)
        self.tree.itemClicked.connect(self._clicked)
        self._call: CallInfo | None = None

    def clear(self) -> None:
        self.tree.clear()
        self._call = None

    def set_status(self, text: str) -> None:
        self.status.setText(text)

    def set_steps(self, call: CallInfo | None, steps: list[dict]) -> None:
        self.tree.clear()
        self._call = call
        self.append_steps(steps)

    def append_steps(self, records: list[dict]) -> None:
        """Append many steps at once, scrolling once."""
        items = [self._item(r, self.tree.topLevelItemCount() + i) for i, r in enumerate(records)]
        self.tree.addTopLevelItems(items)
        if items:
            self.tree.scrollToItem(items[-1])

    def append_step(self, record: dict) -> None:
        self.append_steps([record])

    def _item(self, record: dict, row: int) -> QTreeWidgetItem:
        node_id = record.get("node")
        node = self._call.node(node_id) if self._call is not None and node_id else None
        name = record.get("name") or (node.name if node else "?")
        if node is not None and node.label:
            name = f"{name}  ({node.label})"
        grads_in = ", ".join(short_values(g) for g in (record.get("grad_outputs") or []))
        grads_out = ", ".join(short_values(g) for g in (record.get("grad_inputs") or []))
        if record.get("leaf_grads"):
            grads_out += "   → " + ", ".join(f"{k}.grad = {short_values(v)}" for k, v in record["leaf_grads"].items())
        if record.get("error"):
            grads_out = f"failed: {record['error'].get('type')}: {record['error'].get('message', '')[:120]}"
        item = QTreeWidgetItem([str(record.get("index", row)), name, grads_in, grads_out])
        for col in (2, 3):
            item.setFont(col, self._mono)
        item.setData(0, Qt.ItemDataRole.UserRole, row)
        item.setToolTip(3, grads_out)
        if record.get("error"):
            item.setForeground(3, Qt.GlobalColor.red)
        return item

    def count(self) -> int:
        return self.tree.topLevelItemCount()

    def select_step(self, count: int) -> None:
        """Mark the last replayed step (``count`` steps shown) without emitting."""
        self.tree.blockSignals(True)
        item = self.tree.topLevelItem(count - 1) if count > 0 else None
        self.tree.setCurrentItem(item)
        self.tree.blockSignals(False)

    def _clicked(self, item: QTreeWidgetItem, _column: int) -> None:
        index = item.data(0, Qt.ItemDataRole.UserRole)
        if index is not None:
            self.sig_step_selected.emit(int(index) + 1)
