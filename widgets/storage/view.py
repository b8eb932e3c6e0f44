"""The storage view: a tensor's storage as a strip of cells, with the elements it covers and their order.

A teacher's picture of strides: ``x.t()`` lights up every cell of ``x``'s storage but numbers them
0, 4, 8, 1, ... and draws hops of +4 and -7 between them; ``x[1]`` lights up cells 4..7 only. Big
storages are drawn a block of elements per cell, shaded by the fraction covered. The other tensors
on the same storage are listed with their relation and can be clicked.
"""

from __future__ import annotations

import html
import logging
import math
from collections.abc import Mapping, Sequence

from PySide6.QtCore import QEvent, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView, QHeaderView, QLabel, QScrollArea, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget,
)

from core.model.memory import format_bytes
from core.model.storage_map import (
    StoragePicture, contiguity, shape_text, sharing, storage_picture, stride_sentence, stride_text, tensor_label,
    tensor_table,
)
from core.model.storage_peers import numpy_rows, shared_caption
from core.model.trace import StorageInfo, TensorInfo
from widgets.display_text import cut_line
from widgets.storage.canvas import StorageCanvas, blend

log = logging.getLogger(__name__)

TENSOR_ID_ROLE = Qt.ItemDataRole.UserRole


class StorageView(QWidget):
    """One tensor's storage: its layout facts, the cell strip, and the other tensors on that memory."""

    sig_tensor_selected = Signal(str)
    """A tensor in the same-storage list was clicked; carries its tensor id."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.title = QLabel(self)
        self.caption = QLabel(self)
        self.caption.setWordWrap(True)
        self.facts = QLabel(self)
        self.facts.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.canvas = StorageCanvas()
        self.scroll = QScrollArea(self)
        self.scroll.setWidgetResizable(True)
        self.scroll.setWidget(self.canvas)
        self.shared_label = QLabel(self)
        self.shared = QTreeWidget(self)
        self.shared.setHeaderLabels(["name", "relation", "shape", "stride", "offset"])
        self.shared.setRootIsDecorated(False)
        self.shared.setUniformRowHeights(True)
        self.shared.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.shared.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.shared.itemClicked.connect(self._on_item)
        self.shared.itemActivated.connect(self._on_item)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(6)
        for widget, stretch in ((self.title, 0), (self.caption, 0), (self.facts, 0), (self.scroll, 3),
                                (self.shared_label, 0), (self.shared, 1)):
            layout.addWidget(widget, stretch)
        self._state: tuple | None = None
        self._screen = True  # screen-only hints (how to click) are left out of exports
        self.clear()

    # public API

    def clear(self) -> None:
        """Show the empty state."""
        self._state = None
        self.title.setText("<b>Storage</b>")
        self.caption.setText("Select a tensor to see which cells of its storage it covers, and in which order.")
        self.facts.hide()
        self.canvas.set_picture(StoragePicture())
        self.shared.clear()
        self.shared_label.hide()
        self.shared.hide()

    def set_tensor(self, tensors: Mapping[str, TensorInfo] | Sequence[TensorInfo], tensor_id: str,
                   storages: Sequence[StorageInfo] | None = None) -> None:
        """Show ``tensor_id``'s storage. ``tensors`` is a list or an id map (a Trace or CallInfo also works)."""
        if storages is None:
            storages = getattr(tensors, "storages", None)
        if not isinstance(tensors, Mapping) and hasattr(tensors, "tensors"):
            tensors = tensors.tensors
        table = tensor_table(tensors)
        if tensor_id not in table:
            self.clear()
            self.caption.setText(f"Tensor {tensor_id} was not captured.")
            return
        self._state = (table, tensor_id, list(storages or []))
        self._render()

    def state(self) -> tuple:
        """(tensor table, shown tensor id, storages): enough to show the same thing elsewhere."""
        return self._state

    def set_screen_hints(self, on: bool) -> None:
        """Show or leave out the hints that only make sense on screen ("click a tensor ...")."""
        if on != self._screen:
            self._screen = on
            if self._state is not None:
                self._render()

    def tensor_id(self) -> str | None:
        """The shown tensor's id, or None."""
        return self._state[1] if self._state is not None else None

    def highlighted_offsets(self) -> list[int]:
        """Storage indices of the covered elements in traversal order ([] when too many to list)."""
        return list(self.canvas.pic.offsets or [])

    def highlighted_cells(self) -> list[int]:
        """Cells drawn as covered: element indices, or block indices for big storages."""
        return [i for i, f in enumerate(self.canvas.pic.coverage) if f > 0]

    def picture(self) -> StoragePicture:
        """What the canvas draws (cells, block size, coverage, values)."""
        return self.canvas.pic

    def cell_rect(self, index: int) -> QRectF:
        """Where cell ``index`` is drawn, in the canvas's coordinates."""
        return self.canvas.cell_rect(index)

    def shared_rows(self) -> list[tuple[str, str]]:
        """(tensor id, relation) for each row of the same-storage list."""
        items = [self.shared.topLevelItem(i) for i in range(self.shared.topLevelItemCount())]
        return [(item.data(0, TENSOR_ID_ROLE), item.text(1)) for item in items]

    # events

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange and self._state is not None:
            self._render()
        super().changeEvent(event)

    def _on_item(self, item: QTreeWidgetItem, _column: int = 0) -> None:
        tensor_id = item.data(0, TENSOR_ID_ROLE)
        if tensor_id:
            log.debug("storage view: select tensor %s", tensor_id)
            self.sig_tensor_selected.emit(tensor_id)

    # content

    def _render(self) -> None:
        table, tensor_id, storages = self._state
        t = table[tensor_id]
        pic = storage_picture(table, tensor_id, storages)
        pal = self.palette()
        muted = blend(pal.color(QPalette.ColorRole.WindowText), pal.color(QPalette.ColorRole.Window), 0.45).name()
        where = f"storage {html.escape(pic.storage)}"
        if t.is_view:
            base_label = tensor_label(table.get(t.base), t.base) if t.base else "a tensor not captured"
            where = f"view of {html.escape(cut_line(base_label))} · {where}"
        size = self.font().pointSizeF()
        self.title.setText(f"<span style='font-size: {size * 1.4:.1f}pt; font-weight: 600'>"
                           f"{html.escape(cut_line(pic.name))}</span>&nbsp;&nbsp;<span style='color: {muted}'>{where}</span>")
        caption = stride_sentence(t.shape, t.stride, t.storage_offset, cut_line(pic.name))
        if not contiguity(t.shape, t.stride):
            caption += " Not contiguous: .contiguous() would copy it into a new row-major storage."
        self.caption.setText(caption)
        self.facts.setText(self._facts_html(t, pic, muted))
        self.facts.show()
        self.canvas.set_picture(pic)
        self._fill_shared(table, tensor_id)
        QTimer.singleShot(0, self, self._reveal)

    def _reveal(self) -> None:
        """Scroll the first covered cell into view (big storages put it far down)."""
        first = next((i for i, f in enumerate(self.canvas.pic.coverage) if f > 0), None)
        if first is not None:
            rect = self.canvas.cell_rect(first)
            margin = max(int(rect.height()), self.scroll.viewport().height() // 3)
            self.scroll.ensureVisible(int(rect.center().x()), int(rect.center().y()), 0, margin)

    def _facts_html(self, t: TensorInfo, pic: StoragePicture, muted: str) -> str:
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
        pairs = [
            ("shape", shape_text(t.shape)), ("dtype", t.dtype.removeprefix("torch.")),
            ("stride", stride_text(t.stride)), ("element size", f"{t.element_size} B"),
            ("storage_offset", str(t.storage_offset)), ("numel", f"{math.prod(t.shape):,}"),
            ("contiguous", "yes" if contiguity(t.shape, t.stride) else "no"),
            ("storage", f"{pic.storage_numel:,} elements · {format_bytes(pic.storage_numel * t.element_size)}"),
            ("version", str(t.version)), ("device", t.device),
        ]
        rows = []
        for i in range(0, len(pairs), 2):
            rows.append("<tr>" + "".join(
                f"<td style='color: {muted}; padding-right: 8px'>{html.escape(k)}</td>"
                f"<td style='font-family: \"{mono}\"; padding-right: 20px'>{html.escape(v)}</td>"
                for k, v in pairs[i:i + 2]) + "</tr>")
        return f"<table cellspacing='0' cellpadding='1'>{''.join(rows)}</table>"

    def _fill_shared(self, table: dict[str, TensorInfo], tensor_id: str) -> None:
        self.shared.clear()
        rows = sharing(table, tensor_id)
        peers = numpy_rows(self._state[2] if self._state else [], table[tensor_id].storage)
        self.shared_label.show()
        self.shared.setVisible(bool(rows or peers))
        if not rows and not peers:
            self.shared_label.setText("No other captured tensor uses this storage.")
            return
        self.shared_label.setText(shared_caption(len(rows), len(peers), screen=self._screen))
        for cells, tip in peers:
            item = QTreeWidgetItem(cells)
            item.setToolTip(0, tip)
            self.shared.addTopLevelItem(item)
        for other, relation in rows:
            item = QTreeWidgetItem([tensor_label(other), relation, shape_text(other.shape),
                                    stride_text(other.stride), str(other.storage_offset)])
            item.setData(0, TENSOR_ID_ROLE, other.id)
            item.setToolTip(0, f"{tensor_label(other)} ({other.id}): {relation}")
            self.shared.addTopLevelItem(item)
