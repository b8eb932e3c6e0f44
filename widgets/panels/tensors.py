"""Every tensor bound to a script name when the script ended, with its anatomy at a glance.

While a debug run is paused in forward, the rows are the live variables at that line instead
(``app.session.forward_debug``): the same columns, ``grad_fn`` naming the node each came from.

Rows on the same storage share a colour band and a storage column, so views, ``detach()``
results and ``from_numpy`` tensors visibly group together.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPalette
from PySide6.QtWidgets import QHeaderView, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget

from core.model.trace import TensorInfo
from core.model.values import short_values as value_text
from widgets.display_text import cut_line

_BANDS = ("#e8f0fb", "#fbeee0", "#e6f4ea", "#f6e7f3", "#fff7d6", "#e9e7fb")
_DARK_BANDS = ("#23344d", "#4a3722", "#24402d", "#45293f", "#4a4420", "#302d4d")


def _tuple(values: list[int]) -> str:
    return "(" + ", ".join(str(v) for v in values) + ("," if len(values) == 1 else "") + ")"


def grad_cell(t: TensorInfo) -> str:
    """A tensor's ``.grad`` as the script would find it: its values, 'None' where a leaf has not
    been reached yet or a non-leaf keeps none (without ``retain_grad()``), '—' without requires_grad."""
    if t.grad is not None:
        return cut_line(value_text(t.grad.values, t.grad.shape))
    if not t.requires_grad:
        return "—"
    return "None" if t.is_leaf or t.retains_grad else "None (non-leaf)"


class TensorsPanel(QWidget):
    sig_tensor_selected = Signal(str)
    """A tensor row was chosen; carries the tensor id."""

    COLUMNS = ("name", "shape", "leaf", "requires_grad", ".grad", "grad_fn", "stride", "offset", "storage", "version",
               "dtype", "device")
    # Columns a narrow dock hides first (their values stay in each row's tooltip): no sideways scrolling.
    DROP_ORDER = ("device", "dtype", "version", "storage", "offset", "stride", "grad_fn", ".grad")

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.tree = QTreeWidget(self)
        self.tree.setHeaderLabels(list(self.COLUMNS))
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setSortingEnabled(False)
        self.tree.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # The name takes the room left (elided when very narrow), so the table never scrolls sideways.
        self.tree.header().setStretchLastSection(False)
        self.tree.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.tree)
        self.tree.currentItemChanged.connect(self._changed)
        self._ids: list[str] = []

    def set_tensors(self, tensors: list[TensorInfo]) -> None:
        self.tree.blockSignals(True)
        self.tree.clear()
        self._ids = []
        dark = self.palette().color(QPalette.ColorRole.Base).lightness() < 128
        bands = _DARK_BANDS if dark else _BANDS
        shared = {}
        counts: dict[str, int] = {}
        for t in tensors:
            if t.storage:
                counts[t.storage] = counts.get(t.storage, 0) + 1
        for t in tensors:
            if not t.name:
                continue
            name = cut_line(t.name)  # the row shows a cut name; the trace keeps it whole
            row = [name, str(list(t.shape)), str(t.is_leaf), str(t.requires_grad), grad_cell(t), t.grad_fn_name or "None",
                   _tuple(t.stride), str(t.storage_offset), t.storage or "—", str(t.version), t.dtype, t.device]
            item = QTreeWidgetItem(row)
            item.setData(0, Qt.ItemDataRole.UserRole, t.id)
            tip = f"{name}: {'view' if t.is_view else 'tensor'} on storage {t.storage}"
            if t.storage and counts.get(t.storage, 0) > 1:
                colour = shared.setdefault(t.storage, bands[len(shared) % len(bands)])
                for col in range(len(self.COLUMNS)):
                    item.setBackground(col, QBrush(QColor(colour)))
                tip += f", shared by {counts[t.storage]} named tensors"
            tip += "\n" + "  ".join(f"{c}: {v}" for c, v in zip(self.COLUMNS[1:], row[1:]))
            for col in range(len(self.COLUMNS)):
                item.setToolTip(col, tip)
            self.tree.addTopLevelItem(item)
            self._ids.append(t.id)
        self.tree.blockSignals(False)
        self.fit_columns()

    def fit_columns(self) -> None:
        """Show the columns that fit the width, each sized to its content, dropping ``DROP_ORDER`` first."""
        # Measured from the texts: Qt's own hints read 0 for hidden columns, which would flip them back.
        fm, header_fm = self.tree.fontMetrics(), self.tree.header().fontMetrics()
        items = [self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount())]
        widths = [max([header_fm.horizontalAdvance(name) + 20] + [fm.horizontalAdvance(it.text(c)) + 14 for it in items])
                  for c, name in enumerate(self.COLUMNS)]
        widths[0] = min(widths[0], 72)  # the name stretches into what is left, elided if it must
        room = self.tree.viewport().width() or self.width()
        shown = set(range(len(self.COLUMNS)))
        for name in self.DROP_ORDER:
            if sum(widths[c] for c in shown) <= room:
                break
            shown.discard(self.COLUMNS.index(name))
        for c in range(len(self.COLUMNS)):
            self.tree.setColumnHidden(c, c not in shown)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.fit_columns()

    def clear(self) -> None:
        self.tree.clear()
        self._ids = []

    def tensor_ids(self) -> list[str]:
        return list(self._ids)

    def select_tensor(self, tensor_id: str) -> None:
        """Mark a tensor's row without emitting."""
        self.tree.blockSignals(True)
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            if item.data(0, Qt.ItemDataRole.UserRole) == tensor_id:
                self.tree.setCurrentItem(item)
                break
        self.tree.blockSignals(False)

    def _changed(self, item: QTreeWidgetItem | None, _previous) -> None:
        if item is not None:
            self.sig_tensor_selected.emit(item.data(0, Qt.ItemDataRole.UserRole))
