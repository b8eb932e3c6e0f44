"""The memory chart as a PNG or SVG file, in the print theme by default (from the app and headless).

The chart is rendered as Qt paints it (``QWidget.render`` into a ``QSvgGenerator`` or an
image), so the file shows exactly the lines, bands, markers, legend and axes of the screen.
pyqtgraph's own SVG exporter is not used: it rewrites items one by one and drops the phase
bands, which are painted as an image strip.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication
import shiboken6

from widgets.export.graph_export import ensure_app
from widgets.export.scene_file import write_scene
from widgets.memory.chart import MemoryChart

FORMATS = ("png", "svg")


class MemoryExportError(ValueError):
    """A memory export that cannot be made; the message says why."""


def export_chart(chart: MemoryChart, path, *, theme: str | None = "print", size: tuple[int, int] = (1000, 380),
                 scale: float = 2.0) -> Path:
    """Write ``chart`` to ``path`` (.png or .svg) at ``size`` logical pixels; restores its theme and size."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise MemoryExportError(f"{path}: unknown memory export format {fmt or '(none)'!r}; use .png or .svg")
    old_theme, old_size = chart.theme().name, chart.size()
    try:
        if theme:
            chart.set_theme(theme)
        hidden = not chart.isVisible()
        if hidden:  # a chart never shown has no layout yet: show it off screen for the render
            chart.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)
            chart.show()
        chart.resize(*size)
        QApplication.processEvents()
        chart.flush()
        path.parent.mkdir(parents=True, exist_ok=True)
        background = QColor(chart.theme().background)
        view = chart.plot_widget
        source = view.mapToScene(view.viewport().rect()).boundingRect()
        if not write_scene(view.scene(), path, fmt, size, source, background, scale=scale,
                           title="memory over the run", description="memory chart exported by Backprop Studio"):
            raise MemoryExportError(f"{path}: could not write the image")
    finally:
        if theme:
            chart.set_theme(old_theme)
        chart.resize(old_size)
    return path


def export_samples(samples, path, *, reference=None, reference_label: str = "reference", theme: str = "print",
                   size: tuple[int, int] = (1000, 380), calls=None, fit_call: int | None = None) -> Path:
    """Headless: a chart of ``samples`` (and a ``reference`` run on the same scale) written to ``path``."""
    if not samples:
        raise MemoryExportError(f"{path}: the run recorded no memory samples")
    ensure_app()
    chart = MemoryChart(theme=theme)
    try:
        chart.resize(*size)
        chart.set_samples(samples)
        if calls:
            chart.set_calls(calls)
        if reference:
            chart.set_reference(reference, reference_label)
        if fit_call is not None:
            chart.fit_call(fit_call)
        return export_chart(chart, path, theme=theme, size=size)
    finally:
        # Destroyed now, not at interpreter exit after the QApplication (which can crash).
        shiboken6.delete(chart)
