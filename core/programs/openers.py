"""One opener per kind of input and the ordered registry that every caller asks.

The command line, the window, the Open dialog's filters and drag and drop all go through
``opener_for(path)`` (the first opener in ``OPENERS`` that accepts the file) instead of
checking suffixes themselves. Order matters where kinds share a suffix: a ``.py`` that defines
``model`` and ``example_input`` (or ``build()``) is a model file before it is a plain script, and a
checkpoint whose pickle names classes is a whole pickled model before it is weights. A file no
opener accepts runs as a script, as Python would run it. Every ``accepts`` is cheap and needs no
torch: suffixes, a zip's member names, a pickle's opcodes, a script's top-level names.
"""

from __future__ import annotations

import ast
import tokenize
from pathlib import Path

from core.programs import model_files
from core.programs.model_kinds import (CHECKPOINT_SUFFIXES, EXPORT_SUFFIXES, MODEL_SUFFIXES, SAFETENSORS_SUFFIXES,
                                       TORCHSCRIPT_SUFFIXES, ModelFileError, check_model_bytes, is_huggingface_folder,
                                       model_kind, pickled_classes, safetensors_tensor_count)
from core.programs.notebook import NotebookError, notebook_script, skipped_notes
from core.programs.opener import Opener, Program, ProgramError


def read_script(p: str | Path) -> str:
    """The text as Python decodes it: a PEP 263 coding cookie, a BOM, else UTF-8.

    Raises OSError, or ValueError for text Python cannot decode (an unknown or missing coding,
    bytes that are not UTF-8): tokenize's SyntaxError for a bad cookie becomes a ValueError too.
    """
    try:
        with tokenize.open(p) as f:
            return f.read()
    except SyntaxError as exc:
        raise ValueError(exc.msg if exc.msg else str(exc)) from None


class ScriptOpener(Opener):
    """A Python script, run as it is; ``weights`` (a state_dict or safetensors file) load into its model."""

    name, kind, description, patterns, suffixes = "script", "script", "Python scripts", ("*.py",), (".py",)

    def accepts(self, path: Path) -> bool:
        p = Path(path)
        return p.suffix.lower() in self.suffixes and not p.is_dir()  # a folder with config.json: a model

    def open(self, path: Path, options: dict) -> Program:
        p = Path(path)
        try:
            source = read_script(p)
        except (OSError, ValueError) as exc:  # ValueError: a coding Python cannot decode
            raise ProgramError(f"cannot read {p}: {exc}") from None
        program = Program(source)
        weights = options.get("weights")
        if weights:
            if not Path(weights).is_file():
                raise ProgramError(f"--weights {weights}: no such file")
            kind = "safetensors" if Path(weights).suffix.lower() in SAFETENSORS_SUFFIXES else "checkpoint"
            try:
                check_model_bytes(weights, kind)
            except ModelFileError as exc:
                raise ProgramError(f"--weights {weights}: {exc}", exc.reason) from None
            program.after_exec = lambda ns, w=str(weights): model_files.apply_weights(ns, w)
        return program

    def preview(self, path: Path) -> tuple[str, list[dict]]:
        return read_script(Path(path)), []


class ModelFileOpener(ScriptOpener):
    """A script that defines ``model`` and ``example_input`` (or ``build()`` returning both): it runs
    as a script and the capture then steps its model (forward, a sum as the loss, backward)."""

    name = "model file"

    def accepts(self, path: Path) -> bool:
        p = Path(path)
        if not super().accepts(p) or not p.is_file():
            return False
        try:
            tree = ast.parse(read_script(p))
        except (OSError, ValueError, SyntaxError):  # unreadable or not Python (ast): it opens as a script
            return False
        return "build" in _top_level_names(tree) or {"model", "example_input"} <= _top_level_names(tree)


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level: assignments (tuples too), functions and classes."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    names.add(sub.id)
    return names


class NotebookOpener(Opener):
    """A Jupyter notebook: its code cells as one script, with the map back to cell and line."""

    name, kind, description, patterns, suffixes = "notebook", "notebook", "Notebooks", ("*.ipynb",), (".ipynb",)

    def accepts(self, path: Path) -> bool:
        return Path(path).suffix.lower() in self.suffixes

    def open(self, path: Path, options: dict) -> Program:
        try:
            nb = notebook_script(path)
        except NotebookError as exc:
            raise ProgramError(str(exc)) from None
        return Program(nb.source, "notebook", nb.cells, skipped_notes(nb))

    def preview(self, path: Path) -> tuple[str, list[dict]]:
        try:
            nb = notebook_script(path)
        except NotebookError as exc:
            return f"# {exc}\n", []
        return nb.source, nb.cells


class TraceOpener(Opener):
    """A saved trace (``main.py trace --json``, Export > JSON): shown in the window, nothing runs."""

    name, kind, description, patterns, suffixes = "saved trace", "trace", "Traces", ("*.json",), (".json",)
    opens_as_trace = True

    def accepts(self, path: Path) -> bool:
        p = Path(path)
        return p.suffix.lower() in self.suffixes and p.is_file()

    def open(self, path: Path, options: dict) -> Program:
        name = Path(path).name
        raise ProgramError(f"{name} is a saved trace: open it in the window (python main.py {name})")

    def preview(self, path: Path) -> tuple[str, list[dict]]:
        return "", []


class SavedModelOpener(Opener):
    """A saved model: a driver script (shown in the Source panel) that loads it and defines
    ``model`` and ``example_input``; ``what`` says what it is before it runs."""

    description = "Models"
    what = "a PyTorch checkpoint"

    def accepts(self, path: Path) -> bool:
        """Any model suffix will do: the zip's contents say the kind (a .pt can hold a TorchScript archive)."""
        p = Path(path)
        return p.suffix.lower() in MODEL_SUFFIXES and model_kind(p) == self.kind

    def driver(self, p: Path, options: dict) -> str:
        return model_files.driver_source(p, options)

    def open(self, path: Path, options: dict) -> Program:
        try:
            if not Path(path).is_dir():  # a file's first bytes say whether it can be one, before any trust asked
                check_model_bytes(path, self.kind)
            source = self.driver(Path(path), options)
        except ModelFileError as exc:
            raise ProgramError(str(exc), exc.reason) from None
        return Program(source, self.kind, globals=model_files.loaders())

    def preview(self, path: Path) -> tuple[str, list[dict]]:
        return f"# {Path(path).name}: {self.what}; the script that opens it shows once it runs.\n", []


class ExportOpener(SavedModelOpener):
    name, kind, patterns, suffixes = "torch.export program", "export", ("*.pt2",), EXPORT_SUFFIXES
    what = "a torch.export program"

    def driver(self, p: Path, options: dict) -> str:
        return model_files.export_driver(p, options)


class TorchScriptOpener(SavedModelOpener):
    name, kind, patterns, suffixes = "TorchScript archive", "torchscript", ("*.ts",), TORCHSCRIPT_SUFFIXES
    what = "a TorchScript archive"

    def driver(self, p: Path, options: dict) -> str:
        return model_files.torchscript_driver(p, options)


class PickledModelOpener(SavedModelOpener):
    """``torch.save(model)``: runs code from the file when loaded, so it opens only once trusted.
    Told from weights by the classes its pickle names; the worker's ``torch.load`` decides."""

    name, kind, patterns, suffixes = "whole pickled model", "checkpoint", ("*.pt",), CHECKPOINT_SUFFIXES

    def accepts(self, path: Path) -> bool:
        return super().accepts(path) and bool(pickled_classes(path))

    def driver(self, p: Path, options: dict) -> str:
        return model_files.checkpoint_driver(p, options)


class CheckpointOpener(PickledModelOpener):
    """A state_dict: weights for a class defined in a script (``--weights``, or both files dropped)."""

    name, patterns = "checkpoint + class", ("*.pt", "*.pth", "*.bin", "*.ckpt")

    def accepts(self, path: Path) -> bool:
        return SavedModelOpener.accepts(self, path)


class SafetensorsOpener(SavedModelOpener):
    name, kind, patterns, suffixes = "safetensors weights", "safetensors", ("*.safetensors",), SAFETENSORS_SUFFIXES
    what = "a safetensors checkpoint"

    def driver(self, p: Path, options: dict) -> str:
        count = safetensors_tensor_count(p)  # its header read: a file that is not one says so
        try:
            return model_files.weights_driver(p, options)
        except ModelFileError as exc:
            tensors = f"{count:,} tensor{'' if count == 1 else 's'}"
            raise ModelFileError(str(exc).replace(" holds weights only (a state_dict)",
                                                  f" holds weights only ({tensors}, a state_dict)", 1),
                                 exc.reason) from None


class HuggingFaceOpener(SavedModelOpener):
    """A Hugging Face model folder (config.json and its weights), opened offline with transformers."""

    name, kind = "Hugging Face folder", "huggingface"
    what = "a Hugging Face model folder"

    def accepts(self, path: Path) -> bool:
        return is_huggingface_folder(path)

    def driver(self, p: Path, options: dict) -> str:
        return model_files.huggingface_driver(p, options)


SCRIPT = ScriptOpener()
MODEL_FILE = ModelFileOpener()
NOTEBOOK = NotebookOpener()
TRACE = TraceOpener()
EXPORT = ExportOpener()
TORCHSCRIPT = TorchScriptOpener()
PICKLED_MODEL = PickledModelOpener()
CHECKPOINT = CheckpointOpener()
SAFETENSORS = SafetensorsOpener()
HUGGINGFACE = HuggingFaceOpener()

# First match wins; the Open dialog lists the filters in this order too. A folder with config.json
# is a Hugging Face model whatever its name, except one named *.ipynb (a notebook, as it always was).
OPENERS: tuple[Opener, ...] = (MODEL_FILE, SCRIPT, NOTEBOOK, HUGGINGFACE, EXPORT, PICKLED_MODEL, CHECKPOINT,
                               TORCHSCRIPT, SAFETENSORS, TRACE)
WEIGHTS = (CHECKPOINT, SAFETENSORS)  # what a script dropped with the file loads as its weights
OPENABLE_SUFFIXES = tuple(dict.fromkeys(s for o in OPENERS for s in o.suffixes))


def opener_for(path: str | Path) -> Opener:
    """The first opener that accepts ``path``; the script opener when none does."""
    p = Path(path)
    return next((o for o in OPENERS if o.accepts(p)), SCRIPT)


def is_openable(path: str | Path) -> bool:
    """A file the window opens (drag and drop): one of the openers' suffixes, or a model folder."""
    p = Path(path)
    return p.suffix.lower() in OPENABLE_SUFFIXES or HUGGINGFACE.accepts(p)


def is_weights_file(path: str | Path) -> bool:
    """A state_dict or safetensors file by its name, as dropped beside a script."""
    return Path(path).suffix.lower() in {s for o in WEIGHTS for s in o.suffixes}


def open_filter() -> str:
    """The Open dialog's filters: every openable kind, then one entry per description."""
    groups: dict[str, list[str]] = {}
    for o in OPENERS:
        if o.patterns:
            groups.setdefault(o.description, [])
            groups[o.description] += [p for p in o.patterns if p not in groups[o.description]]
    every = [p for patterns in groups.values() for p in patterns]
    entries = [f"PyTorch files ({' '.join(every)})"] + [f"{d} ({' '.join(p)})" for d, p in groups.items()]
    return ";;".join(entries + ["All files (*)"])
