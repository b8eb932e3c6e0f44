"""The window's end of ``show()``: a local socket that opens the traces sent to it.

Each connection sends one JSON line ``{"open": PATH, "title": "train.py:42 — show(loss)"}`` (the
caller's file, line and call); the window opens that trace, titled so, comes to the front and answers
``ok``. The most recently started window listens.
"""

from __future__ import annotations

import json
import logging

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from core.client.show_link import address

log = logging.getLogger(__name__)
TITLE_KEPT = 200  # characters of a sent title shown: a window title is one line


class ShowServer(QObject):
    sig_open = Signal(str)
    """A caller's ``show()`` sent a trace file to open (its path)."""
    sig_show = Signal(str, str)
    """The same, with the title ``show()`` sent: its caller's "file:line — call" ("" when none came)."""

    def __init__(self, parent: QObject | None = None, name: str | None = None):
        super().__init__(parent)
        self.name = name or address()
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        QLocalServer.removeServer(self.name)  # a socket left by a window that crashed
        if not self.server.listen(self.name):
            log.warning("show() cannot reach this window: %s", self.server.errorString())
        self.server.newConnection.connect(self._accept)

    @property
    def listening(self) -> bool:
        return self.server.isListening()

    def close(self) -> None:
        self.server.close()

    def _accept(self) -> None:
        while self.server.hasPendingConnections():
            sock = self.server.nextPendingConnection()
            sock.readyRead.connect(self._on_ready_read)

    def _on_ready_read(self) -> None:
        sock = self.sender()
        if isinstance(sock, QLocalSocket):
            self._read(sock)

    def _read(self, sock: QLocalSocket) -> None:
        if not sock.canReadLine():
            return
        line = bytes(sock.readLine()).decode("utf-8", errors="replace")
        try:
            request = json.loads(line)  # the show link's request, not a worker message
            path, title = request.get("open"), request.get("title")
        except (json.JSONDecodeError, AttributeError):
            path = title = None
        sock.write(b"ok\n" if isinstance(path, str) else b"error: expected {\"open\": PATH}\n")
        sock.flush()
        sock.disconnectFromServer()
        sock.deleteLater()
        if isinstance(path, str):
            self.sig_open.emit(path)
            self.sig_show.emit(path, title[:TITLE_KEPT] if isinstance(title, str) else "")
