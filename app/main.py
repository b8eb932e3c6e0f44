"""Entry point: one command-line parser (``app.cli.commands.build_parser``) for the window's commands
(``open``, the default, and ``view``) and the headless ones (``trace``, ``step``, ``export``, ``hosts``)."""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

from app.cli import commands as cli
from app.cli.commands import HEADLESS

OPEN = "open"  # the command a bare 'backprop-studio [SCRIPT]' runs


def command_argv(argv: list[str], names: list[str]) -> list[str] | str:
    """``argv`` with its command word first (``open`` where none is given), or the error to print
    when the first word names neither a command nor a file."""
    if not argv:
        return [OPEN]
    first = argv[0]
    if first in ("-h", "--help", "help"):
        return [argv[1], "--help"] if first == "help" and argv[1:2] and argv[1] in names else ["--help"]
    if first == "--help-window":
        return [OPEN, "--help"]
    if first in names:
        return argv
    if first.startswith("-") or _is_path(first):
        return [OPEN, *argv]
    near = difflib.get_close_matches(first, names, n=1)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return (f"backprop-studio: '{first}' is neither a command ({', '.join(names)}) nor a file{hint}\n"
            "Run 'backprop-studio --help' for the commands, 'backprop-studio SCRIPT' to open a script.")


def _is_path(word: str) -> bool:
    """A word meant as a file: one that exists, or is written like a path (a folder or a suffix)."""
    return Path(word).exists() or "/" in word or os.sep in word or bool(Path(word).suffix)


def main(argv: list[str] | None = None) -> int:
    parser = cli.build_parser()
    argv = command_argv(list(sys.argv[1:] if argv is None else argv), cli.commands(parser))
    if isinstance(argv, str):
        sys.stderr.write(argv + "\n")
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.command in HEADLESS:
        try:
            return cli.main(args)
        except BrokenPipeError:
            # The reader went away (`... | head`): stop quietly, as command-line tools do.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    try:
        from app.gui import main as gui_main  # here, not above: the headless commands never load Qt
    except ImportError as exc:
        if not (exc.name or "").startswith(("PySide6", "shiboken6")):
            raise
        sys.stderr.write(f"backprop-studio: cannot load Qt (PySide6): {exc}\n")  # a broken Qt install
        return 2
    return gui_main(args, view=args.command == "view")
