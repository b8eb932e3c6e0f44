"""The one interface every kind of opened file implements, and the Program it produces.

One ``Opener`` per kind of input (a script, a notebook, a torch.export program, a checkpoint, a
saved trace…), as Netron has one factory per format: ``accepts(path)`` says cheaply, without
torch, whether the file is of its kind (the GUI asks it for the Open dialog, drag and drop and
the command line); ``open(path, options)`` makes the ``Program`` the worker runs, or says why it
cannot run (``ProgramError``); ``preview(path)`` is what the Source panel shows before a run.
``core.programs.openers`` holds the implementations and the one ordered registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from core.programs.notebook import map_traceback, where


class ProgramError(ValueError):
    """The file cannot be run as asked; ``reason`` as in ``ModelFileError``."""

    def __init__(self, message: str, reason: str = "load"):
        super().__init__(message)
        self.reason = reason


@dataclass
class Program:
    source: str  # compiled under the file's path and shown in the Source panel
    kind: str = "script"  # script, notebook, export, torchscript, checkpoint, huggingface
    cells: list[dict] = field(default_factory=list)  # notebooks: see core.programs.notebook.NotebookScript
    notes: list[str] = field(default_factory=list)  # printed before the run (skipped notebook lines)
    after_exec: Callable[[dict], None] | None = None  # runs on the namespace before the model step
    globals: dict = field(default_factory=dict)  # bound in the namespace before the source runs

    def where(self, line: int | None) -> str:
        return where(self.cells, line)

    def map_traceback(self, text: str, filename: str) -> str:
        return map_traceback(text, filename, self.cells)


class Opener(ABC):
    """How one kind of file opens. ``name`` names the kind to a person; ``kind`` is the
    ``Program.kind`` (and ``file_kind``) it gives; ``description`` and ``patterns`` make its
    entry in the Open dialog's filters (openers with one description share an entry);
    ``suffixes`` are the names it claims; ``opens_as_trace``: shown in the app, nothing runs."""

    name: str = ""
    kind: str = ""
    description: str = ""
    patterns: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ()
    opens_as_trace: bool = False

    @abstractmethod
    def accepts(self, path: Path) -> bool:
        """Whether ``path`` is of this kind: cheap, no torch (the GUI asks it)."""

    @abstractmethod
    def open(self, path: Path, options: dict) -> Program:
        """What the worker runs for ``path``; ProgramError (or the kind's own error) says why not."""

    @abstractmethod
    def preview(self, path: Path) -> tuple[str, list[dict]]:
        """The Source panel's text (and a notebook's cells) before a run."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
