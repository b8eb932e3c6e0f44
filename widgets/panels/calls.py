"""The list of backward calls in a trace, one row each, to pick which graph to show.

A call followed by a ``GradScaler.step`` shows the loss scale it ran with; one whose step inf/NaN
in the gradients skipped gets a third line in amber ("step skipped: inf/NaN in gradients, scale
65536 → 32768").
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QEvent, QModelIndex, QPersistentModelIndex, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter, QPalette, QPen
from PySide6.QtWidgets import (
    QListWidget, QListWidgetItem, QMenu, QStyle, QStyledItemDelegate, QStyleOptionViewItem, QVBoxLayout, QWidget,
)

from core.model.call_notes import call_flags, grad_history, group_calls
from core.model.forward_errors import failed_op
from core.model.grad_health import ScalerStep, event_brief, event_text, events_by_call, scaler_steps
from core.programs.notebook import where as line_where
from core.model.trace import CallInfo, Trace
from widgets.display_text import cut_line, cut_text
from widgets.panels.grad_health import skip_text_color

log = logging.getLogger(__name__)

CALL_ID_ROLE = Qt.ItemDataRole.UserRole
STATE_ROLE = Qt.ItemDataRole.UserRole + 1  # "ok", "error", "unreached", "summary" or "total"
HEAD_ROLE = Qt.ItemDataRole.UserRole + 2
DETAIL_ROLE = Qt.ItemDataRole.UserRole + 3
WARN_ROLE = Qt.ItemDataRole.UserRole + 4  # a third line, in amber: the GradScaler step after it was skipped


def call_parts(call: CallInfo, index_of: dict[str, int] | None = None,
               cells: list | None = None) -> tuple[str, list[str]]:
    """The head (``#0 Tensor.backward``) and the details (line, node count, error) of a call;
    ``cells`` (a notebook's) gives the line as "cell 4, line 2". The graph a forward pass failed
    on is headed by the op (``#1 failed in forward: x.add_(1)``) and placed at the op's line."""
    op = failed_op(call)
    if op is not None:
        where = op.get("where") or line_where(cells or [], op.get("line"))
        details = [where] if where else []
    else:
        details = [line_where(cells or [], call.line)] if call.line else []
    if call.snapshot == "summary":
        same = (index_of or {}).get(call.same_as or "")
        details.append(f"same graph as #{same}" if same is not None else "same graph as an earlier call")
    else:
        count = len(call.nodes) or call.node_count
        details.append(f"{count} node" + ("" if count == 1 else "s"))
    if call.error is not None:
        details.append(call.error.type)
    elif op is not None and op.get("type"):
        details.append(op["type"])
    return call_head(call), details


def call_head(call: CallInfo) -> str:
    """``#0 Tensor.backward``; ``#1 (never backwarded)``; ``#1 failed in forward: x.add_(1)``."""
    op = failed_op(call)
    if op is not None:
        return f"#{call.index} failed in forward: {op.get('text') or op.get('name') or 'an op'}"
    return f"#{call.index} " + ("(never backwarded)" if call.api == "unreached" else call.api)


def call_title(call: CallInfo, index_of: dict[str, int] | None = None) -> str:
    """One line for a call: ``#0 Tensor.backward · line 14 · 7 nodes``."""
    head, details = call_parts(call, index_of)
    return " · ".join([head, *details])


def call_state(call: CallInfo) -> str:
    """How the row is drawn: "error" (backward raised, or the forward pass failed on this graph),
    "summary", "unreached" or "ok"."""
    if call.error is not None or failed_op(call) is not None:
        return "error"
    if call.snapshot == "summary":
        return "summary"
    return "unreached" if call.api == "unreached" else "ok"


def call_tooltip(call: CallInfo) -> str:
    """A longer description shown on hover."""
    op = failed_op(call)
    lines = [call.title if op is None else call_head(call)]
    if op is not None:
        lines.append(f"The graph the script had built when {op.get('text') or 'an op'} raised; backward never "
                     "ran on it. The op is drawn joined to the inputs it was called on.")
        lines.append(cut_text(f"{op.get('type', 'Error')}: {op.get('message', '')}", 200, 2_000))
    elif call.api == "unreached":
        lines.append("A graph that was built but never had backward called on it.")
    if call.snapshot == "summary":
        lines.append("Only a summary was kept: the graph has the same structure as an earlier call.")
    if call.duration_s:
        lines.append(f"backward took {call.duration_s * 1000:.1f} ms")
    if call.error is not None:
        lines.append(cut_text(f"{call.error.type}: {call.error.message}", 200, 2_000))
    return "\n".join(lines)


class _CallDelegate(QStyledItemDelegate):
    """Draws a call as a marker, a head line and a muted detail line."""

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        height = option.fontMetrics.height()
        if index.data(STATE_ROLE) == "total":
            return QSize(100, height + 10)
        if index.data(WARN_ROLE):
            return QSize(100, 3 * height + 14)
        return QSize(100, 2 * height + 12)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem,
              index: QModelIndex | QPersistentModelIndex) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        widget = opt.widget
        style = widget.style() if widget is not None else None
        if style is not None:
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, widget)
        pal = opt.palette
        selected = bool(opt.state & QStyle.StateFlag.State_Selected)
        text = pal.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)
        muted = text if selected else pal.color(QPalette.ColorRole.PlaceholderText)
        dark = pal.color(QPalette.ColorRole.Base).lightness() < 128
        error = QColor("#ff7b72" if dark else "#c62828")
        state = index.data(STATE_ROLE)
        rect = opt.rect.adjusted(8, 5, -6, -5)
        height = opt.fontMetrics.height()
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        if state == "total":
            font = QFont(opt.font)
            font.setItalic(True)
            painter.setFont(font)
            painter.setPen(muted)
            painter.drawText(rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, index.data(HEAD_ROLE))
            painter.restore()
            return
        self._marker(painter, QRect(rect.left(), rect.top() + (height - 10) // 2, 10, 10), state, pal, error, selected)
        head_rect = QRect(rect.left() + 18, rect.top(), rect.width() - 18, height)
        detail_rect = head_rect.translated(0, height + 2)
        font = QFont(opt.font)
        font.setWeight(QFont.Weight.DemiBold if state in ("ok", "error") else QFont.Weight.Normal)
        font.setItalic(state == "unreached")
        painter.setFont(font)
        painter.setPen(error if state == "error" and not selected else (text if state in ("ok", "error") else muted))
        elide = Qt.TextElideMode.ElideRight
        painter.drawText(head_rect, Qt.AlignmentFlag.AlignLeft, painter.fontMetrics().elidedText(
            cut_line(index.data(HEAD_ROLE) or "", 1_000), elide, head_rect.width()))
        painter.setFont(opt.font)
        painter.setPen(muted)
        detail = painter.fontMetrics().elidedText(cut_line(index.data(DETAIL_ROLE) or "", 1_000), elide, detail_rect.width())
        painter.drawText(detail_rect, Qt.AlignmentFlag.AlignLeft, detail)
        warn = index.data(WARN_ROLE)
        if warn:
            warn_rect = detail_rect.translated(0, height + 2)
            painter.setPen(text if selected else skip_text_color(dark))
            painter.drawText(warn_rect, Qt.AlignmentFlag.AlignLeft,
                             painter.fontMetrics().elidedText(cut_line(warn, 1_000), elide, warn_rect.width()))
        painter.restore()

    @staticmethod
    def _marker(painter: QPainter, box: QRect, state: str, pal: QPalette, error: QColor, selected: bool) -> None:
        accent = pal.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Highlight)
        grey = pal.color(QPalette.ColorRole.PlaceholderText)
        if state == "error":
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(error)
            painter.drawEllipse(box)
            painter.setPen(QPen(QColor("white"), 1.6))
            c = box.center()
            painter.drawLine(c.x() - 2, c.y() - 2, c.x() + 2, c.y() + 2)
            painter.drawLine(c.x() + 2, c.y() - 2, c.x() - 2, c.y() + 2)
        elif state == "unreached":
            painter.setPen(QPen(grey, 1.4, Qt.PenStyle.DotLine))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawEllipse(box.adjusted(1, 1, -1, -1))
        else:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(accent if state == "ok" else grey)
            painter.drawEllipse(box.adjusted(2, 2, -2, -2) if state == "summary" else box)


class CallsPanel(QWidget):
    """Lists the calls of a trace; errors are marked, loop repeats are greyed."""

    sig_call_selected = Signal(str)
    """The user moved to a call (click or keys); carries the call id."""
    sig_debug_to_call = Signal(int)
    """The user asked to debug the script up to a call (its index): a loop's later call."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.list = QListWidget(self)
        self.list.setItemDelegate(_CallDelegate(self.list))
        self.list.currentItemChanged.connect(self._on_current)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list)
        self.setFocusProxy(self.list)
        self._quiet = False
        self._index_of: dict[str, int] = {}
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)

    def set_trace(self, trace: Trace | None) -> None:
        """Fill the list from ``trace``; ``None`` empties it."""
        self._quiet = True
        try:
            self.list.clear()
            if trace is None:
                return
            index_of = {c.id: c.index for c in trace.calls}
            self._index_of = index_of
            history = grad_history(trace)
            after = events_by_call(trace)  # clipping, optimizer steps and zero_grad after each call
            scaled: dict[int | None, list[ScalerStep]] = {}
            for step in scaler_steps(trace):
                scaled.setdefault(step.call, []).append(step)
            # by index: a call nested in another (reentrant checkpointing) finishes, and is stored, first
            for group in group_calls(sorted(trace.calls, key=lambda c: c.index)):
                call = group[0]
                head, details = call_parts(call, index_of, trace.cells)
                details += call_flags(call)
                tip = call_tooltip(call)
                if len(group) > 1:
                    within = call.options.get("within", "gradcheck")
                    head = f"#{call.index}–#{group[-1].index} {within}"
                    details = [f"line {call.line}" if call.line else "", f"{len(group)} calls inside "
                               f"torch.autograd.{within}"]
                    tip = (f"torch.autograd.{within} ran backward {len(group)} times to compare analytical and "
                           f"numerical gradients; the first of its calls is shown.")
                lines = history.get(call.id, [])
                if lines:
                    tip += "\n\n" + "\n".join(lines)
                    if any(line.startswith("↺") for line in lines):
                        tip += "\n↺: the script reset .grad since the previous call (zero_grad() or .grad = None)"
                    details.append("; ".join(lines[:2]))
                events = after.get(call.index, [])
                briefs = [b for b in (event_brief(e) for e in events) if b]
                if briefs:
                    details.insert(2, "then " + ", ".join(briefs))  # after the line and node count
                    tip += "\n\nAfter this call:\n" + "\n".join(event_text(e) for e in events if e["kind"] != "scaler.step")
                steps = scaled.get(call.index, [])
                skipped = "; ".join(s.note for s in steps if s.skipped)
                details[2:2] = [s.note for s in steps if not s.skipped]  # after the line and node count
                if steps:
                    tip += "\n\n" + "\n".join(f"GradScaler.step({s.optimizer}): {s.note}" for s in steps)
                if skipped:
                    tip += ("\nThe scaled gradients held inf or NaN, so the scaler ran no optimizer step and "
                            "lowered the loss scale (update() halves it).")
                details = [d for d in details if d]
                item = QListWidgetItem(" · ".join([head, *details, *([skipped] if skipped else [])]))
                item.setData(CALL_ID_ROLE, call.id)
                item.setData(STATE_ROLE, call_state(call))
                item.setData(HEAD_ROLE, head)
                item.setData(DETAIL_ROLE, " · ".join(details))
                item.setData(WARN_ROLE, skipped)
                item.setToolTip(tip)
                self.list.addItem(item)
            if trace.call_count > len(trace.calls):
                self._add_note(f"{trace.call_count} calls in total, {len(trace.calls)} kept",
                               "Repeated calls in a loop are counted, but only some are stored.")
            if not trace.calls:
                self._add_note("No backward calls", "The script never built or used an autograd graph.")
        finally:
            self._quiet = False

    def clear(self) -> None:
        """Empty the list."""
        self.set_trace(None)

    def select_call(self, call_id: str) -> None:
        """Make ``call_id`` the current row without emitting ``sig_call_selected``."""
        self._quiet = True
        try:
            for row in range(self.list.count()):
                item = self.list.item(row)
                if item.data(CALL_ID_ROLE) == call_id:
                    self.list.setCurrentItem(item)
                    self.list.scrollToItem(item)
                    return
            log.debug("select_call: no call %s", call_id)
        finally:
            self._quiet = False

    def current_call(self) -> str | None:
        """The id of the current call, or None."""
        item = self.list.currentItem()
        return item.data(CALL_ID_ROLE) if item is not None else None

    def call_ids(self) -> list[str]:
        """The call ids in row order."""
        ids = (self.list.item(r).data(CALL_ID_ROLE) for r in range(self.list.count()))
        return [i for i in ids if i is not None]

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self.list.viewport().update()
        super().changeEvent(event)

    def _add_note(self, text: str, tooltip: str) -> None:
        item = QListWidgetItem(text)
        item.setData(STATE_ROLE, "total")
        item.setData(HEAD_ROLE, text)
        item.setFlags(Qt.ItemFlag.NoItemFlags)
        item.setToolTip(tooltip)
        self.list.addItem(item)

    def _context_menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        call_id = item.data(CALL_ID_ROLE) if item is not None else None
        if call_id not in self._index_of:
            return
        index = self._index_of[call_id]
        menu = QMenu(self)
        action = menu.addAction(f"Debug to Call #{index}")
        action.setToolTip("Run the script again and pause first at this call, skipping the calls before it")
        action.triggered.connect(lambda: self.sig_debug_to_call.emit(index))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def _on_current(self, item: QListWidgetItem | None, _previous) -> None:
        if not self._quiet and item is not None and item.data(CALL_ID_ROLE) is not None:
            self.sig_call_selected.emit(item.data(CALL_ID_ROLE))
