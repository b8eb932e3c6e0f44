"""How ``show()`` reaches a running window: one line of JSON on a local socket (stdlib only).

The window listens with ``QLocalServer`` on ``address()``, a Unix socket in the user's
private folder; ``show()`` connects with the standard library's ``socket``, so the caller's process
(a notebook kernel) needs no Qt. Where Unix sockets are missing (Windows), ``show()``
starts a new window instead.

The traces ``show()`` writes go to a folder only the user can enter (``private_folder()``),
under names nobody can guess, created afresh (never through a link another user planted).
"""

from __future__ import annotations

import getpass
import json
import linecache
import os
import socket
import stat
import sys
import tempfile
from pathlib import Path
from types import FrameType

TIMEOUT = 3.0
CALL_SHOWN = 48  # characters of the caller's show(...) call kept in the title


def address() -> str:
    """The socket path the window listens on; ``BACKPROP_STUDIO_SOCKET`` overrides it. When
    the user's folder is taken (``private_folder`` falls back to a fresh one), ``show()``
    finds no window there and opens a new one."""
    override = os.environ.get("BACKPROP_STUDIO_SOCKET")
    if override:
        return override
    if hasattr(os, "getuid"):  # inside the user's private folder: no one else can plant or reach it
        return str(private_folder() / "show.sock")
    try:
        user = getpass.getuser()
    except Exception:
        user = "user"
    return str(Path(tempfile.gettempdir()) / f"backprop-studio-{user}.sock")


def private_folder() -> Path:
    """A folder for ``show()``'s traces that only this user can read or enter.

    ``backprop-studio-<user>`` in the temp folder, made 0700; when that name is taken by a
    link, a file or a folder another user owns or can enter, a fresh folder with an
    unguessable name (``tempfile.mkdtemp``) is used instead.
    """
    base = Path(tempfile.gettempdir())
    if not hasattr(os, "getuid"):  # Windows: the temp folder is the user's own
        return Path(tempfile.mkdtemp(prefix="backprop-studio-", dir=base))
    folder = base / f"backprop-studio-{os.getuid()}"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return Path(tempfile.mkdtemp(prefix="backprop-studio-", dir=base))
    try:
        info = os.lstat(folder)
    except OSError:
        info = None
    if (info is None or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
            or stat.S_IMODE(info.st_mode) & 0o077):
        return Path(tempfile.mkdtemp(prefix="backprop-studio-", dir=base))
    return folder


def write_private(text: str, prefix: str = "show-", suffix: str = ".json") -> str:
    """Write ``text`` to a new file in ``private_folder()``: an unguessable name, created
    exclusively (``O_EXCL``, no link followed), readable by the user only (0600). Returns its path."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=private_folder())
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def caller_title(frame: FrameType) -> str:
    """The window's title for a ``show()`` called from ``frame``: its file, line and call as the
    caller wrote it, "train.py:42 — show(loss)" (the file and line alone where the source is gone)."""
    code = frame.f_code
    place = _kernel_cell(code.co_filename, frame.f_lineno) or f"{Path(code.co_filename).name}:{frame.f_lineno}"
    call = _call_text(frame)
    return f"{place} — {call}" if call else place


def _kernel_cell(filename: str, line: int) -> str | None:
    """"cell [5], line 3" for a line of a Jupyter kernel's cell (its file is a temporary name, the
    cell is the kernel's execution count as the notebook shows it); None elsewhere."""
    if "ipykernel_" not in filename and not filename.startswith("<ipython-input-"):
        return None
    ipython = sys.modules.get("IPython")
    try:
        count = ipython.get_ipython().execution_count if ipython is not None else None
    except Exception:  # no shell running
        count = None
    return f"cell [{count}], line {line}" if isinstance(count, int) else None


def _call_text(frame: FrameType) -> str:
    """The source of the call ``frame`` is making, on one line; "" where it cannot be read."""
    code = frame.f_code
    try:
        start, end, col, end_col = list(code.co_positions())[frame.f_lasti // 2]
        lines = linecache.getlines(code.co_filename, frame.f_globals)
        if not (start and end and col is not None and end_col is not None) or end > len(lines):
            return ""
        # columns count UTF-8 bytes
        raw = [line.encode("utf-8") for line in lines[start - 1:end]]
        raw[-1] = raw[-1][:end_col]
        raw[0] = raw[0][col:]
        text = " ".join(b.decode("utf-8", errors="replace").strip() for b in raw)
    except Exception:  # no positions (python -X no_debug_ranges), or no source
        return ""
    text = text.replace("( ", "(").replace(" )", ")")
    if len(text) > CALL_SHOWN:
        head = text[:CALL_SHOWN].rsplit(",", 1)[0] if "," in text[:CALL_SHOWN] else text[:CALL_SHOWN - 1]
        text = head + ", …)" if "," in text[:CALL_SHOWN] else head + "…"
    return text


def send_open(path: str, timeout: float = TIMEOUT, title: str | None = None) -> bool:
    """Ask a running window to open the trace at ``path``, titled ``title`` (``caller_title``);
    False when none answers."""
    if not hasattr(socket, "AF_UNIX"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address())
            message = {"open": str(path), **({"title": title} if title else {})}
            sock.sendall((json.dumps(message) + "\n").encode("utf-8"))
            reply = sock.recv(64)
    except OSError:
        return False
    return reply.startswith(b"ok")
