"""What both ends of the worker pipe agree on beyond plain JSON lines: the protocol version and
compressed frames for big messages. Standard library only, so a remote worker needs no more
than Python and torch.

A big message (a trace or a captured call: 50 MB of JSON on 50,000 nodes; any message over
64 KiB) travels as one *frame*: a JSON line
``{"type": "frame", "codec": "zlib", "raw": M, "of": "trace"}`` followed by the message's JSON
compressed in chunks, each a 4-byte big-endian length and that many bytes, ended by a zero
length. The sender compresses 1 MiB at a time while a thread writes what is ready, so
compression overlaps the transfer; the reader decompresses each chunk as it arrives and
reports bytes received and decoded against M, so the window can show a progress bar. zstd is used where the ``zstandard`` module (or
Python 3.14's ``compression.zstd``) is installed on both sides, zlib otherwise: the worker's
hello lists its codecs, the app asks for one it reads, and a worker without zstd answers in zlib.
The local worker is asked for ``raw`` frames: chunks as they are, no compression on a pipe in
memory, so that its traces too travel in columns.

A message carrying a Trace or CallInfo (``trace``, ``call_trace``) travels in the columnar
encoding of ``core.protocol.columns`` when the app's run command lists ``columns`` in its
``encodings``: the header then says ``"enc": "columns"``, names the message's field that holds
the object (``"key"``) and carries the message's other fields (``"msg"``); ``raw`` is an
estimate until the end. The sender encodes column by column while its writer thread
compresses and writes each batch (zlib and zstd release the GIL: the two use two cores), so
encoding overlaps the transfer; the app reads the pipe on a thread of its own
(``read_ahead``) and parses each column as it arrives.

Every message is *sealed* with a key the app makes for each worker and sends as the first line
on its stdin (``{"cmd": "channel", "key": HEX}``: never in its arguments or environment, which
a script can read): a line ends in a tab, a sequence number and the HMAC-SHA256 of both, and a
frame's header is such a line, its body (every byte after the header, the zero length
included) followed by 32 bytes, the HMAC of that body and the header's number. The app drops
what fails the check (a line or frame a script wrote on the descriptor, or into the fallback
file, a replayed or reordered one) and says how many (``Check``): what it shows as the run's
came from the worker. A script shares the worker's memory, so one set on it could still dig the
key out; the seal keeps out what is written to the descriptor or the file.
"""

from __future__ import annotations

import gc
import hashlib
import hmac
import json
import queue
import threading
import zlib
from typing import Callable, Iterable, Iterator

# Imported now, not when first needed: while a script runs, the worker hides the app's modules.
from core.model.memory import format_bytes
from core.protocol.switch_interval import quick_switch
from core.model.trace import CallInfo, Trace, TraceFormatError, paused_gc
from core.model.trace_json import call_to_dict
from core.protocol.column_reader import ColumnReader
from core.protocol.columns import encode_lines

PROTOCOL_VERSION = 5  # bumped whenever a message changes meaning; both ends must agree
CHUNK = 1 << 20  # raw bytes compressed at a time
FRAME_MIN_BYTES = 64 * 1024  # smaller messages travel as plain JSON lines
COLUMNS_FIRST = 64 * 1024  # raw bytes of a columnar frame's first batch, then of each next one:
COLUMNS_BATCH = 256 * 1024  # each is compressed and sent while the following columns are encoded
FREEZE_MIN_BYTES = 8 << 20  # columnar frames this big leave their objects out of later collections
ZLIB_LEVEL = 1  # level 1 compresses 50 MB of trace JSON 5x in 0.3 s; level 6 gains 20 % for 3x the time
SEAL_BYTES = 32  # an HMAC-SHA256 digest: what follows a sealed frame's body
KEY_BYTES = 32

# Bound now: a script that patches ``json.dumps`` (``functools.partial(json.dumps, indent=2)``)
# or ``zlib`` in the worker, which shares these modules, must not change what it sends.
_header_json = json.JSONEncoder().encode
_header_json.__self__.iterencode = _header_json.__self__.iterencode
_zlib_compressobj = zlib.compressobj
_hmac_new = hmac.new
_compare = hmac.compare_digest


class ProtocolMismatch(RuntimeError):
    """The worker speaks another protocol version than this app."""


def check_hello(hello: dict, where: str = "the worker") -> None:
    """Raise ProtocolMismatch with a clear message when ``hello`` is from another protocol version."""
    theirs = hello.get("protocol", 1)
    if theirs != PROTOCOL_VERSION:
        raise ProtocolMismatch(
            f"{where} speaks protocol version {theirs}, this app speaks version {PROTOCOL_VERSION}: "
            f"install the same Backprop Studio version there (its worker is "
            f"'python -m core.worker', torch {hello.get('torch', '?')}, Python {hello.get('python', '?')})")


ENCODINGS = ["columns"]  # what the app reads besides JSON; sent with each run command
# The local worker's frames: its pipe is in memory, so compressing would only cost CPU, but a
# trace in columns is encoded and read 4-5x faster than its JSON (2 s each way at 50,000 nodes).
RAW = "raw"


class _Raw:
    """The ``raw`` codec's compressor and decompressor: the bytes as they are."""

    @staticmethod
    def compress(data: bytes, *_) -> bytes:
        return bytes(data)

    decompress = compress

    @staticmethod
    def flush(*_) -> bytes:
        return b""


def _zstd():
    try:
        from compression import zstd  # Python 3.14

        return zstd
    except ImportError:
        pass
    try:
        import zstandard

        return zstandard
    except ImportError:
        return None


def available_codecs() -> list[str]:
    return ["zstd", "zlib"] if _zstd() is not None else ["zlib"]


def pick_codec(asked: str | None) -> str | None:
    """The codec to use for ``asked``: zstd falls back to zlib where it is not installed."""
    if not asked or asked == "none":
        return None
    if asked == "zstd" and _zstd() is None:
        return "zlib"
    return asked if asked in ("zstd", "zlib", RAW) else "zlib"


def compressor(codec: str):
    """An object with ``compress(bytes)`` and ``flush()`` for ``codec`` (zlib, zstd or raw)."""
    if codec == RAW:
        return _Raw()
    if codec == "zstd":
        z = _zstd()
        return z.ZstdCompressor(level=1).compressobj() if z.__name__ == "zstandard" else z.ZstdCompressor(level=1)
    return _zlib_compressobj(ZLIB_LEVEL)


def decompressor(codec: str | None):
    """An object with ``decompress(bytes)`` for ``codec``; ProtocolMismatch for one not installed here."""
    if codec == "zstd":
        z = _zstd()
        if z is None:
            raise ProtocolMismatch("the worker sent zstd data but zstd is not installed here (pip install zstandard)")
        return z.ZstdDecompressor().decompressobj() if z.__name__ == "zstandard" else z.ZstdDecompressor()
    if codec == "zlib":
        return zlib.decompressobj()
    if codec == RAW:
        return _Raw()
    raise ProtocolMismatch(f"the worker sent a frame in an unknown codec {codec!r}")


def frame_header(kind: str, raw_bytes: int, codec: str) -> dict:
    """The line announcing a frame: the message's type, its JSON size, the codec."""
    return {"type": "frame", "codec": codec, "raw": raw_bytes, "of": kind}


def header_line(header: dict) -> bytes:
    """A frame's header as the line that announces it."""
    return (_header_json(header) + "\n").encode("utf-8")


def new_key() -> bytes:
    """A fresh key for one worker's seal."""
    import secrets

    return secrets.token_bytes(KEY_BYTES)


def sealer(key: bytes):
    """The worker's seal, as two functions: ``seal_line(data)`` numbers and seals one line (a JSON
    text, with or without its newline); ``seal_frame(header_line)`` seals a frame's header and
    returns it with ``body``: ``body(piece)`` takes each piece written after the header and
    hands it back, ``body(None)`` gives the 32 bytes that end the frame. Call them in the order
    the pieces are written (under the channel's lock). The key lives only in the HMAC state
    these closures hold: in no attribute or module global a script would come across."""
    copy = _hmac_new(key, digestmod=hashlib.sha256).copy
    count = [0]

    def seal_line(data: bytes) -> bytes:
        count[0] += 1
        head = b"%d" % count[0]
        payload = data[:-1] if data.endswith(b"\n") else data
        mac = copy()
        mac.update(head + b"\t")
        mac.update(payload)
        return b"".join((payload, b"\t", head, b" ", mac.hexdigest().encode(), b"\n"))

    def seal_frame(header: bytes):
        sealed = seal_line(header)
        mac = copy()
        mac.update(b"body %d\n" % count[0])

        def body(piece: bytes | None) -> bytes:
            if piece is None:
                return mac.digest()
            mac.update(piece)
            return piece

        return sealed, body

    return seal_line, seal_frame


class Check:
    """The app's side of the seal: opens each sealed line and frame body, and keeps why any failed.

    ``required``: the worker seals (the app's own local worker). Otherwise (a worker behind a
    launcher) the first line tells: a sealed one makes seals required from then on; a hello
    without one is a worker that does not seal (one driven by hand), whose lines pass as they
    are. Before that first word nothing of the script's can have run.
    """

    def __init__(self, key: bytes, required: bool = True):
        self._copy = _hmac_new(key, digestmod=hashlib.sha256).copy
        self.sealed: bool | None = True if required else None
        self.last = 0  # the number of the last line that passed: a smaller one is sent again or out of order
        self.dropped: dict[str, int] = {}  # why dropped messages failed: how many for each reason, in first order

    def line(self, line: bytes) -> bytes | None:
        """The line's JSON text, or None when it failed the check (then counted in ``dropped``)."""
        if self.sealed is False or not line.strip():  # a blank line carries nothing to forge
            return line
        payload, why = self._open(line)
        if why is None:
            self.sealed = True
            return payload
        if self.sealed is None:  # a launcher's words before the worker's first, or a worker that does not seal
            if _is_hello(line):
                self.sealed = False
            return line
        self.dropped[why] = self.dropped.get(why, 0) + 1
        return None

    def _open(self, line: bytes) -> tuple[bytes, str | None]:
        payload, tab, tag = line.rpartition(b"\t")
        head, _, mac = tag.partition(b" ")
        if not tab or not head.isdigit() or len(mac) != 2 * SEAL_BYTES:
            return line, "a line without a seal"
        check = self._copy()
        check.update(head + b"\t")
        check.update(payload)
        if not _compare(check.hexdigest().encode(), mac):
            return line, "a line whose seal does not match"
        seq = int(head)
        if seq <= self.last:
            return line, "a line sent again or out of order"
        self.last = seq
        return payload, None

    def body(self):
        """The HMAC of the body of the frame whose header just passed (``update`` it with each byte)."""
        mac = self._copy()
        mac.update(b"body %d\n" % self.last)
        return mac

    def body_matches(self, mac, seal: bytes) -> bool:
        if _compare(mac.digest(), seal):
            return True
        why = "a frame whose seal does not match"
        self.dropped[why] = self.dropped.get(why, 0) + 1
        return False

    def summary(self) -> str:
        """The run's warning when messages were dropped ("" when none was)."""
        if not self.dropped:
            return ""
        why = "; ".join(self.dropped)
        return (f"a message on the worker's channel failed its check: {sum(self.dropped.values())} dropped ({why}); "
                f"what is shown came from the worker")


def _is_hello(line: bytes) -> bool:
    try:
        msg = json.loads(line)
    except ValueError:
        return False
    return isinstance(msg, dict) and msg.get("type") == "hello"


class BadStream(ProtocolMismatch):
    """Bytes on the worker's channel that cannot be decoded (a frame header that is not JSON, an
    unknown codec, a body that does not decompress): nothing after them can be read."""


def _excerpt(data: bytes, limit: int = 80) -> str:
    text = repr(data[:limit])
    return text + (f" (of {len(data)} bytes)" if len(data) > limit else "")


def frame_chunks(raw: bytes, codec: str):
    """The compressed chunks of a frame's body, each as ``4-byte big-endian length + bytes``, then
    a zero length. Compressing slice by slice lets the first bytes leave while the rest is encoded."""
    comp = compressor(codec)
    for at in range(0, len(raw), CHUNK):
        out = comp.compress(raw[at:at + CHUNK])
        if out:
            yield len(out).to_bytes(4, "big") + out
    out = comp.flush()
    if out:
        yield len(out).to_bytes(4, "big") + out
    yield (0).to_bytes(4, "big")


def object_key(msg: dict) -> str | None:
    """The field of ``msg`` holding a Trace or CallInfo object (``trace`` or ``call``), if any."""
    for key in ("trace", "call"):
        if isinstance(msg.get(key), (Trace, CallInfo)):
            return key
    return None


def plain_message(msg: dict) -> dict:
    """``msg`` with any Trace or CallInfo object in it turned into its JSON dict."""
    key = object_key(msg)
    if key is None:
        return msg
    obj = msg[key]
    return {**msg, key: obj.to_dict() if key == "trace" else call_to_dict(obj)}


def estimated_size(obj) -> int:
    """Roughly the bytes of ``obj``'s columnar encoding (within 10 % on the residual-MLP examples,
    float32 previews; up to twice that for float64 ones): the progress bar's scale."""
    calls = obj.calls if isinstance(obj, Trace) else [obj]
    tensors = sum(len(c.tensors) for c in calls) + (len(obj.tensors) if isinstance(obj, Trace) else 0)
    nodes = sum(len(c.nodes) for c in calls)
    leaves = sum(len(c.leaf_grads) for c in calls)  # a name in leaf_grads and in the call's options
    extra = len(obj.source) + len(obj.output) + 250 * len(obj.memory) if isinstance(obj, Trace) else 0
    return 4096 + 85 * nodes + 176 * tensors + 25 * sum(len(c.storages) for c in calls) + 80 * leaves + extra


class Packer:
    """Compresses a stream piece by piece, flushing a block at each ``cut`` so the bytes leave now."""

    def __init__(self, codec: str):
        self.codec = codec
        self.comp = compressor(codec)
        z = _zstd() if codec == "zstd" else None
        if z is None:
            self._cut = lambda: self.comp.flush(zlib.Z_SYNC_FLUSH)
        elif z.__name__ == "zstandard":
            self._cut = lambda: self.comp.flush(z.COMPRESSOBJ_FLUSH_BLOCK)
        else:
            self._cut = lambda: self.comp.compress(b"", mode=z.ZstdCompressor.FLUSH_BLOCK)

    def cut(self, data: bytes) -> bytes:
        return self.comp.compress(data) + self._cut()

    def end(self) -> bytes:
        return self.comp.flush()


def columns_frame(msg: dict, key: str, codec: str):
    """A message holding a Trace or CallInfo as a columnar frame: the header line, then chunks
    (4-byte length + compressed bytes) made as the columns are encoded, then a zero length."""
    parts = columns_parts(msg, key, codec)
    yield next(parts)
    pack = chunk_packer(codec)
    for batch in parts:
        yield pack(batch)
    yield pack(None)


def columns_parts(msg: dict, key: str, codec: str):
    """The header line of a columnar frame, then its raw column lines in batches of about
    ``COLUMNS_BATCH`` bytes, each ready for ``chunk_packer``: the sender compresses on its writer
    thread (zlib and zstd release the GIL) while the next batch is encoded."""
    obj = msg[key]
    rest = {k: v for k, v in msg.items() if k != key}
    header = {**frame_header(msg.get("type", ""), estimated_size(obj), codec), "enc": "columns", "key": key,
              "msg": rest}
    yield (_header_json(header) + "\n").encode("utf-8")
    batch: list[bytes] = []
    size, limit = 0, COLUMNS_FIRST  # the first batch small: the link starts while the rest is encoded
    for line in encode_lines(obj):
        batch.append(line)
        size += len(line)
        if size >= limit:
            yield b"".join(batch)
            batch, size, limit = [], 0, COLUMNS_BATCH
    if batch:
        yield b"".join(batch)


def chunk_packer(codec: str) -> Callable[[bytes | None], bytes]:
    """``pack(batch)``: the batch compressed and cut as one chunk (4-byte length + bytes);
    ``pack(None)`` ends the frame (what the compressor still holds, then a zero length)."""
    packer = Packer(codec)

    def pack(batch: bytes | None) -> bytes:
        if batch is None:
            out = packer.end()
            return (len(out).to_bytes(4, "big") + out if out else b"") + (0).to_bytes(4, "big")
        out = packer.cut(batch)
        return len(out).to_bytes(4, "big") + out

    return pack


def read_ahead(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """What ``chunks`` yields, read on a thread of its own: the worker's pipe keeps being drained
    while the caller decodes what came (building 50,000 nodes takes a tenth of a second, and a
    pipe holds 64 KiB: without this, the link idles while the app builds)."""
    got: queue.SimpleQueue = queue.SimpleQueue()
    end = object()

    def pump() -> None:
        try:
            for chunk in chunks:
                got.put(chunk)
        except BaseException as exc:  # handed to the reader, raised there
            got.put(exc)
        finally:
            got.put(end)

    threading.Thread(target=pump, name="read-ahead", daemon=True).start()
    while (item := got.get()) is not end:
        if isinstance(item, BaseException):
            raise item
        yield item


class StreamDecoder:
    """Turns the bytes of the worker's stdout into messages, one JSON text per call of ``on_line``.

    Plain lines pass through; a frame header switches to reading its chunks, decompressing
    each as it arrives, and the message's JSON goes to ``on_line`` once the zero length comes.
    A columnar frame's columns are parsed as they arrive, and ``on_line`` gets the message
    itself (a dict holding the Trace or CallInfo, or the TraceFormatError that reading it raised).
    ``on_progress(header, bytes_received, raw_bytes_decoded)`` follows every chunk. With a
    ``check`` (``Check``), sealed lines and frames are opened and what fails is dropped (the
    check keeps why). Bytes that cannot be decoded raise ``BadStream``, naming what was wrong.
    """

    def __init__(self, on_line: Callable[[bytes], None],
                 on_progress: Callable[[dict, int, int], None] | None = None, check: Check | None = None):
        self.on_line = on_line
        self.on_progress = on_progress
        self.check = check
        self._mac = None  # the HMAC of the sealed frame being read
        self._buf = bytearray()
        self._pos = 0  # start of what is not consumed yet, within this feed
        self._scan = 0  # where to look for the next newline
        self._frame: dict | None = None
        self._dec = None
        self._parts: list[bytes] = []
        self._got = self._decoded = 0
        self._columns = None  # the ColumnReader of a columnar frame (or the error that ended it)
        self._tail = b""  # a column line not complete yet
        self._gc: bool | None = None  # whether the collector was on before a columnar frame paused it

    def feed(self, data: bytes) -> None:
        self._buf += data
        self._pos = 0
        while self._step():
            pass
        del self._buf[: self._pos]  # once per feed: lines are sliced off by position, not one by one
        self._scan -= self._pos

    def _step(self) -> bool:
        buf, pos = self._buf, self._pos
        if self._frame is None:
            at = buf.find(b"\n", max(self._scan, pos))
            if at < 0:
                self._scan = len(buf)
                return False
            line = bytes(buf[pos:at])
            self._pos = self._scan = at + 1
            if self.check is not None:
                line = self.check.line(line)
                if line is None:
                    return True  # failed its check: dropped, and counted there
            if line.startswith((b'{"type": "frame"', b'{"type":"frame"')):
                self._start_frame(line)
            elif line.strip():
                self.on_line(line)
            return True
        if len(buf) - pos < 4:
            return False
        size = int.from_bytes(buf[pos:pos + 4], "big")
        if size == 0:
            end = pos + 4 + (SEAL_BYTES if self._mac is not None else 0)
            if len(buf) < end:
                return False
            self._pos = self._scan = end
            if self._mac is not None:
                mac, self._mac = self._mac, None
                mac.update(buf[pos:pos + 4])
                if not self.check.body_matches(mac, bytes(buf[pos + 4:end])):
                    self._drop_frame()
                    return True
            if self._columns is not None:
                self._end_columns()
                return True
            text, header = b"".join(self._parts), self._frame
            self._frame, self._dec, self._parts = None, None, []
            if self.on_progress is not None:
                self.on_progress(header, self._got + 4, len(text))
            self.on_line(text.rstrip(b"\n"))
            return True
        if len(buf) - pos < 4 + size:
            return False
        data = bytes(buf[pos + 4:pos + 4 + size])
        if self._mac is not None:
            self._mac.update(buf[pos:pos + 4])
            self._mac.update(data)
        try:
            out = self._dec.decompress(data)
        except Exception as exc:  # zlib.error, zstd's ZstdError: the body is not what its header said
            raise BadStream(f"{self._what()} does not decompress as {self._frame.get('codec')!r} "
                            f"({type(exc).__name__}: {exc})") from exc
        self._pos = self._scan = pos + 4 + size
        self._got += 4 + size
        self._decoded += len(out)
        if self._columns is not None:
            self._feed_columns(out)
        else:
            self._parts.append(out)
        if self.on_progress is not None:
            self.on_progress(self._frame, self._got, self._decoded)
        return True

    def _start_frame(self, line: bytes) -> None:
        """Read a frame's header; one that cannot be read raises BadStream saying why."""
        try:
            header = json.loads(line)
        except ValueError as exc:
            raise BadStream(f"the worker sent a frame header that is not JSON ({exc}): {_excerpt(line)}") from exc
        if not isinstance(header, dict):
            raise BadStream(f"the worker sent a frame header that is not a JSON object: {_excerpt(line)}")
        try:
            self._dec = decompressor(header.get("codec"))
        except ProtocolMismatch as exc:
            raise BadStream(f"{exc}: {_excerpt(line)}") from exc
        if header.get("enc") not in (None, "columns"):
            raise BadStream(f"the worker sent a frame in an unknown encoding {header.get('enc')!r}: {_excerpt(line)}")
        self._frame = header
        self._parts, self._got, self._decoded = [], 0, 0
        self._columns = None
        self._mac = self.check.body() if self.check is not None and self.check.sealed else None
        if header.get("enc") == "columns":
            self._columns = ColumnReader(f"the {header.get('of') or 'message'} from the worker")
            self._pause_gc()
            self._tail = b""

    def _what(self) -> str:
        return f"the {self._frame.get('of') or 'message'} frame from the worker"

    def _drop_frame(self) -> None:
        """A frame whose seal failed: its message is not handed on."""
        self._frame, self._dec, self._columns, self._parts, self._tail = None, None, None, [], b""
        self._resume_gc()

    def _feed_columns(self, out: bytes) -> None:
        """Parse each complete column line now, while the next chunks are on their way."""
        if not out or isinstance(self._columns, TraceFormatError):
            return
        lines = (self._tail + out).split(b"\n")
        self._tail = lines.pop()
        try:
            with paused_gc():
                for line in lines:
                    self._columns.feed(line)
        except TraceFormatError as exc:
            self._columns = exc  # reported when the frame ends

    def _end_columns(self) -> None:
        header, reader = self._frame, self._columns
        self._frame, self._dec, self._columns = None, None, None
        msg = dict(header.get("msg") or {})
        try:
            if isinstance(reader, TraceFormatError):
                raise reader
            if self._tail.strip():
                reader.feed(self._tail)
            obj = reader.result()
        except TraceFormatError as exc:
            obj = exc
        self._tail = b""
        if self._decoded >= FREEZE_MIN_BYTES and not isinstance(obj, TraceFormatError):
            # The trace's million objects live long and hold no cycles: moved out of the
            # collector's reach, the first collection after the pause does not walk them all
            # (a fifth of a second on 50,000 nodes), nor does any later full collection.
            gc.freeze()
        self._resume_gc()
        msg[header.get("key") or "trace"] = obj
        if self.on_progress is not None:
            self.on_progress({**header, "raw": self._decoded}, self._got + 4, self._decoded)
        self.on_line(msg)

    def _pause_gc(self) -> None:
        """No cyclic collection while a columnar frame is read: each would walk the hundreds of
        thousands of objects read so far, again and again (a third of the reading time)."""
        if self._gc is None:
            self._gc = gc.isenabled()
            gc.disable()
            quick_switch(True, f"frame-{id(self)}")  # the read-ahead thread drains the pipe while this one decodes

    def _resume_gc(self) -> None:
        if self._gc is not None:
            quick_switch(False, f"frame-{id(self)}")  # one owner per stream: two workers may send at once
        if self._gc:
            gc.enable()
        self._gc = None

    def close(self) -> None:
        """The stream ended: drop a frame cut off in the middle (and turn the collector back on)."""
        self._resume_gc()
        self._frame, self._dec, self._columns, self._mac = None, None, None, None

    def __del__(self) -> None:
        self._resume_gc()

    @property
    def partial(self) -> bool:
        """A frame was cut off (the connection closed in the middle of one)."""
        return self._frame is not None

    def cut_off(self) -> str:
        """What the stream ended in the middle of, in words ("" when it ended between messages)."""
        return cut_words(self._frame, self._got, self._decoded) if self._frame is not None else ""


_FRAME_WORDS = {"call_trace": "a captured call", "trace": "the trace", "rank_trace": "another rank's trace"}


def cut_words(header: dict, received: int, decoded: int) -> str:
    """A frame the stream ended in: which message, how much of it came (its raw size is the
    sender's estimate)."""
    what = _FRAME_WORDS.get(header.get("of") or "", f"a {header.get('of') or 'message'} message")
    raw = int(header.get("raw") or 0)
    share = f" (about {min(99, 100 * decoded // raw)}%)" if raw > 0 and decoded else ""
    return f"{what} was cut off: {format_bytes(received)} of it had arrived{share}, and it is lost"
