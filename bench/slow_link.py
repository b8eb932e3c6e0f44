"""A pipe that carries at most RATE bytes a second, as a network link does: the benchmarks' slow link.

Run: ``SENDER | python bench/slow_link.py RATE | RECEIVER``. Each piece read (up to 64 KiB)
leaves when the link would have finished sending it: at the later of its arrival and the end
of the piece before, plus its size over RATE. While a piece waits, the sender's writes fill
the pipe's buffer and then block, as they would on a busy link.

``pv -L`` is not used: it keeps the average rate since it started, so the time a sender
spends before its first byte, or between two bursts, becomes credit that then goes through at
full speed (13.5 MB after a second's pause passed ``pv -L 10m`` in 0.23 s instead of 1.28 s),
and a sender that starts slowly is never held back. Standard library only, written by hand
because no package throttles a pipe without that credit.
"""

from __future__ import annotations

import os
import sys
import time

PIECE = 64 * 1024


def main() -> int:
    rate = float(sys.argv[1])
    free_at = 0.0  # when the link has sent everything it was given
    while True:
        data = os.read(0, PIECE)
        if not data:
            return 0
        free_at = max(time.monotonic(), free_at) + len(data) / rate
        delay = free_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]


if __name__ == "__main__":
    sys.exit(main())
