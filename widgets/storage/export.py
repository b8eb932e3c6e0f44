"""Export the Storage view (PNG, SVG, PDF) in a print look: white paper, black text, grey cells.

The view is laid out offscreen at a width that fits the cells and tall enough that nothing
scrolls, then painted with ``QWidget.render`` into an image, an SVG generator or a PDF page.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMarginsF, QPoint, QRect, QSize, QSizeF, Qt
from PySide6.QtGui import QColor, QImage, QPageLayout, QPageSize, QPainter, QPalette, QPdfWriter
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QFileDialog, QMessageBox, QTreeWidget

from core.model.trace import Trace
from widgets.export.graph_export import ensure_app
from widgets.storage.view import StorageView

FORMATS = ("png", "svg", "pdf")


class StorageExportError(ValueError):
    """The tensor to export is not in the trace; the message lists the names that are."""


def print_palette(base: QPalette) -> QPalette:
    pal = QPalette(base)
    for role, value in ((QPalette.ColorRole.Window, "#ffffff"), (QPalette.ColorRole.Base, "#ffffff"),
                        (QPalette.ColorRole.WindowText, "#000000"), (QPalette.ColorRole.Text, "#000000"),
                        (QPalette.ColorRole.Highlight, "#4d4d4d"), (QPalette.ColorRole.HighlightedText, "#ffffff"),
                        (QPalette.ColorRole.PlaceholderText, "#666666"), (QPalette.ColorRole.AlternateBase, "#f2f2f2"),
                        (QPalette.ColorRole.Button, "#f2f2f2"), (QPalette.ColorRole.ButtonText, "#000000")):
        pal.setColor(role, QColor(value))
    return pal


def find_tensor(trace: Trace, name: str) -> tuple[object, str]:
    """(tensor source, tensor id) of the tensor the script calls ``name`` (top level first, then calls)."""
    for source in (trace, *trace.calls):
        for t in source.tensors:
            if t.name == name or t.id == name:
                return source, t.id
    names = sorted({t.name for src in (trace, *trace.calls) for t in src.tensors if t.name})
    raise StorageExportError(f"no tensor named '{name}' in the trace; named tensors: {', '.join(names) or 'none'}")


def _fit(view, width: int) -> QSize:
    """Resize the view so the whole strip and the same-storage list show without scrolling."""
    view.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)
    view.show()  # a hidden widget's scroll area never lays out its viewport
    view.resize(width, 2000)
    QApplication.processEvents()
    view.canvas.resize(view.scroll.viewport().width(), view.canvas.height())  # rows follow the width
    canvas_h = view.canvas.minimumHeight()
    tree: QTreeWidget = view.shared
    # A flat header: the style's gradient header has no PDF equivalent (and is not print-like).
    tree.header().setStyleSheet("QHeaderView::section { background: white; color: black; border: none; "
                                "border-bottom: 1px solid #888888; padding: 1px 4px; }")
    rows = tree.topLevelItemCount()
    tree_h = (tree.header().height() + rows * (tree.sizeHintForRow(0) if rows else 0) + 8) if rows else 0
    for area in (view.scroll, tree):
        area.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        area.setFrameShape(QAbstractScrollArea.Shape.NoFrame)
    view.scroll.setMinimumHeight(canvas_h + 4)
    view.scroll.setMaximumHeight(canvas_h + 4)
    tree.setMinimumHeight(tree_h)
    tree.setMaximumHeight(max(tree_h, 1))
    view.layout().activate()
    size = QSize(width, view.layout().minimumSize().height() + 8)
    view.resize(size)
    QApplication.processEvents()
    return size


def render_storage(view, path, fmt: str | None = None, *, width: int = 760, scale: float = 2.0) -> Path:
    """Write the storage view to ``path`` (format from the suffix unless ``fmt``) in the print look."""
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".") or "png").lower()
    if fmt not in FORMATS:
        raise StorageExportError(f"{path}: the storage view exports as PNG, SVG or PDF, not '{fmt}'")
    old = view.palette()
    view.setPalette(print_palette(old))
    view.set_screen_hints(False)  # a picture on paper cannot be clicked
    try:
        size = _fit(view, width)
        if fmt == "png":
            image = QImage(int(size.width() * scale), int(size.height() * scale), QImage.Format.Format_ARGB32)
            image.fill(QColor("white"))
            p = QPainter(image)
            p.scale(scale, scale)
            view.render(p, QPoint(0, 0))
            p.end()
            if not image.save(str(path)):
                raise StorageExportError(f"{path}: cannot write the image")
        elif fmt == "svg":
            gen = QSvgGenerator()
            gen.setFileName(str(path))
            gen.setSize(size)
            gen.setViewBox(QRect(0, 0, size.width(), size.height()))
            gen.setTitle(f"Storage of {view.picture().name}")
            p = QPainter(gen)
            view.render(p, QPoint(0, 0))
            p.end()
        else:
            writer = QPdfWriter(str(path))
            writer.setTitle(f"Storage of {view.picture().name}")
            writer.setCreator("Backprop Studio")
            writer.setPageMargins(QMarginsF(0, 0, 0, 0), QPageLayout.Unit.Point)
            writer.setPageSize(QPageSize(QSizeF(size.width() * 0.75, size.height() * 0.75), QPageSize.Unit.Point,
                                         "storage", QPageSize.SizeMatchPolicy.ExactMatch))
            p = QPainter()
            if not p.begin(writer):
                raise StorageExportError(f"{path}: cannot write the PDF file")
            try:
                unit = writer.resolution() / 72.0 * 0.75
                p.scale(unit, unit)
                view.render(p, QPoint(0, 0))
            finally:
                p.end()
    finally:
        view.set_screen_hints(True)
        view.setPalette(old)
    return path


def export_storage(trace: Trace, name: str, path, fmt: str | None = None, **options) -> Path:
    """Headless: the storage view of the tensor ``name`` written to ``path``."""
    ensure_app()
    source, tid = find_tensor(trace, name)
    storages = trace.storages if source is trace else getattr(source, "storages", None)
    return _render_new_view(source, tid, storages, path, fmt, **options)


def export_view_copy(view, path, fmt: str | None = None, **options) -> Path:
    """Export what a live StorageView shows, through an offscreen copy (the live one keeps its layout)."""
    if view.tensor_id() is None:
        raise StorageExportError("select a tensor first: the Storage view is empty")
    table, tensor_id, storages = view.state()
    return _render_new_view(table, tensor_id, storages, path, fmt, **options)


def _render_new_view(table, tensor_id, storages, path, fmt, **options) -> Path:
    """Render the storage of ``tensor_id`` through a StorageView made for this one picture."""
    view = StorageView()
    try:
        view.set_tensor(table, tensor_id, storages)
        return render_storage(view, path, fmt, **options)
    finally:
        view.deleteLater()


def export_storage_dialog(window) -> Path | None:
    """File > Export Storage View: ask for a file name and write the Storage view there."""
    view = window.storage
    if view.tensor_id() is None:
        QMessageBox.information(window, "Export Storage View", "Select a tensor first: the Storage view is empty.")
        return None
    name = view.picture().name or "storage"
    path, _ = QFileDialog.getSaveFileName(window, "Export Storage View", f"storage-{name}.svg",
                                          "SVG (*.svg);;PNG (*.png);;PDF (*.pdf)")
    if not path:
        return None
    try:
        return export_view_copy(view, path)
    except (StorageExportError, OSError) as exc:
        QMessageBox.warning(window, "Export Storage View", str(exc))
        return None
