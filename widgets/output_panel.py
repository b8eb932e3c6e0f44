"""What the script printed, in a bounded read-only console."""

from __future__ import annotations

import logging

from PySide6.QtGui import QFontDatabase, QTextCursor
from PySide6.QtWidgets import QPlainTextEdit, QVBoxLayout, QWidget

log = logging.getLogger(__name__)

MAX_CHARS = 200_000
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

    def append(self, text: str) -> None:
        """Add ``text`` at the end as printed (no newline added); follow the end if already there."""
        if not text:
            return
        bar = self.view.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 2
        if len(text) > self.max_chars:
            text = text[-self.max_chars:]
        cursor = QTextCursor(self.view.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)
        self._trim()
        if at_end:
            bar.setValue(bar.maximum())

    def clear(self) -> None:
        """Remove all output."""
        self.view.clear()
        self._trimmed = False

    def text(self) -> str:
        """The kept output, without the trim note."""
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
