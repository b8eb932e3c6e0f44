"""How ``show()`` reaches a running window: one line of JSON on a local socket (stdlib only).

The window listens with ``QLocalServer`` on ``address()``, a Unix socket path private to the
user; ``show()`` connects with the standard library's ``socket``, so the caller's process
(a notebook kernel) needs no Qt. Where Unix sockets are missing (Windows), ``show()``
starts a new window instead.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import tempfile
from pathlib import Path

TIMEOUT = 3.0


def address() -> str:
    """The socket path the window listens on; ``BACKPROP_STUDIO_SOCKET`` overrides it."""
    override = os.environ.get("BACKPROP_STUDIO_SOCKET")
    if override:
        return override
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return str(Path(tempfile.gettempdir()) / f"backprop-studio-{user}.sock")


def send_open(path: str, timeout: float = TIMEOUT) -> bool:
    """Ask a running window to open the trace at ``path``; False when none answers."""
    if not hasattr(socket, "AF_UNIX"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address())
            sock.sendall((json.dumps({"open": str(path)}) + "\n").encode("utf-8"))
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith(b"ok")
