"""The worker client's own events, typed like the worker's messages (``core.protocol.messages``).

They never cross the wire: ``core.client.handle`` makes them (a state change, the script's output,
the worker's exit, a refused hello, a transfer's progress, a run's result, a message that did
not match the protocol) and hands them on with the worker's messages, so every reader gets
dataclasses. ``core.protocol.messages`` re-exports them; import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.protocol.record import _Base

EVENTS: dict[str, type] = {}


def _event(kind: str):
    def wrap(cls):
        cls.KIND = kind
        EVENTS[kind] = cls
        return cls
    return wrap


@_event("state")
@dataclass
class State(_Base):
    """The client's state changed."""
    state: str = ""  # a core.client.handle.ClientState: starting, ready, running or closed


@_event("output")
@dataclass
class Output(_Base):
    """Text the script printed (its stdout and stderr)."""
    text: str = ""


@_event("exit")
@dataclass
class Exit(_Base):
    """The worker process ended."""
    code: int | None = None  # its exit status; negative: the signal that killed it


@_event("refused")
@dataclass
class Refused(_Base):
    """The worker's hello was refused (another protocol version): why, in words."""
    message: str = ""


@_event("spare_failed")
@dataclass
class SpareFailed(_Base):
    """A worker started ahead (behind a launcher) did not come up: why, in words."""
    message: str = ""


@_event("transfer")
@dataclass
class Transfer(_Base):
    """Progress of a compressed message arriving, or of files sent to the worker before a run (drives
    the status bar's progress bar)."""
    of: str | None = None  # the type of the message arriving, or "upload" for a file sent to the worker
    received: int = 0  # compressed bytes received
    decoded: int = 0  # bytes decompressed so far
    raw: int = 0  # bytes once decompressed (an upload: of all its files)
    codec: str | None = None
    name: str | None = None  # an upload: the file being sent (its path in the upload)
    sent: int = 0  # an upload: bytes of all its files sent so far
    file_sent: int = 0  # an upload: bytes of this file sent
    file_size: int = 0  # an upload: this file's size


@_event("finished")
@dataclass
class Finished(_Base):
    """A run ended: ``result`` is a core.client.handle.RunResult (the trace, or only an error)."""
    run: Any = None
    result: Any = None


@_event("bad_message")
@dataclass
class BadMessage(_Base):
    """A worker message that did not match the protocol: ``error`` names its kind and field, ``raw``
    keeps it as received; the run goes on."""
    error: str = ""
    raw: Any = None
