"""The step log: backward's executed nodes in order, with the gradients that flowed.

Clicking a past step asks for the graph as it was then (``sig_step_selected``); the
window replays the recorded steps, nothing is re-run.
"""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QFontDatabase
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QLabel, QTreeView, QVBoxLayout, QWidget

from core.model.step_state import short_values
from core.model.trace import CallInfo

HEADERS = ("#", "node", "gradient in (grad_outputs)", "gradients out, per edge")


class StepModel(QAbstractTableModel):
    """The step records as rows; a row's texts are made only when the view shows it.

    Appending thousands of steps (Continue on a big graph) is then one insert, not thousands
    of formatted items.
    """

    def __init__(self, mono: QFont, parent=None):
        super().__init__(parent)
        self.records: list[dict] = []
        self.call: CallInfo | None = None
        self.mono = mono
        self._texts: dict[int, tuple[str, str, str, str]] = {}

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.records)

    def columnCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(HEADERS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return HEADERS[section]
        return None

    def reset(self, call: CallInfo | None) -> None:
        self.beginResetModel()
        self.records, self.call, self._texts = [], call, {}
        self.endResetModel()

    def append(self, records: list[dict]) -> None:
        if not records:
            return
        first = len(self.records)
        self.beginInsertRows(QModelIndex(), first, first + len(records) - 1)
        self.records.extend(records)
        self.endInsertRows()

    def texts(self, row: int) -> tuple[str, str, str, str]:
        cached = self._texts.get(row)
        if cached is None:
            cached = self._texts[row] = _texts(self.records[row], row, self.call)
        return cached

    def data(self, index: QModelIndex, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row, col = index.row(), index.column()
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            if role == Qt.ItemDataRole.ToolTipRole and col != 3:
                return None
            return self.texts(row)[col]
        if role == Qt.ItemDataRole.FontRole and col in (2, 3):
            return self.mono
        if role == Qt.ItemDataRole.ForegroundRole and col == 3 and self.records[row].get("error"):
            return QBrush(QColor("red"))
        return None


def _texts(record: dict, row: int, call: CallInfo | None) -> tuple[str, str, str, str]:
    node_id = record.get("node")
    node = call.node(node_id) if call is not None and node_id else None
    name = record.get("name") or (node.name if node else "?")
    if node is not None and node.label:
        name = f"{name}  ({node.label})"
    grads_in = ", ".join(short_values(g) for g in (record.get("grad_outputs") or []))
    grads_out = ", ".join(short_values(g) for g in (record.get("grad_inputs") or []))
    if record.get("leaf_grads"):
        grads_out += "   → " + ", ".join(f"{k}.grad = {short_values(v)}" for k, v in record["leaf_grads"].items())
    if record.get("error"):
        grads_out = f"failed: {record['error'].get('type')}: {record['error'].get('message', '')[:120]}"
    return str(record.get("index", row)), name, grads_in, grads_out


class StepLogPanel(QWidget):
    sig_step_selected = Signal(int)
    """A past step was clicked; carries the number of steps to replay (index + 1)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.status = QLabel("Debug (F9) pauses before breakpoint lines and at backward; Step (F10) runs one line "
                             "or one node at a time.", self)
        self.status.setWordWrap(True)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        mono.setPointSizeF(max(8.0, QFont().pointSizeF() - 0.5))
        self.model = StepModel(mono, self)
        self.tree = QTreeView(self)
        self.tree.setModel(self.model)
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.tree.header()
        # Fixed widths: sizing columns to their contents would measure every row on each append.
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        for column, width in enumerate((52, 260, 300)):
            header.resizeSection(column, width)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.status)
        layout.addWidget(self.tree)
        self.tree.clicked.connect(self._clicked)

    def clear(self) -> None:
        self.model.reset(None)

    def set_status(self, text: str) -> None:
        self.status.setText(text)

    def set_steps(self, call: CallInfo | None, steps: list[dict]) -> None:
        self.model.reset(call)
        self.append_steps(steps)

    def append_steps(self, records: list[dict]) -> None:
        """Append many steps at once, scrolling once."""
        self.model.append(list(records))
        if records:
            self.tree.scrollToBottom()

    def append_step(self, record: dict) -> None:
        self.append_steps([record])

    def count(self) -> int:
        return self.model.rowCount()

    def row_texts(self, row: int) -> tuple[str, str, str, str]:
        """The four texts of a row (number, node, gradient in, gradients out)."""
        return self.model.texts(row)

    def select_step(self, count: int) -> None:
        """Mark the last replayed step (``count`` steps shown) without emitting."""
        self.tree.blockSignals(True)
        if count > 0:
            self.tree.setCurrentIndex(self.model.index(count - 1, 0))
        else:
            self.tree.clearSelection()
        self.tree.blockSignals(False)

    def _clicked(self, index: QModelIndex) -> None:
        if index.isValid():
            self.sig_step_selected.emit(index.row() + 1)
