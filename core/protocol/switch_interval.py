"""A short GIL switch interval while a user steps backward node by node, and while a big
message travels in a compressed frame.

CPython hands the GIL from a busy thread to a waiting one only every ``sys.getswitchinterval()``
(5 ms by default). A Step crosses four threads (the app's GUI and pipe-reader threads, the
worker's command and script threads); whenever another thread of the same process is busy at
that moment (the GUI drawing the last frame, the worker's memory sampler), the hop waits for
the interval. While a debug session is paused or stepping, both processes use a 0.5 ms
interval instead, so such a hop costs at most half a millisecond; the default comes back when
stepping ends (a plain run pays no extra switches). A frame (core.protocol.wire) crosses two threads
on each side, one encoding or decoding columns, the other compressing and writing, or reading,
the next chunk: with the default interval each chunk's writer waited up to 5 ms for the GIL and
the link idled; the worker and the app use the short interval while a frame is sent or read.
Standard library only.
"""

from __future__ import annotations

import os
import sys
import threading

# BACKPROP_STUDIO_SWITCH_S sets another interval (seconds; the worker inherits it): for measuring.
STEP_SWITCH_S = float(os.environ.get("BACKPROP_STUDIO_SWITCH_S") or 0.0005)

_lock = threading.Lock()
_saved: float | None = None  # the interval before stepping began (None: not stepping)
_owners: set[str] = set()


def quick_switch(on: bool, owner: str = "stepping") -> None:
    """Use the short interval while any ``owner`` asks for it (``on``); the interval in force
    before comes back when the last one lets go. Idempotent per owner."""
    global _saved
    with _lock:
        if on:
            if not _owners:
                _saved = sys.getswitchinterval()
                sys.setswitchinterval(min(_saved, STEP_SWITCH_S))
            _owners.add(owner)
        elif owner in _owners:
            _owners.discard(owner)
            if not _owners and _saved is not None:
                sys.setswitchinterval(_saved)
                _saved = None


def stepping_switch() -> bool:
    """Whether the short interval is in force."""
    return bool(_owners)
