"""The window's options, for ``backprop-studio [open] SCRIPT`` and ``backprop-studio view TRACE.json``.

Plain argparse, no Qt: the one command-line parser (``app.cli.commands.build_parser``) holds them
as its ``open`` and ``view`` commands, and the window parses its own arguments with the same ones.
"""

from __future__ import annotations

import argparse

from app.cli.options import add_load_options

OPEN_HELP = "open SCRIPT in the window and run it (the default command)"
VIEW_HELP = "open a saved trace (TRACE.json) in the window, running nothing"
PANELS = ("source", "output", "problems", "steps", "memory", "calls", "tensors", "gradients", "curves",
          "storage")


def add_window_options(parser: argparse.ArgumentParser, view: bool = False) -> argparse.ArgumentParser:
    """The window's arguments on ``parser``; ``view``: a saved trace is required and nothing runs
    (no device, time limit nor model options)."""
    if view:
        parser.add_argument("script", metavar="TRACE.json", help="a saved trace, written by "
                            "'backprop-studio trace SCRIPT --json OUT' or the window's Export > JSON")
        parser.set_defaults(device=None, timeout=600.0)
        parser.add_argument("--screenshot", metavar="OUT.png",
                            help="save a picture of the whole window once the trace is shown, then exit")
    else:
        parser.add_argument("script", nargs="?", metavar="SCRIPT",
                            help="a PyTorch script, notebook, saved model, Hugging Face model folder, or a "
                            "saved trace (.json) to open without running anything (default: a bundled example)")
        parser.add_argument("--device", default=None, help="cpu, cuda:N or mps")
        parser.add_argument("--screenshot", metavar="OUT.png",
                            help="run the script, save a picture of the whole window once the graph is shown, exit")
        parser.add_argument("--timeout", type=float, default=600.0,
                            help="time limit of a run in seconds (default 600)")
        parser.add_argument("--nan-check", action="store_true",
                            help="check each op's output and each gradient for NaN/Inf, and mark the first "
                            "of each on the graph and in Problems (Run > Check for NaN/Inf)")
    parser.add_argument("--select", metavar="NAME", help="select this variable, parameter or op once shown")
    parser.add_argument("--show", metavar="PANEL", choices=PANELS,
                        help=f"bring a panel to the front before the screenshot: {', '.join(PANELS)}")
    parser.add_argument("--region", choices=("window", "graph"), default="window",
                        help="what --screenshot saves: the whole window or the graph view alone, "
                        "each as it opens")
    parser.add_argument("--size", default=None, help="window size, WIDTHxHEIGHT (default: fit the screen; "
                        "1400x860 for --screenshot)")
    parser.add_argument("--title", metavar="TEXT", help="name the graph opened TEXT in the window's title "
                        "(show() gives its caller's file:line and call)")
    if not view:
        add_load_options(parser)
    return parser


def add_window_commands(sub) -> None:
    """The ``open`` and ``view`` commands on the one parser's subcommands."""
    add_window_options(sub.add_parser("open", help=OPEN_HELP, description=OPEN_HELP[0].upper() + OPEN_HELP[1:]
                                      + ". 'backprop-studio SCRIPT' is 'backprop-studio open SCRIPT'; without "
                                      "SCRIPT the window opens on a bundled example."))
    add_window_options(sub.add_parser("view", help=VIEW_HELP, description=VIEW_HELP[0].upper() + VIEW_HELP[1:]
                                      + ": its graphs, tensors, memory and errors as they were recorded."),
                       view=True)

