"""Opening notebooks, saved models and saved traces in the window (no torch here).

The worker decides what runs for a file (``core.programs.program``); when a model cannot be opened
as asked, its error carries a ``reason`` and the window offers the fix: trusting a pickled
model after a warning, or typing the input shapes a TorchScript archive does not record.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QInputDialog, QLineEdit, QMessageBox, QWidget

from core.programs import model_kinds
from core.programs.openers import SCRIPT, is_weights_file
from core.programs.program import OPEN_FILTER, display_source, file_kind, is_openable
from core.model.trace import ErrorInfo

__all__ = ["OPEN_FILTER", "display_source", "file_kind", "is_openable", "ask_fix", "split_dropped"]


def ask_fix(parent: QWidget, error: ErrorInfo, options: dict, path: str | None = None) -> dict | None:
    """New load options that fix ``error`` once the user agreed, or None (leave it shown).
    For weights opened alone, ``script`` in the result names the model's script to open."""
    if error.reason == "unsafe_pickle":
        answer = QMessageBox.warning(
            parent, "Open a pickled model?",
            f"{error.message}\n\nRun it anyway?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
        if answer != QMessageBox.StandardButton.Yes:
            return None
        options = {**options, "trust_pickle": True}
        if not options.get("input_shapes"):
            return ask_shapes(parent, options, "This model's input shapes are not recorded in the file.")
        return options
    if error.reason == "needs_shapes":
        return ask_shapes(parent, options, error.message)
    if error.reason == "needs_code" and path:
        script, _ = QFileDialog.getOpenFileName(
            parent, f"The script that defines the model of {Path(path).name}", str(Path(path).parent),
            "Python scripts (*.py)")
        return {"script": script, "weights": str(Path(path).resolve())} if script else None
    return None


def ask_shapes(parent: QWidget, options: dict, why: str) -> dict | None:
    """Ask for input shapes until they parse (or the user cancels)."""
    text = options.get("input_shapes") or "1,3"
    while True:
        text, ok = QInputDialog.getText(
            parent, "Input shapes",
            f"{why}\n\nOne shape per input, separated by ';' (e.g. 2,4 or 2,8:int64; 2,8):",
            QLineEdit.EchoMode.Normal, text)
        if not ok or not text.strip():
            return None
        try:
            model_kinds.parse_shapes(text)
        except model_kinds.ModelFileError as exc:
            QMessageBox.warning(parent, "Input shapes", str(exc))
            continue
        return {**options, "input_shapes": text.strip()}


def split_dropped(paths: list[str]) -> tuple[str | None, dict]:
    """The file to open among dropped ``paths`` and its load options: a script dropped with a
    state_dict or safetensors file opens with those weights."""
    scripts = [p for p in paths if SCRIPT.accepts(p)]
    weights = [p for p in paths if is_weights_file(p)]
    if scripts and weights:
        return scripts[0], {"weights": str(Path(weights[0]).resolve())}
    for p in paths:
        if is_openable(p):
            return p, {}
    return None, {}
