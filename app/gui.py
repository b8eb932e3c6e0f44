"""Start the desktop app: ``python main.py [SCRIPT | TRACE.json] [--screenshot OUT.png]``.

A ``.json`` file is opened as a saved trace (nothing runs). Without a display (no
``DISPLAY`` or ``WAYLAND_DISPLAY`` on Linux), ``--screenshot`` renders offscreen and the
window says what to do instead of Qt's platform-plugin abort. This module loads Qt;
``app.main`` imports it only for the window, and says so when Qt cannot be loaded.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import traceback
from pathlib import Path

from PySide6.QtCore import QSize, QTimer
from PySide6.QtWidgets import QApplication

from app.cli.options import load_options
from app.cli.commands import window_parser as build_parser
from app.session.open_trace import is_trace_path, open_trace
from app.session.show_server import ShowServer
from app.window.resources import DEFAULT_EXAMPLE, icon
from app.window.screen_fit import proportion_docks
from app.window.window import MainWindow
from core.client.run_errors import script_problem
from core.model.trace import ErrorInfo
from core.programs.model_kinds import is_huggingface_folder

log = logging.getLogger(__name__)


def _parse(argv: list[str], view: bool = False) -> argparse.Namespace:
    return build_parser(view).parse_args(argv)


def _install_excepthooks(window_ref: list) -> None:
    """One place shows unexpected errors: the Problems panel (or stderr before the window exists)."""

    def show(exc_type, exc, tb) -> None:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        log.error("unexpected error: %s", text)
        window = window_ref[0] if window_ref else None
        if window is not None:
            window.problems.show_error(ErrorInfo(type=exc_type.__name__, message=str(exc), traceback=text,
                                                 kind="internal"), title="Backprop Studio hit an error")
        else:
            sys.stderr.write(text)

    sys.excepthook = show
    threading.excepthook = lambda args: show(args.exc_type, args.exc_value, args.exc_traceback)


def _no_display() -> bool:
    """Linux without X11 or Wayland and no platform chosen: Qt would abort with a misleading hint."""
    return (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
            and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"))


def main(argv: list[str] | argparse.Namespace, view: bool = False) -> int:
    args = argv if isinstance(argv, argparse.Namespace) else _parse(argv, view)  # parsed by app.main
    if _no_display():
        if args.screenshot:
            os.environ["QT_QPA_PLATFORM"] = "offscreen"  # a picture needs no screen
        else:
            sys.stderr.write("backprop-studio: no display found (DISPLAY and WAYLAND_DISPLAY are not set). "
                             "Start it from a desktop session, run it under `xvfb-run`, or use the headless "
                             "commands: trace, step, export, or --screenshot OUT.png\n")
            return 2
    script = args.script
    if script:
        problem = None if is_huggingface_folder(script) else script_problem(script)
        if problem:
            sys.stderr.write(f"backprop-studio: {problem}\n")
            return 2
        if view and not is_trace_path(script):
            sys.stderr.write(f"backprop-studio view: {script} is not a saved trace (.json); to run it, "
                             f"open it without 'view': backprop-studio {script}\n")
            return 2
    script = script or str(DEFAULT_EXAMPLE)
    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("Backprop Studio")
    app.setOrganizationName("Backprop Studio")
    app.setWindowIcon(icon("app"))
    window_ref: list = []
    _install_excepthooks(window_ref)
    window = MainWindow(timeout=args.timeout)
    window.act_nan_check.setChecked(bool(getattr(args, "nan_check", False)))
    window_ref.append(window)
    window.interactive = not args.screenshot  # a screenshot shows a refusal instead of waiting on a dialog
    if not args.screenshot:
        # show(tensor) from a notebook or script opens its graph in this window.
        window.show_server = ShowServer(window)
        window.show_server.sig_show.connect(window.open_sent_trace)
    try:  # without --size the window fits the screen; screenshots keep one size for the docs
        size = args.size or ("1400x860" if args.screenshot else "")
        if size:
            width, height = (int(v) for v in size.lower().split("x"))
            window.resize(width, height)
            proportion_docks(window, QSize(width, height))  # the docks follow the size asked for
    except ValueError:
        pass
    if args.device:
        window.device_box.addItem(args.device, args.device)
        window.device_box.setCurrentIndex(window.device_box.findData(args.device))
    status = {"code": 0}
    if args.screenshot:
        out = Path(args.screenshot)

        def shoot() -> None:
            if status.get("shot"):
                return
            status["shot"] = True
            # Let the last paint land before grabbing.
            QTimer.singleShot(300, grab)

        def grab() -> None:
            if args.show == "storage":
                window.center.setCurrentWidget(window.storage)
            elif args.show in ("calls", "tensors", "gradients", "curves"):
                tabs = {"calls": window.calls, "tensors": window.tensors, "gradients": window.grad_health,
                        "curves": window.curves}
                window.left_tabs.setCurrentWidget(tabs[args.show])
            elif args.show:
                window.docks[args.show].raise_()
            if args.select and not window.select_named(args.select):
                sys.stderr.write(f"backprop-studio: nothing named {args.select!r} to select\n")
            app.processEvents()
            pixmap = window.graph.grab() if args.region == "graph" else window.grab()
            out.parent.mkdir(parents=True, exist_ok=True)
            if not pixmap.save(str(out)):
                sys.stderr.write(f"backprop-studio: cannot write {out}\n")
                status["code"] = 2
            elif window.last_error is not None:
                e = window.last_error
                where = f" at {e.where}" if e.where else (f" at line {e.line}" if e.line else "")
                sys.stderr.write(f"backprop-studio: the script failed{where}: {e.type}: {e.message}\n")
                status["code"] = 1
            else:
                print(f"screenshot written to {out}")
            window.close()
            app.quit()

        def give_up() -> None:
            sys.stderr.write("backprop-studio: no result in time for the screenshot\n")
            status["code"] = 3
            window.close()
            app.quit()

        window.sig_trace_shown.connect(shoot)
        QTimer.singleShot(int((args.timeout + 60) * 1000), give_up)
    window.show()
    opened = open_trace(window, script) if is_trace_path(script) else \
        window.open_script(script, load=load_options(args))
    if opened and args.title:
        window.name_shown(args.title)
    if not opened and args.screenshot:
        sys.stderr.write(f"backprop-studio: {window.state_label.text()}\n")
        window.close()  # ends the worker started for the window
        return 2
    code = app.exec()
    return status["code"] if args.screenshot else code
