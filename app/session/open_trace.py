"""Open a saved trace (``main.py trace --json`` or Export > JSON) without running anything.

File > Open Trace… (Ctrl+Shift+O), ``main.py view TRACE.json``, a ``.json`` given as SCRIPT
and a ``.json`` dropped on the window all end in ``open_trace``: a teacher shares a trace
file, students open it and explore the graphs, tensors, memory and errors it recorded. A DDP
run's rank opens with the other ranks saved beside it (``core.model.rank_files``) in the rank picker.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from app.window.actions import make_action
from core.client.run_errors import script_problem
from core.model.trace import TraceFormatError
from core.model.trace_json import load_notes, load_trace
from core.programs.openers import TRACE

log = logging.getLogger(__name__)

TRACE_SUFFIXES = TRACE.suffixes


def is_trace_path(path: str) -> bool:
    """A file opened as a saved trace rather than run as a script."""
    return Path(path).suffix.lower() in TRACE_SUFFIXES


def open_trace(window, path: str) -> bool:
    """Show the trace saved in ``path`` in ``window``; a bad file is reported in Problems, naming the field."""
    problem = script_problem(path)
    if problem:
        window._show_problem(problem)
        return False
    try:
        trace = load_trace(path)
    except TraceFormatError as exc:
        window._show_problem(str(exc))
        return False
    if getattr(window.handle, "running", False):
        window.handle.cancel()
    name = Path(path).name
    window.output.clear()
    window.memory.chart.clear()
    window.source.set_source(trace.source, trace.script or str(path))
    if trace.output:
        window.output.append(trace.output)
    window.last_error = trace.error
    window.show_trace(trace)
    window.name_shown(name)  # titled by the file opened
    where = f" of {Path(trace.script).name}" if trace.script else ""
    version = f", torch {trace.torch_version}" if trace.torch_version else ""
    notes = "".join(f"; {note}" for note in load_notes(trace))  # e.g. a long memory record thinned
    window.state_label.setText(f"Opened the saved trace {name}{where} (recorded on {trace.device}{version}){notes}")
    ranks = getattr(window, "ranks", None)
    if ranks is not None:  # a DDP run's rank: its other ranks' files come back in the picker
        ranks.opened(path, trace)
    log.info("opened trace %s", path)
    return True


def open_trace_dialog(window) -> None:
    start = str(Path(window.script_path).parent) if window.script_path else str(Path.home())
    path, _ = QFileDialog.getOpenFileName(window, "Open a saved trace", start, "Backprop Studio traces (*.json)")
    if path:
        open_trace(window, path)


def add_open_trace_action(window) -> None:
    """Create ``window.act_open_trace`` (File > Open Trace…, Ctrl+Shift+O)."""
    act = make_action(window, "Open &Trace…", lambda: open_trace_dialog(window), "Ctrl+Shift+O",
                      "Open a saved trace (.json) without running anything", "open")
    window.act_open_trace = act
    menu = window.menuBar().actions()[0].menu() if window.menuBar().actions() else None
    if menu is not None:
        actions = menu.actions()
        open_action = getattr(window, "act_open", None)
        if open_action in actions and actions.index(open_action) + 1 < len(actions):
            menu.insertAction(actions[actions.index(open_action) + 1], act)
        else:
            menu.addAction(act)
