"""Files that travel to a remote worker: a saved model, its weights, a Hugging Face folder.

A script travels as text in the ``run`` command (``core.client.launchers.run_payload``); a binary
file (a ``.pt2`` program, a TorchScript archive, a pickled model, the ``--weights`` of a
model script, every file of a Hugging Face model folder) cannot, and may be gigabytes. It is
sent before the ``run`` command, on the same stdin, as:

- ``{"cmd": "file", "name": "model.pt2", "size": N}``: a file begins (``name`` is relative,
  ``/`` between folders);
- ``{"cmd": "file_chunk", "bytes": K, "codec": "zlib"}`` followed by exactly K bytes: the next
  piece, up to ``CHUNK`` raw bytes, compressed on its own with ``codec`` (zlib, or zstd where
  both sides have it), or raw (``codec`` null) when compressing did not save a tenth
  (weights rarely shrink, a config does);
- ``{"cmd": "file_chunk", "bytes": 0, "end": true}``: the file is complete;
- ``{"cmd": "file_abort"}``: drop what arrived (the run was replaced or stopped).

Each piece is one write, so a command the app sends meanwhile (Stop) passes between two
pieces and is read at once. The worker writes the pieces into its *inbox*, a private
temporary folder that becomes the run's folder (``core.worker.remote.Materialized``); it is
removed after the run, when the connection drops and when the worker exits, so nothing is
left on the host. The app reports ``transfer`` events with ``of: "upload"`` as it sends.
Standard library only: the worker side runs on hosts with nothing but Python and torch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Callable

from core.protocol import wire

CHUNK = 256 * 1024  # raw bytes per piece: a Stop waits at most one piece on the link
GIVE_UP = 4  # pieces in a row that compression did not shrink by a tenth: the rest of the file goes raw
TEXT_SUFFIXES = (".py", ".ipynb")  # travel as the run's ``source``; everything else as files
WEIGHTS_FOLDER = "_weights"  # where a model script's --weights file lands in the run's folder


class UploadError(ValueError):
    """A file that cannot be sent or received; the message names it."""


# -- the app's side ---------------------------------------------------------------------------------
def is_text_script(path: str | Path) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix.lower() in TEXT_SUFFIXES


def plan(path: str | Path, load: dict | None = None) -> tuple[dict, list[tuple[Path, str]]]:
    """What a run of ``path`` sends as files: (``uploads`` for the run command, [(local file, name)]).

    ``uploads`` says where the files land in the run's folder: ``main`` (the opened model file
    or folder) and ``weights``. A model script (text) with ``--weights`` sends only the weights.
    """
    p = Path(path)
    uploads: dict = {}
    files: list[tuple[Path, str]] = []
    if p.is_dir():
        for root, dirs, names in os.walk(p):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            for name in sorted(names):
                if not name.startswith("."):
                    f = Path(root) / name
                    files.append((f, str(PurePosixPath(p.name, *f.relative_to(p).parts))))
        uploads["main"] = p.name
    elif not is_text_script(p):
        files.append((p, p.name))
        uploads["main"] = p.name
    weights = (load or {}).get("weights")
    if weights:
        w = Path(weights)
        if not w.is_file():
            raise UploadError(f"--weights {weights}: no such file")
        uploads["weights"] = f"{WEIGHTS_FOLDER}/{w.name}"
        files.append((w, uploads["weights"]))
    return uploads, files


def pieces(path: Path, codec: str | None):
    """``(header line + body, raw bytes read)`` for each piece of ``path``, then its end.

    A piece is sent compressed only when that saves at least a tenth; after ``GIVE_UP``
    pieces in a row that did not, the rest of the file goes raw (trained weights barely
    compress, and trying costs more time than the link saves)."""
    misses = 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(CHUNK)
            if not raw:
                break
            body, used = raw, None
            if codec and misses < GIVE_UP:
                comp = wire.compressor(codec)
                packed = comp.compress(raw) + comp.flush()
                if len(packed) <= 0.9 * len(raw):
                    body, used, misses = packed, codec, 0
                else:
                    misses += 1
            head = json.dumps({"cmd": "file_chunk", "bytes": len(body), "codec": used}).encode() + b"\n"
            yield head + body, len(raw)
    yield json.dumps({"cmd": "file_chunk", "bytes": 0, "end": True}).encode() + b"\n", 0


def send_files(write: Callable[[bytes], None], files: list[tuple[Path, str]], codec: str | None,
               on_event: Callable[[dict], None] | None = None, wanted: Callable[[], bool] = lambda: True) -> bool:
    """Send ``files`` with ``write`` (one call per piece); False when ``wanted()`` turned False
    or the pipe broke. ``on_event`` gets ``transfer`` events (``of: "upload"``) at most once per
    MiB and at the end of each file."""
    total = sum(f.stat().st_size for f, _ in files)
    sent = last = 0
    try:
        for path, name in files:
            size = path.stat().st_size
            write(json.dumps({"cmd": "file", "name": name, "size": size}).encode() + b"\n")
            done = 0
            for data, raw in pieces(path, codec):
                if not wanted():
                    write(json.dumps({"cmd": "file_abort"}).encode() + b"\n")
                    return False
                write(data)
                done += raw
                sent += raw
                if on_event is not None and (sent - last >= 1 << 20 or (raw == 0 and size >= 1 << 20)):
                    last = sent
                    on_event({"type": "transfer", "of": "upload", "name": name, "sent": sent, "raw": total,
                              "file_sent": done, "file_size": size, "codec": codec})
    except OSError:
        return False  # the worker is gone: its exit reports why
    return True


# -- the worker's side --------------------------------------------------------------------------------
INBOXES: set[str] = set()  # folders to remove when the worker ends (core.worker.remote.end_group)


class Inbox:
    """Where uploaded files are written on the worker's host until a run takes them."""

    def __init__(self):
        self.dir: str | None = None
        self._file = None
        self._name = ""
        self._left = 0  # bytes of the current file still to come
        self.error = ""  # the first upload that failed, said when the run starts

    def receive(self, cmd: dict, data: bytes = b"") -> None:
        kind = cmd.get("cmd")
        if kind == "file":
            self._open(str(cmd.get("name", "")), int(cmd.get("size", 0)))
        elif kind == "file_chunk":
            if cmd.get("end"):
                if self._file is not None and self._left != 0:
                    self._fail(f"{self._name}: {self._left} bytes short of its size" if self._left > 0
                               else f"{self._name}: {-self._left} bytes more than its size")
                self._close()
            elif self._file is not None:
                try:
                    piece = _unpack(data, cmd.get("codec"))
                    self._file.write(piece)
                    self._left -= len(piece)
                except (OSError, wire.ProtocolMismatch, ValueError, zlib.error) as exc:
                    self._fail(f"{self._name}: {exc}")
        elif kind == "file_abort":
            self.cleanup()

    def _open(self, name: str, size: int) -> None:
        self._close()
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or ".." in parts or "\\" in name:
            self._fail(f"refused to write {name!r}: not a plain relative file name")
            return
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix="backprop-studio-")
            INBOXES.add(self.dir)
        target = os.path.join(self.dir, *parts)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            self._file = open(target, "wb")
        except OSError as exc:
            self._fail(f"cannot write {name}: {exc}")
            return
        self._name, self._left = name, size

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _fail(self, message: str) -> None:
        self._close()
        self.error = self.error or message

    def take(self) -> tuple[str | None, str]:
        """The folder holding what arrived (the caller now owns it) and the first error; the inbox is empty after."""
        self._close()
        folder, error = self.dir, self.error
        self.dir, self.error = None, ""
        return folder, error

    def cleanup(self) -> None:
        self._close()
        if self.dir is not None:
            remove_folder(self.dir)
        self.dir, self.error = None, ""


def remove_folder(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    INBOXES.discard(folder)


def remove_all() -> None:
    """Remove every temporary folder this worker made (before it is killed or exits)."""
    for folder in list(INBOXES):
        remove_folder(folder)


def _unpack(data: bytes, codec: str | None) -> bytes:
    if not codec:
        return data
    dec = wire.decompressor(codec)
    out = dec.decompress(data)
    flush = getattr(dec, "flush", None)
    return out + flush() if flush is not None else out


class CommandReader:
    """The worker's stdin as command lines, with ``read_exact`` for the bytes of a file piece."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buf = bytearray()
        self._eof = False

    def _fill(self) -> bool:
        if self._eof:
            return False
        try:
            chunk = os.read(self.fd, 1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def __iter__(self):
        while True:
            at = self._buf.find(b"\n")
            while at < 0:
                if not self._fill():
                    return
                at = self._buf.find(b"\n")
            line = bytes(self._buf[:at])
            del self._buf[:at + 1]
            if line.strip():
                yield line.decode("utf-8", errors="replace")

    def read_exact(self, n: int) -> bytes | None:
        """The next ``n`` bytes, or None when the stream ends first."""
        while len(self._buf) < n:
            if not self._fill():
                return None
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data
