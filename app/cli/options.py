"""The options every command that runs a program shares: ``trace``, ``step`` and ``export``
(and the window) open a script, notebook or saved model the same way."""

from __future__ import annotations

import argparse
from pathlib import Path

MODE_HELP = ("how to run the file: auto (default) picks from its content; script runs it top to bottom; "
             "model runs a model file's forward (one defining `model` and `example_input`, or build()) "
             "and its backward")


def add_load_options(p: argparse.ArgumentParser) -> None:
    """How to open notebooks and saved models (see README, "Notebooks and saved models")."""
    p.add_argument("--weights", metavar="FILE", help="a state_dict or .safetensors file to load into the model "
                   "the script defines")
    p.add_argument("--input-shape", action="append", metavar="SHAPE",
                   help="input shape for a TorchScript archive or pickled model, e.g. 2,4 or 2x8:int64; "
                   "repeat once per input")
    p.add_argument("--trust-pickle", action="store_true",
                   help="allow a whole pickled model (torch.save(model)); loading it runs code from the file")


def add_run_options(p: argparse.ArgumentParser, timeout_help: str = "time limit in seconds (default 600)") -> None:
    """--device, --mode, --timeout and the load options, as ``trace``, ``step`` and ``export`` take them."""
    p.add_argument("--device", default="cpu", help="cpu, cuda:N or mps (default cpu)")
    p.add_argument("--mode", choices=("auto", "script", "model"), default="auto", help=MODE_HELP)
    p.add_argument("--timeout", type=float, default=600.0, help=timeout_help)
    add_load_options(p)


def load_options(args) -> dict:
    """The load options parsed, as the worker takes them (weights, input_shapes, trust_pickle)."""
    return {"weights": str(Path(args.weights).resolve()) if getattr(args, "weights", None) else None,
            "input_shapes": ";".join(getattr(args, "input_shape", None) or []),
            "trust_pickle": bool(getattr(args, "trust_pickle", False))}
