"""The window's title names the graph on screen, and the run going while that graph stays.

A run of ``B.py`` started over ``A.py``'s graph is titled "running B.py — showing A.py" until B's
result replaces it; a failed run that built no graph leaves "A.py — the run of B.py failed". A
trace ``show()`` sent is titled by the caller's file and line, a saved trace by its file.
"""

from __future__ import annotations

from pathlib import Path

from app.session.session import SessionState

APP = "Backprop Studio"
VERBS = {SessionState.RUNNING: "running", SessionState.DEBUGGING: "debugging",
         SessionState.STARTING: "stepping", SessionState.PAUSED: "stepping", SessionState.STEPPING: "stepping",
         SessionState.FORWARD: "debugging"}


def compose_title(shown: str | None, opened: str | None = None, verb: str | None = None,
                  failed: str | None = None, shown_is_the_run: bool = False) -> str:
    """The title from what is shown, what runs (``verb`` of ``opened``) and a failed run kept off screen."""
    parts = []
    if verb and opened:
        parts.append(f"{verb} {opened}")
        if shown and not shown_is_the_run and verb != "stepping":
            parts.append("showing the previous run" if shown == opened else f"showing {shown}")
    elif shown:
        parts.append(shown)
        if failed:
            parts.append(f"the run of {failed} failed")
    elif opened:
        parts.append(opened)
    return " — ".join([*parts, APP])


class TitleWiring:
    """Keeps ``windowTitle()`` naming the graph shown (a mixin of ``MainWindow``)."""

    _title_shown: str | None = None  # the name of the graph on screen
    _title_failed: str | None = None  # a failed run that left the previous graph on screen
    _title_live = False  # the graph shown came from the run going now
    _title_state = SessionState.IDLE

    def _connect_title(self) -> None:
        s = self.session
        s.sig_trace.connect(self._title_on_trace)
        s.sig_state.connect(self._title_on_state)
        s.sig_result.connect(self._title_on_result)

    def name_shown(self, name: str) -> None:
        """Title the graph on screen ``name`` (a saved trace's file, ``show()``'s file:line)."""
        self._title_shown = name
        self._update_title()

    def _title_on_trace(self, trace) -> None:
        if trace is None:
            return
        self._title_shown = Path(trace.script).name if trace.script else "untitled"
        self._title_failed = None
        self._title_live = self.session.state in VERBS
        self._update_title()

    def _title_on_state(self, state: SessionState) -> None:
        if state in VERBS and self._title_state not in VERBS:
            self._title_live = False  # a new run: the graph on screen is an earlier one's
            self._title_failed = None
        self._title_state = state
        self._update_title()

    def _title_on_result(self, result) -> None:
        trace = result.trace
        if trace.error is not None and self.session.trace is not trace:  # the previous graph stayed
            self._title_failed = Path(trace.script or self.script_path or "").name or None
        self._update_title()

    def _update_title(self) -> None:
        opened = Path(self.script_path).name if self.script_path else None
        self.setWindowTitle(compose_title(self._title_shown, opened, VERBS.get(self.session.state),
                                          self._title_failed, self._title_live))
