"""The script, read-only, with line numbers, Python colouring and highlighted lines.

Highlighted lines show where the selected node came from; clicking a line lets the rest of
the app select what that line created. Clicking the gutter (the line numbers) toggles a
breakpoint, drawn as a red dot: a debug run pauses before that line runs (in forward, with the
graph built so far) and at backward calls made from it. The line a debug run is paused at gets an
arrow; paused in a function of another file, the panel shows that file (``shown_source`` keeps
the script's text to come back to).
"""

from __future__ import annotations

import builtins
import keyword
import logging
import re
from pathlib import Path

from PySide6.QtCore import QEvent, QPointF, QRect, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor, QFont, QFontDatabase, QMouseEvent, QPainter, QPalette, QPolygonF, QSyntaxHighlighter,
    QTextCharFormat, QTextCursor, QTextDocument, QTextFormat,
)
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QTextEdit, QVBoxLayout, QWidget

from core.programs.notebook import gutter_labels

log = logging.getLogger(__name__)

GUTTER_TIP = ("Click a line number to set or clear a breakpoint: a debug run (F9) pauses before that line "
              "runs, and at backward calls made from it")
OTHER_FILE_TIP = "A file the script calls into, shown while the run is paused in it: breakpoints go in the script"

LIGHT = {"keyword": "#8a3ab9", "builtin": "#0b6e99", "string": "#2f7d32", "comment": "#8a8f98",
         "number": "#b35900", "def": "#1f5fbf", "decorator": "#a0522d", "self": "#b03060"}
DARK = {"keyword": "#c792ea", "builtin": "#6fc3df", "string": "#a5d68a", "comment": "#7f8794",
        "number": "#f4a261", "def": "#82aaff", "decorator": "#e0a070", "self": "#ff8fa3"}
_IN_TRIPLE = {'"""': 1, "'''": 2}


def _is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Base).lightness() < 128


class PythonHighlighter(QSyntaxHighlighter):
    """Regex colouring for Python: keywords, builtins, strings, comments, numbers, defs."""

    def __init__(self, document: QTextDocument, dark: bool = False):
        super().__init__(document)
        kws = [k for k in keyword.kwlist + list(keyword.softkwlist) if k.isidentifier() and k != "_"]
        names = sorted(n for n in dir(builtins) if not n.startswith("_") and n not in kws)
        self._rules_src = [
            ("keyword", r"\b(?:" + "|".join(kws) + r")\b", 0),
            ("builtin", r"(?<![.\w])(?:" + "|".join(names) + r")\b", 0),
            ("self", r"\b(?:self|cls)\b", 0),
            ("number", r"\b(?:0[xob][0-9a-fA-F_]+|\d[\d_]*\.?[\d_]*(?:[eE][+-]?\d+)?j?|\.\d+(?:[eE][+-]?\d+)?j?)\b", 0),
            ("decorator", r"^\s*@[\w.]+", 0),
            ("def", r"\b(?:def|class)\s+(\w+)", 1),
        ]
        self._rules: list[tuple[re.Pattern, int, QTextCharFormat]] = []
        # Strings and comments are scanned left to right so a '#' inside a string is not a comment.
        self._string_re = re.compile(r"""[rRbBuUfF]{0,2}(\"\"\"|'''|"|')""")
        self.set_dark(dark)

    def set_dark(self, dark: bool) -> None:
        """Switch the colour set for a dark or light background and recolour."""
        colours = DARK if dark else LIGHT
        self._formats = {}
        for name, colour in colours.items():
            fmt = QTextCharFormat()
            fmt.setForeground(QColor(colour))
            if name in ("keyword", "def"):
                fmt.setFontWeight(QFont.Weight.DemiBold)
            if name == "comment":
                fmt.setFontItalic(True)
            self._formats[name] = fmt
        self._rules = [(re.compile(p), g, self._formats[n]) for n, p, g in self._rules_src]
        self.rehighlight()

    def highlightBlock(self, text: str) -> None:
        for regex, group, fmt in self._rules:
            for m in regex.finditer(text):
                self.setFormat(m.start(group), m.end(group) - m.start(group), fmt)
        self.setCurrentBlockState(0)
        pos = 0
        prev = self.previousBlockState()
        if prev in (1, 2):
            quote = '"""' if prev == 1 else "'''"
            pos = self._close_string(text, 0, 0, quote)
            if pos < 0:
                return
        while pos < len(text):
            ch = text[pos]
            if ch == "#":
                self.setFormat(pos, len(text) - pos, self._formats["comment"])
                return
            m = self._string_re.match(text, pos)
            if m and (pos == 0 or not (text[pos - 1].isalnum() or text[pos - 1] == "_")):
                pos = self._close_string(text, pos, m.end(), m.group(1))
                if pos < 0:
                    return
                continue
            pos += 1

    def _close_string(self, text: str, start: int, body: int, quote: str) -> int:
        """Colour a string from ``start``; return the index after it, or -1 if it runs on."""
        i = body
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                end = i + len(quote)
                self.setFormat(start, end - start, self._formats["string"])
                return end
            i += 1
        self.setFormat(start, len(text) - start, self._formats["string"])
        if quote in _IN_TRIPLE:
            self.setCurrentBlockState(_IN_TRIPLE[quote])
        return -1


class _Gutter(QWidget):
    """Paints line numbers and a marker beside highlighted lines."""

    def __init__(self, editor: "_Editor"):
        super().__init__(editor)
        self.editor = editor

    def sizeHint(self) -> QSize:
        return QSize(self.editor.gutter_width(), 0)

    def paintEvent(self, event) -> None:
        self.editor.paint_gutter(event)

    def mousePressEvent(self, event: QMouseEvent) -> None:
        block = self.editor.cursorForPosition(event.position().toPoint()).block()
        if event.button() == Qt.MouseButton.LeftButton:
            self.editor.panel.toggle_breakpoint(block.blockNumber() + 1)


class _Editor(QPlainTextEdit):
    def __init__(self, panel: "SourcePanel"):
        super().__init__(panel)
        self.panel = panel
        self.marked: set[int] = set()
        self.labels: dict[int, str] = {}  # a notebook's "[cell]" headers and lines within cells
        self.breakpoints: set[int] = set()
        self.paused_line: int | None = None
        self.gutter = _Gutter(self)
        self.gutter.setCursor(Qt.CursorShape.PointingHandCursor)
        self.gutter.setToolTip(GUTTER_TIP)
        self.setReadOnly(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.blockCountChanged.connect(lambda _: self.setViewportMargins(self.gutter_width(), 0, 0, 0))
        self.updateRequest.connect(self._on_update_request)
        self.setViewportMargins(self.gutter_width(), 0, 0, 0)

    def gutter_width(self) -> int:
        digits = max(3, len(str(self.blockCount())), *(len(t) for t in self.labels.values()))
        return 14 + self.fontMetrics().height() + self.fontMetrics().horizontalAdvance("9") * digits

    def line_clicked(self, line: int) -> None:
        self.panel.sig_line_clicked.emit(line)

    def _on_update_request(self, rect: QRect, dy: int) -> None:
        if dy:
            self.gutter.scroll(0, dy)
        else:
            self.gutter.update(0, rect.y(), self.gutter.width(), rect.height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        cr = self.contentsRect()
        self.gutter.setGeometry(QRect(cr.left(), cr.top(), self.gutter_width(), cr.height()))

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        super().mouseReleaseEvent(event)
        # A drag that selected text is a copy, not a click on a line.
        if event.button() == Qt.MouseButton.LeftButton and not self.textCursor().hasSelection():
            self.line_clicked(self.cursorForPosition(event.position().toPoint()).blockNumber() + 1)

    def paint_gutter(self, event) -> None:
        pal = self.palette()
        painter = QPainter(self.gutter)
        base = pal.color(QPalette.ColorRole.Base)
        painter.fillRect(event.rect(), base.darker(104) if base.lightness() > 128 else base.lighter(118))
        muted = pal.color(QPalette.ColorRole.PlaceholderText)
        accent = pal.color(QPalette.ColorRole.Highlight)
        block = self.firstVisibleBlock()
        top = round(self.blockBoundingGeometry(block).translated(self.contentOffset()).top())
        height = self.fontMetrics().height()
        while block.isValid() and top <= event.rect().bottom():
            bottom = top + round(self.blockBoundingRect(block).height())
            if block.isVisible() and bottom >= event.rect().top():
                line = block.blockNumber() + 1
                if line in self.marked:
                    painter.fillRect(0, top, 4, bottom - top, accent)
                    painter.setPen(pal.color(QPalette.ColorRole.Text))
                else:
                    painter.setPen(muted)
                self._paint_marks(painter, line, top, height)
                label = self.labels.get(line, "") if self.labels else str(line)
                painter.drawText(0, top, self.gutter.width() - 8, height,
                                 Qt.AlignmentFlag.AlignRight, label)
            block = block.next()
            top = bottom


    def _paint_marks(self, painter: QPainter, line: int, top: int, height: int) -> None:
        """A breakpoint's red dot and the paused line's arrow, left of the number."""
        if line not in self.breakpoints and line != self.paused_line:
            return
        pen = painter.pen()
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        d = max(6, height - 6)
        x, y = 6, top + (height - d) / 2
        painter.setPen(Qt.PenStyle.NoPen)
        if line in self.breakpoints:
            painter.setBrush(QColor("#d73a3a"))
            painter.drawEllipse(QRect(int(x), int(y), d, d))
        if line == self.paused_line:
            # The paused line's arrow, outlined so it reads over a breakpoint's dot.
            painter.setPen(QColor("#5a4300"))
            painter.setBrush(QColor("#ffc933"))
            painter.drawPolygon(QPolygonF([QPointF(x - 3, y - 1), QPointF(x + d + 2, y + d / 2),
                                           QPointF(x - 3, y + d + 1)]))
        painter.restore()
        painter.setPen(pen)


class SourcePanel(QWidget):
    """The traced script with line numbers; shows which lines a selection came from."""

    sig_line_clicked = Signal(int)
    """A line was clicked; carries the 1-based line number."""
    sig_breakpoints_changed = Signal(list)
    """The breakpoint lines changed (sorted 1-based line numbers)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.cells: list[dict] = []  # set_source: a notebook's cells
        self.path_label = QLabel(self)
        self.path_label.setContentsMargins(6, 3, 6, 3)
        self.path_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.editor = _Editor(self)
        font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.editor.setFont(font)
        self.editor.setPlaceholderText("No script loaded.")
        self.highlighter = PythonHighlighter(self.editor.document(), _is_dark(self.palette()))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.path_label)
        layout.addWidget(self.editor)
        self._lines: list[int] = []
        self.set_source("", None)

    def set_source(self, text: str, path: str | None = None, cells: list[dict] | None = None) -> None:
        """Show ``text`` (the script at ``path``) and drop any highlight; breakpoints stay for the same
        file. ``cells`` (a notebook's, see core.programs.notebook) numbers the gutter by cell: ``[4]`` on a
        cell's header, then 1, 2, ..."""
        if path != getattr(self, "_path", None):
            self.editor.breakpoints = set()
            self.editor.paused_line = None
        self._path = path
        self._other_file = False
        self.editor.gutter.setToolTip(GUTTER_TIP)
        self.cells = list(cells or [])  # a notebook's: other views write its lines as "cell 4, line 2"
        self.editor.labels = gutter_labels(cells) if cells else {}
        self.editor.setPlainText(text)
        self.editor.breakpoints = {n for n in self.editor.breakpoints if n <= self.editor.blockCount()}
        self.editor.setViewportMargins(self.editor.gutter_width(), 0, 0, 0)
        cr = self.editor.contentsRect()
        self.editor.gutter.setGeometry(QRect(cr.left(), cr.top(), self.editor.gutter_width(), cr.height()))
        self.path_label.setText(Path(path).name if path else "")
        self.path_label.setToolTip(str(path) if path else "")
        self.path_label.setVisible(bool(path))
        self.clear_highlight()

    def show_other_file(self, text: str, path: str) -> None:
        """Show a file the script calls into (a paused frame's), without breakpoints: they are the script's."""
        self.set_source(text, path)
        self._other_file = True
        self.editor.gutter.setToolTip(OTHER_FILE_TIP)

    def toggle_breakpoint(self, line: int) -> None:
        """Set or clear the breakpoint on a 1-based line (of the script: none in another file shown)."""
        if not 1 <= line <= self.editor.blockCount() or self._other_file:
            return
        self.editor.breakpoints ^= {line}
        self.editor.gutter.update()
        self.sig_breakpoints_changed.emit(self.breakpoints())

    def set_breakpoints(self, lines: list[int]) -> None:
        """Show these breakpoint lines (no signal)."""
        self.editor.breakpoints = {n for n in lines if n}
        self.editor.gutter.update()

    def shown_source(self) -> tuple:
        """What the panel shows, to show again later: (text, path, cells, breakpoints)."""
        return self.editor.toPlainText(), getattr(self, "_path", None), list(self.cells), self.breakpoints()

    def breakpoints(self) -> list[int]:
        """The breakpoint lines, 1-based and sorted."""
        return sorted(self.editor.breakpoints)

    def set_paused_line(self, line: int | None) -> None:
        """Mark the line a debug run is paused at (None clears it) and scroll it into view."""
        self.editor.paused_line = line
        self.editor.gutter.update()
        if line:
            self.highlight_lines([line])

    def highlight_lines(self, lines: list[int]) -> None:
        """Give the 1-based ``lines`` a background and scroll the first into the middle."""
        count = self.editor.blockCount()
        self._lines = sorted({n for n in lines if n and 1 <= n <= count})
        self._apply()
        if self._lines:
            # Scroll without moving the caret; a plain text edit scrolls by whole lines.
            bar = self.editor.verticalScrollBar()
            visible = max(1, self.editor.viewport().height() // max(1, self.editor.fontMetrics().height()))
            bar.setValue(max(0, self._lines[0] - 1 - visible // 3))

    def clear_highlight(self) -> None:
        """Remove every line highlight."""
        self._lines = []
        self._apply()

    def highlighted_lines(self) -> list[int]:
        """The lines now highlighted, 1-based and sorted."""
        return list(self._lines)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self.highlighter.set_dark(_is_dark(self.palette()))
            self._apply()
        super().changeEvent(event)

    def _apply(self) -> None:
        pal = self.palette()
        base, accent = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Highlight)
        t = 0.28 if _is_dark(pal) else 0.2
        colour = QColor.fromRgbF(*(b * (1 - t) + a * t for b, a in zip(base.getRgbF()[:3], accent.getRgbF()[:3])))
        selections = []
        doc = self.editor.document()
        for line in self._lines:
            sel = QTextEdit.ExtraSelection()
            sel.format.setBackground(colour)
            sel.format.setProperty(QTextFormat.Property.FullWidthSelection, True)
            sel.cursor = QTextCursor(doc.findBlockByNumber(line - 1))
            selections.append(sel)
        self.editor.setExtraSelections(selections)
        self.editor.marked = set(self._lines)
        self.editor.gutter.update()
