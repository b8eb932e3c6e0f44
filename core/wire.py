"""What both ends of the worker pipe agree on beyond plain JSON lines: the protocol version and
compressed frames for big messages. Standard library only, so a remote worker needs no more
than Python and torch.

A big message (a trace: 50 MB of JSON on 50,000 nodes) travels as one *frame*: a JSON line
``{"type": "frame", "codec": "zlib", "size": N, "raw": M}`` followed by exactly N bytes, the
message's JSON compressed. The reader reports bytes received as they arrive, so the window
can show a progress bar on a slow link. zstd is used where the ``zstandard`` module (or
Python 3.14's ``compression.zstd``) is installed on both sides, zlib otherwise.
"""

from __future__ import annotations

import json
import zlib
from typing import BinaryIO, Callable

PROTOCOL_VERSION = 2  # bumped whenever a message changes meaning; both ends must agree
FRAME_MIN_BYTES = 64 * 1024  # smaller messages are not worth compressing
READ_CHUNK = 256 * 1024
ZLIB_LEVEL = 1  # level 1 compresses 50 MB of trace JSON 5x in 0.3 s; level 6 gains 20 % for 3x the time


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
    return asked if asked in ("zstd", "zlib") else "zlib"


def compress(data: bytes, codec: str) -> bytes:
    if codec == "zstd":
        z = _zstd()
        if z.__name__ == "zstandard":
            return z.ZstdCompressor(level=1).compress(data)
        return z.compress(data, level=1)
    return zlib.compress(data, ZLIB_LEVEL)


def decompress(data: bytes, codec: str) -> bytes:
    if codec == "zstd":
        z = _zstd()
        if z is None:
            raise ProtocolMismatch("the worker sent zstd data but zstd is not installed here")
        if z.__name__ == "zstandard":
            return z.ZstdDecompressor().decompressobj().decompress(data)
        return z.decompress(data)
    if codec == "zlib":
        return zlib.decompress(data)
    if codec in (None, "none"):
        return data
    raise ProtocolMismatch(f"the worker sent a frame in an unknown codec {codec!r}")


def encode_frame(msg: dict, codec: str) -> tuple[dict, bytes]:
    """The header line and payload for ``msg`` compressed with ``codec``."""
    raw = json.dumps(msg, separators=(",", ":")).encode("utf-8")
    payload = compress(raw, codec)
    return {"type": "frame", "codec": codec, "size": len(payload), "raw": len(raw), "of": msg.get("type")}, payload


def read_frame(stream: BinaryIO, header: dict, on_progress: Callable[[int, int], None] | None = None) -> bytes:
    """Read the payload announced by ``header`` from ``stream`` and return the message's JSON text."""
    size = int(header["size"])
    parts = []
    got = 0
    while got < size:
        chunk = stream.read(min(READ_CHUNK, size - got))
        if not chunk:
            raise EOFError(f"the worker's connection closed after {got:,} of {size:,} bytes of a {header.get('of')}")
        parts.append(chunk)
        got += len(chunk)
        if on_progress is not None:
            on_progress(got, size)
    return decompress(b"".join(parts), header.get("codec"))
