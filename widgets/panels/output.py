"""What the script printed, in a bounded read-only console that stays smooth at any output shape.

Appends are coalesced: text arriving within one frame (``FLUSH_MS``) is written to the
document in one insert. ``\\r`` works as in a terminal (the current line is rewritten, so a
``tqdm`` bar stays one line), and a line without a newline is cut into blocks of
``LINE_CHARS`` characters: a text layout re-wraps a whole block on every change, and one
megabyte-long block froze the window for seconds per chunk. Only the last ``max_chars``
characters are kept. Hand-written because ``QPlainTextEdit`` has no terminal semantics and
no library in the app's dependencies provides them.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFontDatabase, QTextCursor
from PySide6.QtWidgets import QPlainTextEdit, QVBoxLayout, QWidget

log = logging.getLogger(__name__)

MAX_CHARS = 200_000
LINE_CHARS = 2_000  # a longer line is shown as several blocks
FLUSH_MS = 30  # appends within this time are written together
TRIMMED_NOTE = "… earlier output trimmed …\n"


class OutputPanel(QWidget):
    """The script's stdout and stderr, keeping only the last ``max_chars`` characters."""

    def __init__(self, parent: QWidget | None = None, max_chars: int = MAX_CHARS):
        super().__init__(parent)
        self.max_chars = max_chars
        self.view = QPlainTextEdit(self)
        self.view.setReadOnly(True)
        self.view.setUndoRedoEnabled(False)
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.view.setPlaceholderText("The script's printed output appears here.")
        self.view.document().setDocumentMargin(6)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view)
        self.setFocusProxy(self.view)
        self._trimmed = False
        self._pending: list[str] = []
        self._pending_chars = 0
        self._line = ""  # the current line (after the last newline), as shown at the end of the document
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(FLUSH_MS)
        self._timer.timeout.connect(self.flush)

    def append(self, text: str) -> None:
        """Add ``text`` as printed (no newline added); it is shown within one frame."""
        if not text:
            return
        self._pending.append(text)
        self._pending_chars += len(text)
        if self._pending_chars > 4 * self.max_chars:
            # Far more than is kept: drop all but the tail now, not at the next frame.
            joined = "".join(self._pending)[-2 * self.max_chars:]
            self._pending, self._pending_chars = [joined], len(joined)
            self._line = ""
            self._trimmed = True
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        """Write the pending text to the document now."""
        self._timer.stop()
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending, self._pending_chars = [], 0
        bar = self.view.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 2
        old_line = self._line
        done, self._line = self._apply(text, old_line)
        cursor = QTextCursor(self.view.document())
        cursor.beginEditBlock()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if old_line:
            cursor.movePosition(QTextCursor.MoveOperation.Left, QTextCursor.MoveMode.KeepAnchor, len(old_line))
        cursor.insertText(done + self._line)
        cursor.endEditBlock()
        self._trim()
        shown = self.view.document().lastBlock().text()
        if len(self._line) > len(shown):  # the trim cut into the current line
            self._line = self._line[len(self._line) - len(shown):]
        if at_end:
            bar.setValue(bar.maximum())

    def _apply(self, text: str, line: str) -> tuple[str, str]:
        """(finished text, new current line) after writing ``text`` with terminal semantics."""
        done: list[str] = []
        pieces = text.split("\n")
        for i, piece in enumerate(pieces):
            if "\r" in piece:
                parts = piece.split("\r")
                line += parts[0]
                for part in parts[1:]:
                    if part:  # "\r" then text: overwrite from the line's start
                        line = part + line[len(part):]
                    # a trailing "\r" (tqdm's) only moves the cursor: nothing to show yet
            else:
                line += piece
            if len(line) > LINE_CHARS:
                cut = len(line) - len(line) % LINE_CHARS
                if cut == len(line):
                    cut -= LINE_CHARS
                done.extend(line[j:j + LINE_CHARS] + "\n" for j in range(0, cut, LINE_CHARS))
                line = line[cut:]
            if i < len(pieces) - 1:
                done.append(line + "\n")
                line = ""
        return "".join(done), line

    def clear(self) -> None:
        """Remove all output."""
        self._timer.stop()
        self._pending, self._pending_chars = [], 0
        self._line = ""
        self.view.clear()
        self._trimmed = False

    def text(self) -> str:
        """The kept output, without the trim note."""
        self.flush()
        text = self.view.toPlainText()
        return text[len(TRIMMED_NOTE):] if self._trimmed and text.startswith(TRIMMED_NOTE) else text

    def _trim(self) -> None:
        doc = self.view.document()
        note = len(TRIMMED_NOTE) if self._trimmed else 0
        size = doc.characterCount() - 1 - note
        # Trim in chunks, so a chatty loop does not pay for a trim on every append.
        if size <= self.max_chars + max(1000, self.max_chars // 10):
            return
        cut = note + size - self.max_chars
        block = doc.findBlock(cut)
        if block.position() != cut and block.next().isValid():
            cut = block.next().position()  # keep whole lines
        cursor = QTextCursor(doc)
        cursor.setPosition(0)
        cursor.setPosition(cut, QTextCursor.MoveMode.KeepAnchor)
        cursor.insertText(TRIMMED_NOTE)
        self._trimmed = True
        log.debug("output trimmed to %d characters", self.max_chars)
