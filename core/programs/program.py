"""What runs for an opened file: a script as is, a notebook's cells, or a driver for a saved model.

``load_program(path, options)`` asks the file's opener (``core.programs.openers``); the capture
compiles the program's ``source`` under the file's own path, so frames, lines and errors point at
the opened file. Options (from the command line or the window): ``weights`` (a state_dict or
safetensors file for a model script), ``trust_pickle``, ``input_shapes``.
No torch at import: the GUI uses ``file_kind`` and ``display_source``.
"""

from __future__ import annotations

from pathlib import Path

from core.programs import openers
from core.programs.model_kinds import ModelFileError
from core.programs.notebook import NotebookError
from core.programs.opener import Program, ProgramError
from core.programs.openers import OPENABLE_SUFFIXES, is_openable, opener_for

__all__ = ["OPENABLE_SUFFIXES", "OPEN_FILTER", "Program", "ProgramError", "display_source", "file_kind",
           "is_openable", "load_program"]

OPEN_FILTER = openers.open_filter()


def file_kind(path: str | Path) -> str:
    """script, notebook, trace (a saved trace JSON) or the model kind of ``path``."""
    return opener_for(path).kind


def load_program(path: str | Path, options: dict | None = None) -> Program:
    """The program to run for ``path``; ProgramError says why it cannot run."""
    p = Path(path)
    try:
        return opener_for(p).open(p, options or {})
    except (NotebookError, ModelFileError) as exc:
        raise ProgramError(str(exc), getattr(exc, "reason", "load")) from None


def display_source(path: str | Path) -> tuple[str, list[dict]]:
    """What the Source panel shows before a run: the text and, for notebooks, the cells."""
    return opener_for(path).preview(Path(path))
