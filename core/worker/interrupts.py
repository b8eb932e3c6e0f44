"""Stop's KeyboardInterrupt reaches the script, not the worker's own code on the script's thread.

The worker stops a script the way Ctrl-C does: ``_thread.interrupt_main()`` from its command
thread, which raises KeyboardInterrupt wherever the main thread happens to be. That thread also
runs the worker's own code while the script runs (a captured call streamed from the capture's
hook, a stepped node's message) and after it (the trace built and sent). An interrupt landing
in the middle of a message cut the stream there: the app read the rest of the frame from
whatever came next and waited for bytes that never came.

``Interrupts`` is the worker's SIGINT handler (``interrupt_main`` calls the Python handler of
SIGINT, on the main thread, between two bytecodes): inside ``held()`` it notes the interrupt
and raises it when the section ends, so a message always leaves whole and the script still
stops right after; once the script's code has ended (``active`` false) there is nothing left
to stop, and the interrupt is dropped rather than losing the trace being built. A run gets
one KeyboardInterrupt: a second Stop (a double click) would otherwise land in the handlers
still dealing with the first, and lose what they were saving; a script that swallows the
first is ended by the app after its grace, as before. The standard library has no such gate:
``signal.pthread_sigmask`` blocks real signals, not the simulated one ``interrupt_main`` trips.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class Interrupts:
    def __init__(self):
        self.active = False  # the script's code may be running: an interrupt stops it
        self.depth = 0  # held() sections the main thread is in
        self.pending = False  # an interrupt came inside one
        self.fired = False  # this run's KeyboardInterrupt has been raised

    def start(self) -> None:
        """A run begins (on the main thread): this is SIGINT's handler again, since the last
        script may have put its own in place, and the next interrupt stops the run."""
        self.install()
        self.active, self.pending, self.fired = True, False, False

    def install(self) -> None:
        """Make this the SIGINT handler (from the main thread)."""
        signal.signal(signal.SIGINT, self._on_interrupt)

    def _on_interrupt(self, signum, frame) -> None:
        if not self.active or self.fired:
            return  # the script is over (its trace is on its way), or already being stopped
        if self.depth:
            self.pending = True
            return
        self._raise()

    def _raise(self) -> None:
        self.fired = True
        raise KeyboardInterrupt

    @contextmanager
    def held(self):
        """On the main thread, an interrupt that comes inside waits until the section ends;
        other threads are never interrupted, so for them this does nothing."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending:  # noted only while active and not yet fired
                self.pending = False
                self._raise()

    def script_ended(self) -> None:
        """The script's code has ended: a Stop from now on has nothing to stop."""
        self.active = False
        self.pending = False


INTERRUPTS = Interrupts()  # the process has one SIGINT handler
