"""What runs for an opened file: a script as is, a notebook's cells, or a driver for a saved model.

``load_program(path, options)`` decides by the kind of file; the capture compiles the
program's ``source`` under the file's own path, so frames, lines and errors point at the
opened file. Options (from the command line or the window): ``weights`` (a state_dict or
safetensors file for a model script), ``trust_pickle``, ``input_shapes``.
No torch at import: the GUI uses ``file_kind`` and ``display_source``.
"""

from __future__ import annotations

import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from core.programs import model_files
from core.programs.notebook import NotebookError, map_traceback, notebook_script, skipped_notes, where

OPENABLE_SUFFIXES = (".py", ".ipynb", ".json") + model_files.MODEL_SUFFIXES
OPEN_FILTER = ("PyTorch files (*.py *.ipynb *.pt2 *.pt *.pth *.bin *.ckpt *.ts *.safetensors *.json);;"
               "Python scripts (*.py);;Notebooks (*.ipynb);;"
               "Models (*.pt2 *.pt *.pth *.bin *.ckpt *.ts *.safetensors);;Traces (*.json);;All files (*)")


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


def file_kind(path: str | Path) -> str:
    """script, notebook, trace (a saved trace JSON) or the model kind of ``path``."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".ipynb":
        return "notebook"
    if suffix == ".json" and p.is_file():
        return "trace"
    if suffix in model_files.MODEL_SUFFIXES or model_files.is_huggingface_folder(p):
        return model_files.model_kind(p)
    return "script"


def is_openable(path: str | Path) -> bool:
    p = Path(path)
    return p.suffix.lower() in OPENABLE_SUFFIXES or model_files.is_huggingface_folder(p)


def load_program(path: str | Path, options: dict | None = None) -> Program:
    """The program to run for ``path``; ProgramError says why it cannot run."""
    options = options or {}
    p = Path(path)
    kind = file_kind(p)
    try:
        if kind == "notebook":
            nb = notebook_script(p)
            return Program(nb.source, "notebook", nb.cells, skipped_notes(nb))
        if kind == "script":
            try:
                source = _read_script(p)
            except (OSError, ValueError) as exc:  # ValueError: SyntaxError / UnicodeDecodeError of the coding
                raise ProgramError(f"cannot read {p}: {exc}") from None
            program = Program(source)
            weights = options.get("weights")
            if weights:
                if not Path(weights).is_file():
                    raise ProgramError(f"--weights {weights}: no such file")
                program.after_exec = lambda ns, w=str(weights): model_files.apply_weights(ns, w)
            return program
        if kind == "trace":
            raise ProgramError(f"{p.name} is a saved trace: open it in the window (python main.py {p.name})")
        return Program(model_files.driver_source(p, options), kind, globals=model_files.loaders())
    except (NotebookError, model_files.ModelFileError) as exc:
        raise ProgramError(str(exc), getattr(exc, "reason", "load")) from None


def _read_script(p: Path) -> str:
    """The text as Python decodes it: a PEP 263 coding cookie, a BOM, else UTF-8."""
    with tokenize.open(p) as f:
        return f.read()


def display_source(path: str | Path) -> tuple[str, list[dict]]:
    """What the Source panel shows before a run: the text and, for notebooks, the cells."""
    p = Path(path)
    kind = file_kind(p)
    if kind == "notebook":
        try:
            nb = notebook_script(p)
        except NotebookError as exc:
            return f"# {exc}\n", []
        return nb.source, nb.cells
    if kind == "script":
        return _read_script(p), []
    if kind == "trace":
        return "", []
    what = {"export": "a torch.export program", "torchscript": "a TorchScript archive",
            "huggingface": "a Hugging Face model folder", "safetensors": "a safetensors checkpoint"}
    return f"# {p.name}: {what.get(kind, 'a PyTorch checkpoint')}; the script that opens it shows once it runs.\n", []
