"""Entry point: headless commands (trace, ...) or the desktop window (``view TRACE.json`` opens a saved trace)."""

from __future__ import annotations

import sys

HEADLESS = ("trace", "step", "export")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in HEADLESS:
        from app import cli

        try:
            return cli.main(argv)
        except BrokenPipeError:
            # The reader went away (`... | head`): stop quietly, as command-line tools do.
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    if argv and argv[0] == "view":  # main.py view TRACE.json [--screenshot OUT.png]: open a saved trace
        argv = argv[1:]
    from app.gui import main as gui_main

    return gui_main(argv)
