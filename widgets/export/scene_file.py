"""A region of a Qt scene written as a PNG or an SVG, as Qt paints it (the charts' exports).

The memory chart and the curves of a loop are pyqtgraph scenes; both are written by rendering the
scene into a ``QSvgGenerator`` or a high-density image, so the file shows exactly what the screen
does (pyqtgraph's own SVG exporter rewrites items one by one and drops what is painted as an image).
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QRect, QRectF, QSize
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtSvg import QSvgGenerator


def write_scene(scene, path: Path, fmt: str, size: tuple[int, int], source: QRectF, background: QColor, *,
                scale: float = 2.0, title: str = "", description: str = "") -> bool:
    """Render ``source`` (scene coordinates) of ``scene`` into ``path`` at ``size`` logical pixels:
    an SVG (``fmt`` "svg") or a PNG of ``scale`` pixels per logical one. False if the image could not be
    written."""
    target = QRectF(0, 0, *size)
    if fmt == "svg":
        gen = QSvgGenerator()
        gen.setFileName(str(path))
        gen.setSize(QSize(*size))
        gen.setViewBox(QRect(0, 0, *size))
        gen.setTitle(title)
        gen.setDescription(description)
        painter = QPainter(gen)
        try:
            painter.fillRect(target, background)
            scene.render(painter, target, source)
        finally:
            painter.end()
        return True
    # Drawn at the logical size on a high-density image, so text and lines keep their proportions.
    image = QImage(int(size[0] * scale), int(size[1] * scale), QImage.Format.Format_ARGB32)
    image.setDevicePixelRatio(scale)
    image.fill(background)
    painter = QPainter(image)
    try:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        scene.render(painter, target, source)
    finally:
        painter.end()
    return image.save(str(path))
