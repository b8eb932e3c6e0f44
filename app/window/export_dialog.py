"""File > Export…: the current graph as PNG, SVG, PDF, DOT or JSON, and stepping sessions as frames + GIF.

What is exported is what the window shows: the current call with its collapsed groups,
saved tensors, shapes, step states, edge gradients and search highlights. The theme can
differ from the window's (print is the default: greys, shapes tell kinds apart).
``add_export_action(window)`` is all a main window needs to call.
"""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QCoreApplication, Qt, Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QMessageBox,
    QProgressDialog,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.window.actions import make_action
from core.model.forward_order import forward_replay
from core.model.rank_files import save_ranks
from widgets.export import graph_export as export
from widgets.export.forward_frames import export_forward_frames

log = logging.getLogger(__name__)

FORMAT_NAMES = {"png": "PNG image", "svg": "SVG (vector)", "pdf": "PDF (vector, one page)",
                "dot": "Graphviz DOT", "json": "JSON trace"}
_last_dir: dict[str, str] = {}


def report_error(parent: QWidget | None, text: str) -> None:
    """Tell the user an export failed (a message box; tests replace it)."""
    QMessageBox.critical(parent, "Export failed", text)


class ExportDialog(QDialog):
    """Options for one export of the window's current graph."""

    sig_exported = Signal(list)
    """Files were written (their paths, as strings)."""

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.setWindowTitle("Export Graph")
        self.setMinimumWidth(520)
        call = window.call
        stem = Path(window.script_path).stem if getattr(window, "script_path", None) else "graph"
        name = f"{stem}-call{call.index}" if call is not None else stem
        folder = _last_dir.get("dir") or str(Path.home())

        self.path = QLineEdit(str(Path(folder) / f"{name}.png"))
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        file_row = QHBoxLayout()
        file_row.addWidget(self.path, 1)
        file_row.addWidget(browse)
        self.format = QComboBox()
        for key, text in FORMAT_NAMES.items():
            self.format.addItem(text, key)
        self.region = QComboBox()
        self.region.addItem("Whole graph", "all")
        self.region.addItem("Visible region", "visible")
        self.theme = QComboBox()
        for key in ("print", "light", "dark"):
            self.theme.addItem(key.title(), key)
        self.title = QLineEdit(call.title if call is not None else "")
        self.title.setPlaceholderText("none")
        self.caption = QLineEdit()
        self.caption.setPlaceholderText("none")
        self.scale = QDoubleSpinBox()
        self.scale.setRange(0.25, 8.0)
        self.scale.setSingleStep(0.5)
        self.scale.setValue(2.0)
        self.scale.setSuffix(" \u00d7")
        self.background = QComboBox()
        self.background.addItem("Theme background (white in print)", "theme")
        self.background.addItem("Transparent", "transparent")
        self.direction = QComboBox()
        self.direction.addItem("Top-down: loss on top, arrows the way gradients flow", "TB")
        self.direction.addItem("Left to right: loss on the left", "LR")
        self.direction.addItem("Forward order: inputs on top, arrows to the loss", "forward")
        self.direction.setCurrentIndex(max(0, self.direction.findData(window.graph.direction)))  # as on screen
        self.page = QComboBox()
        self.page.addItem("Fit the graph (any size)", None)
        for key, text in (("16:9", "16:9 slide"), ("4:3", "4:3 slide"), ("A4", "A4 portrait"),
                          ("Letter", "Letter portrait")):
            self.page.addItem(text, key)
        self.page.setToolTip("Fit a slide or a portrait page. On a slide, text stays at 20 px or more at "
                             "1920\u00d71080 (10 pt of the slide): the graph is spaced compactly unless what "
                             "is written along its edges needs more room, and modules fold before text gets "
                             "smaller; only a graph that folded would still show just its part around the "
                             "loss goes down to 9 pt. On paper, modules fold rather than text going below 9 "
                             "pt.")
        self.selection = QCheckBox("Include the selection ring")
        self.only_call = QCheckBox("Only the current call (JSON)")
        steps = self._steps()
        self.frames = QCheckBox(f"Also export step frames + GIF ({len(steps)} steps)" if steps else
                                "Also export step frames + GIF (step through backward first)")
        self.frames.setEnabled(bool(steps))
        ops = len(forward_replay(call))
        self.forward = QCheckBox(f"Also export forward replay frames + GIF ({ops} ops)" if ops else
                                 "Also export forward replay frames + GIF (this call has no ops)")
        self.forward.setToolTip("One PNG per op in the order the forward pass made them, beside the file "
                                "(NAME-forward/frame_001.png, ...), and NAME-forward.gif")
        self.forward.setEnabled(ops > 0)

        form = QFormLayout()
        form.addRow("File:", file_row)
        form.addRow("Format:", self.format)
        form.addRow("Region:", self.region)
        form.addRow("Theme:", self.theme)
        form.addRow("Direction:", self.direction)
        form.addRow("Page:", self.page)
        form.addRow("Title:", self.title)
        form.addRow("Caption:", self.caption)
        form.addRow("PNG scale:", self.scale)
        form.addRow("Background:", self.background)
        form.addRow("", self.selection)
        form.addRow("", self.only_call)
        form.addRow("", self.frames)
        form.addRow("", self.forward)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.export_button = buttons.addButton("Export", QDialogButtonBox.ButtonRole.AcceptRole)
        buttons.accepted.connect(self.export)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)
        self.format.currentIndexChanged.connect(self._format_changed)
        self.path.textEdited.connect(self._path_edited)
        self._path_edited(self.path.text())

    # -- options -------------------------------------------------------------------------------
    def _steps(self) -> list[dict]:
        stepper = getattr(self.window, "stepper", None)
        call = self.window.call
        if stepper is None or stepper.call is None or call is None or stepper.call.structure != call.structure:
            return []
        return list(stepper.steps)

    def fmt(self) -> str:
        return self.format.currentData()

    def _format_changed(self) -> None:
        text = self.path.text().strip()
        if text:
            self.path.setText(str(Path(text).with_suffix("." + self.fmt())))
        self._update_enabled()

    def _path_edited(self, text: str) -> None:
        index = self.format.findData(Path(text.strip()).suffix.lstrip(".").lower())
        if index >= 0:
            self.format.blockSignals(True)
            self.format.setCurrentIndex(index)
            self.format.blockSignals(False)
        self._update_enabled()

    def _update_enabled(self) -> None:
        fmt = self.fmt()
        drawn = fmt in ("png", "svg", "pdf")
        for w in (self.region, self.caption, self.background, self.selection, self.direction, self.page):
            w.setEnabled(drawn)
        self.scale.setEnabled(fmt == "png")
        self.theme.setEnabled(fmt != "json")
        self.title.setEnabled(fmt != "json")
        self.only_call.setEnabled(fmt == "json")

    def _browse(self) -> None:
        filters = ";;".join(f"{FORMAT_NAMES[k]} (*.{k})" for k in FORMAT_NAMES)
        current = f"{FORMAT_NAMES[self.fmt()]} (*.{self.fmt()})"
        path, _ = QFileDialog.getSaveFileName(self, "Export graph", self.path.text(), filters, current)
        if path:
            self.path.setText(path)
            self._path_edited(path)

    def options(self) -> dict:
        """The choices made, as keyword arguments for ``run_export``."""
        path = self.path.text().strip()
        if path and not Path(path).suffix:
            path += "." + self.fmt()
        return {
            "path": path,
            "fmt": self.fmt(),
            "region": self.region.currentData(),
            "theme": self.theme.currentData(),
            "title": self.title.text().strip() or None,
            "caption": self.caption.text().strip() or None,
            "scale": self.scale.value(),
            "background": self.background.currentData(),
            "selection": self.selection.isChecked(),
            "only_call": self.only_call.isChecked(),
            "frames": self.frames.isEnabled() and self.frames.isChecked(),
            "forward": self.forward.isEnabled() and self.forward.isChecked(),
            "direction": self.direction.currentData(),
            "page": self.page.currentData(),
        }

    # -- running -------------------------------------------------------------------------------
    def export(self) -> list[Path]:
        """Export with the chosen options; errors are shown, never raised. Closes on success."""
        options = self.options()
        if not options["path"]:
            report_error(self, "Choose a file to export to.")
            return []
        try:
            paths = run_export(self.window, **options, parent=self)
        except Exception as exc:  # a failed export must not take the window down
            log.exception("export failed")
            report_error(self, f"Could not export to {options['path']}:\n{exc}")
            return []
        _last_dir["dir"] = str(Path(options["path"]).parent)
        status = getattr(self.window, "state_label", None)
        if status is not None and paths:
            status.setText(f"Exported {paths[0]}" + (f" and {len(paths) - 1} more files" if len(paths) > 1 else ""))
        self.sig_exported.emit([str(p) for p in paths])
        self.accept()
        return paths


def run_export(window, *, path, fmt=None, region="all", theme="print", title=None, caption=None, scale=2.0,
               background="theme", selection=False, only_call=False, frames=False, parent=None, direction="TB",
               page=None, forward=False) -> list[Path]:
    """Write the window's current graph (and, with ``frames``, the stepping session's frames and
    GIF beside it); returns the files written. Raises ``export.ExportError`` and OSError.
    Another ``direction`` or a ``page`` lays the graph out again on an offscreen view, with the
    window's folds, toggles (Colour by Gradient Norm too) and step state. The call's NaN/Inf marks
    are drawn either way (the session handed them to the call: ``core.model.nan_check``)."""
    call = window.call
    if call is None or not call.nodes:
        raise export.ExportError("there is no graph to export: run a script first")
    path = Path(path)
    fmt = export.format_of(path, fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    view = window.graph
    QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
    try:
        if fmt == "json":
            trace = getattr(window, "trace", None)
            ranks = getattr(window, "ranks", None)
            others = ranks.others() if ranks is not None and trace is not None and not only_call else {}
            if trace is not None and only_call:
                trace = export.strip_call(trace, call)
            # A DDP run: every rank's trace, the shown one at ``path``, to open together again.
            written = save_ranks(path, trace, others) if others else [export.save_json(call, path, trace)]
        elif fmt == "dot":
            written = [export.render(view, path, "dot", title=title, theme=theme)]
        elif direction != "TB" or page is not None:
            written = [export.export_call(
                call, path, fmt, theme=theme, title=title, caption=caption, states=view.node_states(),
                edge_texts=view.edge_texts(), collapsed=view.collapsed(), show_saved=view.shows_saved(),
                show_shapes=view.shows_shapes(), scale=scale, background=None if background == "theme" else background,
                direction=direction, page=page, fold=True, color_by="grad-norm" if view.colours_by_norm() else None)]
        else:
            options = dict(region=region, title=title, caption=caption, theme=theme, selection=selection,
                           background=None if background == "theme" else background)
            if fmt == "png":
                options["scale"] = scale
            written = [export.render(view, path, fmt, **options)]
    finally:
        QApplication.restoreOverrideCursor()
    if frames:
        written += _export_steps(window, path, theme, title, parent)
    if forward:  # the forward replay's frames beside the file: NAME-forward/, NAME-forward.gif
        written += _export_forward(window, path, theme, title, parent)
    return written


def _export_steps(window, path: Path, theme: str, title: str | None, parent) -> list[Path]:
    stepper = window.stepper
    steps = list(stepper.steps)

    def write(progress) -> list[Path]:
        return export.export_frames(
            stepper.call, steps, path.with_name(path.stem + "-frames"), theme=theme, title=title,
            collapsed=window.graph.collapsed(), show_shapes=_checked(window, "act_shapes"),
            show_saved=_checked(window, "act_saved"), progress=progress)

    return _frames_and_gif("step frames", len(steps), write, path.with_suffix(".gif"), parent)


def _export_forward(window, path: Path, theme: str, title: str | None, parent) -> list[Path]:
    def write(progress) -> list[Path]:
        return export_forward_frames(
            window.call, path.with_name(path.stem + "-forward"), theme=theme, title=title,
            collapsed=window.graph.collapsed(), show_shapes=_checked(window, "act_shapes"),
            show_saved=_checked(window, "act_saved"), progress=progress)

    return _frames_and_gif("forward replay frames", len(forward_replay(window.call)), write,
                           path.with_name(path.stem + "-forward.gif"), parent)


def _frames_and_gif(what: str, total: int, write, gif: Path, parent) -> list[Path]:
    """``write(progress)``'s numbered frames under a progress dialog that can cancel them, then
    their GIF (none when cancelled); the files written."""
    progress = QProgressDialog(f"Exporting {what}…", "Cancel", 0, total, parent)
    progress.setWindowModality(Qt.WindowModality.WindowModal)
    progress.setMinimumDuration(400)

    def on_progress(done: int, _total: int) -> bool:
        progress.setValue(done)
        QCoreApplication.processEvents()
        return not progress.wasCanceled()

    QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
    try:
        paths = write(on_progress)
        if progress.wasCanceled():
            return paths
        written = export.export_gif(paths, gif)
    finally:
        QApplication.restoreOverrideCursor()
        progress.close()
        progress.deleteLater()
    return paths + [written]


def _checked(window, name: str) -> bool:
    action = getattr(window, name, None)
    return bool(action is not None and action.isChecked())


def open_export_dialog(window) -> ExportDialog:
    dialog = ExportDialog(window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.open()
    return dialog


def add_export_action(window):
    """Create ``window.act_export`` (File > Export…, Ctrl+E), enabled while a graph is shown."""
    act = make_action(window, "&Export…", lambda: open_export_dialog(window), "Ctrl+E",
                      "Export the graph as PNG, SVG, PDF, DOT or JSON (and step frames as a GIF)", "export")
    window.act_export = act
    menu = _file_menu(window)
    if menu is not None:
        actions = menu.actions()
        quit_action = getattr(window, "act_quit", None)
        before = None
        if quit_action in actions:
            i = actions.index(quit_action)
            before = actions[i - 1] if i > 0 and actions[i - 1].isSeparator() else quit_action
        if before is None:
            menu.addSeparator()
            menu.addAction(act)
        else:
            menu.insertSeparator(before)
            menu.insertAction(before, act)

    def update() -> None:
        call = getattr(window, "call", None)
        act.setEnabled(call is not None and bool(call.nodes))

    window.graph.sig_scene_ready.connect(update)
    update()
    return act


def _file_menu(window):
    for action in window.menuBar().actions():
        menu = action.menu()
        if menu is not None and action.text().replace("&", "").strip().lower() == "file":
            return menu
    return None
