"""Pausing forward drawn: the live graph growing line by line, the paused line and its frames.

A debug run (F9) pauses in forward before a breakpoint's line (and, with Run > Pause on Autograd
Errors, before an in-place op that would break backward; with Run to First NaN/Inf, at the
first non-finite value). The session reads the pause (``app.session.forward_pause``) and makes
the live graph its call; this controller shows the rest: the nodes made since the last pause
glow (``widgets.graph.new_nodes``), the Source panel marks the paused line (opening the file
of the frame when it is not the script), the Tensors panel lists the live variables, and a strip
beside the graph's tab says where the run is ("<module> line 31 › model (MLP).forward line 18")
and what grew. While paused in forward, Step (F10) is Step Over, F11 Step Into, Ctrl+F11 Step Out;
when the run reaches backward, ``app.session.stepping`` takes over as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QToolBar

from app.session.forward_pause import ForwardPause
from app.session.session import SessionState
from app.window.actions import make_action
from core.model.trace import ErrorInfo
from widgets.graph.new_nodes import NewNodeMarks, new_colour
from widgets.panels.pause_strip import PauseStrip

STEP_OVER_TIP = "Paused in forward: run this line, stepping over the calls it makes"
STEP_TIP = "Run backward one node at a time: the next node"


class ForwardDebugController(QObject):
    sig_changed = Signal()
    """What is shown of a pause in forward changed (a pause shown, or cleared)."""

    def __init__(self, session, views, status: Callable[[str], None], parent=None):
        """``views``: an object with the window's ``graph``, ``source``, ``tensors``, ``left_tabs``,
        ``step_log``, ``problems`` and ``center``; ``status`` shows a sentence in the status bar."""
        super().__init__(parent)
        self.session = session
        self.views = views
        self._status_bar = status
        self.marks = NewNodeMarks(views.graph)
        self.strip = PauseStrip(views.center)
        self.strip.hide()
        views.center.setCornerWidget(self.strip, Qt.Corner.TopRightCorner)
        self.pause: ForwardPause | None = None
        self._script_source: tuple | None = None  # the script's (text, path, cells) while another file is shown
        session.sig_forward_paused.connect(self.show_pause)
        session.sig_step_begin.connect(lambda _call: self.clear())
        session.sig_state.connect(self._on_state)

    # -- showing a pause -------------------------------------------------------------------------
    def show_pause(self, pause: ForwardPause) -> None:
        self.pause = pause
        v = self.views
        self.marks.set_nodes(pause.new, tip=f"Made since the last pause ({pause.new_text()})")
        self._show_source(pause)
        v.tensors.set_tensors(pause.variables)
        v.left_tabs.setCurrentWidget(v.tensors)
        self.strip.set_text(f"{pause.headline()}: {pause.breadcrumb()}", pause.new_text(),
                            new_colour(v.graph.theme()))
        self.strip.show()
        if pause.warning():
            title = f"{pause.headline()} (line {pause.line})"
            kind = "NaN/Inf" if pause.event.reason == "nan" else "In-place op"
            v.problems.show_error(ErrorInfo(type=kind, message=pause.warning(), line=pause.line, kind="debug"),
                                  title=title)
        text = pause.status()
        v.step_log.set_status(text)
        self._status_bar(text)
        self.sig_changed.emit()

    def _show_source(self, pause: ForwardPause) -> None:
        """The paused line's arrow, in the paused frame's file (the script, or a file of its own)."""
        source, script = self.views.source, self.session.script_path
        other = pause.file and script and Path(pause.file).resolve() != Path(script).resolve()
        if other and Path(pause.file).is_file():
            if self._script_source is None:
                self._script_source = source.shown_source()
            try:
                source.show_other_file(Path(pause.file).read_text(encoding="utf-8"), pause.file)
            except (OSError, UnicodeDecodeError):
                pass
        else:
            self._back_to_script()
        source.set_paused_line(pause.line)

    def _back_to_script(self) -> None:
        if self._script_source is not None:
            text, path, cells, breakpoints = self._script_source
            self._script_source = None
            self.views.source.set_source(text, path, cells)
            self.views.source.set_breakpoints(breakpoints)

    def clear(self) -> None:
        """The run left forward (backward began, or it ended): no pause is shown."""
        if self.pause is None:
            return
        self.pause = None
        self.marks.clear()
        self.strip.hide()
        self._back_to_script()
        self.sig_changed.emit()

    def _on_state(self, state: SessionState) -> None:
        if state is SessionState.IDLE:
            self.clear()


def _toolbar_buttons(window, actions: list) -> list[QAction]:
    """Toolbar twins of ``actions`` after Step, shown only while paused in forward (the toolbar keeps
    its width on a laptop otherwise); the menu's actions keep their keys and stay listed."""
    bar = window.findChild(QToolBar, "toolbar_main")
    if bar is None or window.act_step not in bar.actions():
        return []
    after = bar.actions()[bar.actions().index(window.act_step) + 1]
    twins = []
    for action in actions:
        twin = QAction(action.icon(), action.text().replace("&", ""), bar)
        twin.setToolTip(action.toolTip())
        twin.setStatusTip(action.statusTip())
        twin.setObjectName(f"toolbar_{action.text().replace('&', '').replace(' ', '_').lower()}")
        twin.triggered.connect(action.trigger)
        twin.setVisible(False)
        bar.insertAction(after, twin)
        twins.append(twin)
    return twins


def install(window) -> ForwardDebugController:
    """Step Into / Step Out, Pause on Autograd Errors and Run to First NaN/Inf in the Run menu; Step
    reads "Step Over" while a debug run is paused in forward."""
    s = window.session
    window.act_step_into = make_action(window, "Step &Into", lambda: s.forward_step("into"), "F11",
                                       "Paused in forward: go into the script's own function this line calls",
                                       "step_into")
    window.act_step_out = make_action(window, "Step O&ut", lambda: s.forward_step("out"), "Ctrl+F11",
                                      "Paused in forward: run until this function returns, and pause in its caller",
                                      "step_out")
    bar_buttons = _toolbar_buttons(window, [window.act_step_into, window.act_step_out])
    window.act_pause_errors = make_action(window, "Pause on &Autograd Errors", s.set_pause_on_errors, None,
                                      "Debug runs pause in forward before an in-place op that would break "
                                      "backward (on a leaf that requires grad, or on a tensor saved for backward)",
                                      checkable=True)
    window.act_to_nan = make_action(window, "Run to First NaN/&Inf", window.debug_to_nan, None,
                                "Debug with the NaN/Inf check on, pausing where the first NaN or infinity appears")
    run_menu = next((a.menu() for a in window.menuBar().actions() if a.text() == "&Run"), None)
    if run_menu is not None:
        run_menu.insertActions(window.act_step_to, [window.act_step_into, window.act_step_out])
        after_debug = run_menu.actions()[run_menu.actions().index(window.act_debug) + 1]
        run_menu.insertActions(after_debug, [window.act_pause_errors, window.act_to_nan])
    controller = ForwardDebugController(s, window, window.state_label_text, window)

    def relabel(*_args) -> None:
        # After the window's own update (connected later, so it runs last): F10 says what it does.
        forward = s.state is SessionState.FORWARD
        window.act_step.setText("Step &Over" if forward else "&Step")
        if forward:
            window.act_step.setIconText("Step Over")
        elif window.act_step.iconText() == "Step Over":  # backward stepping writes its own ("Step (1 queued)")
            window.act_step.setIconText("Step")
        window.act_step.setToolTip(f"{STEP_OVER_TIP if forward else STEP_TIP} (F10)")
        for action in (window.act_step_into, window.act_step_out):
            action.setEnabled(forward)
        for button in bar_buttons:  # on the toolbar only while they do something
            button.setVisible(forward)

    s.sig_state.connect(relabel)
    window.handle.sig_state.connect(relabel)
    window.stepper.sig_changed.connect(relabel)
    relabel()
    window.forward_debug = controller
    return controller

