"""Entry point: headless commands (trace, ...) or the desktop window (``view TRACE.json`` opens a saved trace)."""

from __future__ import annotations

import os
import sys

from app.cli import commands as cli

HEADLESS = ("trace", "step", "export", "hosts")
USAGE = """usage: backprop-studio [SCRIPT] [--device DEV] [--screenshot OUT.png] ...
       backprop-studio COMMAND ...

Backprop Studio makes PyTorch autograd visible: the graph each backward call walks,
stepping it node by node, tensors and their storage, and memory over the run.

commands:
  (none)    open the window on SCRIPT (or a bundled example); --help-window lists its options
  view      open a saved trace (TRACE.json) in the window, with the window's options
  trace     run a script in a worker and summarise every autograd graph it builds
  step      step through one backward call node by node and print every step
  export    export a graph (PNG, SVG, PDF, DOT, JSON, frames, GIF) or, with --memory, the memory chart
  hosts     list, add, remove or check the hosts workers can run on

Run "backprop-studio COMMAND --help" for a command's options.
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"], ["help"]):
        print(USAGE, end="")
        return 0
    if argv[:1] == ["--help-window"]:
        argv = ["--help"]
    if argv and argv[0] in HEADLESS:
        try:
            return cli.main(argv)
        except BrokenPipeError:
            # The reader went away (`... | head`): stop quietly, as command-line tools do.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    view = bool(argv) and argv[0] == "view"
    if view:  # main.py view TRACE.json [--screenshot OUT.png]: open a saved trace
        argv = argv[1:]
    try:
        from app.gui import main as gui_main  # here, not above: the headless commands never load Qt
    except ImportError as exc:
        if not (exc.name or "").startswith(("PySide6", "shiboken6")):
            raise
        sys.stderr.write(f"backprop-studio: cannot load Qt (PySide6): {exc}\n")  # a broken Qt install
        return 2
    return gui_main(argv, view=view)
