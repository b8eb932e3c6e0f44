"""The worker's private pipe ends: the protocol channel, the command reader, the fault file.

At the process boundary stdin carries commands and stdout the protocol; inside the worker
both move to descriptors numbered high (``PRIVATE_FD_MIN``) and marked close-on-exec, out of
a script's usual reach. Only the process that opened the channel writes on it (a forked
child is recognised by its pid), and a script that closes or replaces the descriptor makes
the channel fall back to a private file the parent reads after the worker exits. A Stop
that comes while the script's thread sends waits until the message has left whole
(``core.worker.interrupts``). Every message is sealed with the key the app sent
(``core.protocol.wire.sealer``), so what a script writes on the descriptor, or into the
fallback file, is told apart and dropped. What the channel calls (``os.write``, the JSON
encoder) is bound when it is imported, before any script runs: a script that patches
``json.dumps`` or ``os.write`` in the modules it shares with the worker does not change what
is sent.
Standard library only (a remote worker needs no more than Python and torch).
"""

from __future__ import annotations

import json
import os
import queue
import stat
import threading
from itertools import chain
from typing import Callable

from core.protocol import wire
from core.protocol.switch_interval import quick_switch
from core.model.trace import paused_gc
from core.worker.interrupts import INTERRUPTS

PRIVATE_FD_MIN = 600  # the protocol and command descriptors live above what scripts touch

# Bound now, before any script runs (see above).
_write = os.write
_fstat = os.fstat
_getpid = os.getpid
_open = os.open
_close = os.close
_encoder = json.JSONEncoder(separators=(",", ":"))
_encoder.iterencode = _encoder.iterencode  # on the object: a patched JSONEncoder class does not reach it
_dumps = _encoder.encode
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _unsealed_frame(header: bytes):
    return header, None


class Channel:
    """Writes one JSON message per line on the protocol descriptor, from any thread.

    Only the process that made it writes (a forked child's messages are dropped). If the
    script closed or replaced the descriptor, messages go to ``fallback`` (a file the parent
    made and reads after the worker exits) instead of being lost.
    """

    def __init__(self, fd: int, fallback: str | None = None):
        self.fd = fd
        self.pid = _getpid()
        self.fallback: str | None = None
        self._fallback_id: tuple | None = None
        self._identity = _identity(fd)
        self._lock = threading.Lock()
        self.broken = False  # the script closed or replaced the descriptor
        self.codec: str | None = None  # compress big messages (behind a launcher): see core.protocol.wire
        self.columns = False  # the app reads traces and calls in columns (core.protocol.columns)
        # Called once, from the sending thread, when nothing can reach the app any more and there
        # is no fallback file (a worker behind a launcher), with True when the script closed or
        # replaced the descriptor, False when its far end closed (the reader went away).
        self.on_lost: Callable[[bool], None] | None = None
        self._seal_line: Callable[[bytes], bytes] = bytes
        self._seal_frame = _unsealed_frame
        if fallback:
            self.use_fallback(fallback)

    def seal_with(self, key: bytes) -> None:
        """Seal every message from now on with ``key`` (``core.protocol.wire.sealer``)."""
        self._seal_line, self._seal_frame = wire.sealer(key)

    def use_fallback(self, path: str) -> None:
        """Write to ``path`` (a file the app made) what cannot go down the descriptor; only while
        it is the file it is now: one the script puts in its place is never written."""
        self.fallback, self._fallback_id = path, _file_identity(path)

    def send(self, msg: dict) -> None:
        if _getpid() != self.pid:
            return
        with INTERRUPTS.held():  # a Stop landing in the middle would cut the message off (core.worker.interrupts)
            self._send(msg)

    def _send(self, msg: dict) -> None:
        key = wire.object_key(msg)  # a Trace or CallInfo: as columns where the app reads them
        if key is not None and self.codec and self.columns and self._intact():
            # Encoded here, compressed on the writer thread: the two overlap on two cores.
            self._send_chunks(wire.columns_parts(msg, key, self.codec), wire.chunk_packer(self.codec))
            if not self.broken:
                return
            # The script closed or replaced the pipe on the way: the fallback file gets it as JSON.
        with paused_gc():
            msg = wire.plain_message(msg)
            data = (_dumps(msg) + "\n").encode("utf-8")
        if self.codec not in (None, wire.RAW) and len(data) > wire.FRAME_MIN_BYTES and self._intact():
            self._send_frame(data, msg.get("type", ""))
            if self.broken:
                self._lost()
            return
        with self._lock:
            data = self._seal_line(data)  # numbered here: in the order the lines are written
            if _identity(self.fd) == self._identity:
                try:
                    _write_all(self.fd, data)
                    return
                except OSError:
                    pass
            self.broken = True
            self._send_fallback(data)
        self._lost()

    def _lost(self) -> None:
        if not self.fallback and self.on_lost is not None:
            lost, self.on_lost = self.on_lost, None
            lost(_identity(self.fd) != self._identity)  # still our pipe: its reader went away

    def _intact(self) -> bool:
        """The descriptor is still the pipe the channel opened (a frame is not written into a file
        the script put in its place); asked only before a frame, small messages check it as they write."""
        return not self.broken and _identity(self.fd) == self._identity

    def _send_frame(self, data: bytes, kind: str) -> None:
        """A big message as compressed chunks; a thread writes while the next chunk is compressed."""
        header = wire.header_line(wire.frame_header(kind, len(data), self.codec))
        self._send_chunks(chain([header], wire.frame_chunks(data, self.codec)))

    def _send_chunks(self, chunks, pack=None) -> None:
        """Write a frame's header and chunks; a thread writes while the next chunk is made.
        ``pack`` (see ``wire.chunk_packer``), if given, turns each chunk after the header into
        the bytes to write, on that thread, and ends the frame."""
        chunks = iter(chunks)
        out: queue.Queue = queue.Queue(maxsize=16)
        failed = []

        body = None  # the sealed frame's body HMAC (core.protocol.wire.sealer)

        def write() -> None:  # blocks on a slow link
            while True:
                chunk = out.get()
                if chunk is None and pack is None:
                    return
                if not failed:
                    try:
                        piece = chunk if pack is None else pack(chunk)
                        _write_all(self.fd, body(piece) if body is not None else piece)
                    except OSError as exc:
                        failed.append(exc)
                if chunk is None:
                    return

        with self._lock:
            header, body = self._seal_frame(next(chunks))
            try:
                _write_all(self.fd, header)
            except OSError:
                self.broken = True
                return
            # The writer thread wakes for every chunk while this thread encodes: with the default
            # 5 ms switch interval each wake waits that long for the GIL and the link idles.
            quick_switch(True, "frame")
            try:
                writer = threading.Thread(target=write, name="frame-writer", daemon=True)
                writer.start()
                for chunk in chunks:
                    out.put(chunk)
                out.put(None)
                writer.join()
                if body is not None and not failed:
                    try:
                        _write_all(self.fd, body(None))  # the seal that ends the frame
                    except OSError as exc:
                        failed.append(exc)
            finally:
                quick_switch(False, "frame")
            self.broken = self.broken or bool(failed)

    def _send_fallback(self, data: bytes) -> None:
        """Append to the fallback file, if it is still the one the app made: never through a
        symbolic link, into a FIFO (which would block) or another file the script put there."""
        if not self.fallback:
            return
        try:
            fd = _open(self.fallback, os.O_WRONLY | os.O_APPEND | _NO_FOLLOW)
        except OSError:
            return
        try:
            st = _fstat(fd)
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == self._fallback_id:
                _write_all(fd, data)
        except OSError:
            pass
        finally:
            _close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[_write(fd, view):]


def _identity(fd: int) -> tuple | None:
    try:
        st = _fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _file_identity(path: str) -> tuple | None:
    """(device, inode) of the regular file at ``path`` (not through a symbolic link), or None."""
    try:
        fd = _open(path, os.O_RDONLY | _NO_FOLLOW)
    except OSError:
        return None
    try:
        st = _fstat(fd)
        return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None
    finally:
        _close(fd)


def _private_fd(fd: int) -> int:
    """A close-on-exec duplicate of ``fd`` numbered high, out of the script's usual reach."""
    try:
        import fcntl

        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD_MIN)
    except (ImportError, OSError, AttributeError):
        new = os.dup(fd)
        os.set_inheritable(new, False)
        return new


def _open_fault_file(path: str):
    """The parent's fault file (made 0600 by ``tempfile``); never follows a planted symlink, nor
    opens a FIFO (which would block) or anything but a regular file."""
    try:
        fd = os.open(path, os.O_WRONLY | _NO_FOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
    except OSError:
        os.close(fd)
        return None
    os.set_inheritable(fd, False)
    try:
        import fcntl

        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD_MIN)
        os.close(fd)
        fd = high
    except (ImportError, OSError, AttributeError):
        pass
    return os.fdopen(fd, "w", encoding="utf-8")

