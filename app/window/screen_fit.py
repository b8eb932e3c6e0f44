"""The main window's first size follows the screen it opens on, and each screen remembers its own.

A fixed 1400x860 cut the inspector, the search box and the status bar off a 1280x800 laptop
and wasted a 4K monitor. The first time the window opens on a screen it takes most of that
screen's *available* geometry (without task bars and docks), centred, with the side and bottom
docks sized in proportion. When it closes, its geometry is stored under that screen's name and
size, so a laptop and the monitor it is plugged into each get the size the user last gave them.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QEvent, QObject, QRect, QSettings, QSize, Qt
from PySide6.QtGui import QGuiApplication, QScreen
from PySide6.QtWidgets import QMainWindow, QToolBar

FILL = 0.92  # share of the available width and height the first window takes
LARGEST = QSize(1800, 1100)  # on big monitors a wider window only spreads the panels apart
SMALLEST = QSize(960, 600)


def screen_key(screen: QScreen | None, available: QRect) -> str:
    """The settings key for one screen: its name and available size (a changed resolution starts afresh)."""
    name = (screen.name() if screen is not None else "") or "screen"
    name = "".join(c if c.isalnum() else "_" for c in name)
    return f"screens/{name}_{available.width()}x{available.height()}/geometry"


def first_size(available: QRect) -> QSize:
    """Most of ``available``, at most ``LARGEST``; never more than the screen, even a tiny one."""
    width = min(int(available.width() * FILL), LARGEST.width())
    height = min(int(available.height() * FILL), LARGEST.height())
    width = min(max(width, SMALLEST.width()), available.width())
    height = min(max(height, SMALLEST.height()), available.height())
    return QSize(width, height)


def proportion_docks(window: QMainWindow, size: QSize) -> None:
    """Side docks at a share of the window's width, the bottom dock at a share of its height."""
    docks = getattr(window, "docks", {})
    side = [d for k, d in docks.items() if k in ("calls", "inspector")]
    if len(side) == 2:
        window.resizeDocks(side, [int(size.width() * 0.18), int(size.width() * 0.25)], Qt.Orientation.Horizontal)
    if "source" in docks:
        window.resizeDocks([docks["source"]], [int(size.height() * 0.28)], Qt.Orientation.Vertical)


class _Remember(QObject):
    """Stores the window's geometry for its screen when it closes; keeps the toolbars whole on resize."""

    def __init__(self, window: QMainWindow, settings: QSettings | None):
        super().__init__(window)
        self.settings = settings
        self._text_widths: dict[QToolBar, int] = {}

    def fit_toolbars(self, window: QMainWindow) -> None:
        """Icons with their names when the toolbar fits the window; icons alone (named in tooltips)
        when it does not, so nothing, the search box least of all, falls into the overflow menu."""
        for bar in window.findChildren(QToolBar):
            if bar not in self._text_widths:
                bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
                self._text_widths[bar] = bar.sizeHint().width()
            fits = self._text_widths[bar] <= window.width()
            bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon if fits
                                   else Qt.ToolButtonStyle.ToolButtonIconOnly)

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Type.Resize and isinstance(obj, QMainWindow):
            self.fit_toolbars(obj)
        if event.type() == QEvent.Type.Close and isinstance(obj, QMainWindow) and self.settings is not None:
            screen = obj.screen()
            available = screen.availableGeometry() if screen is not None else QRect()
            self.settings.setValue(screen_key(screen, available), obj.saveGeometry())
        return False


def fit_window(window: QMainWindow, settings: QSettings | None = None, available: QRect | None = None) -> QSize:
    """Size ``window`` for its screen: the geometry remembered for that screen, or a first size.

    ``available`` stands in for the screen's available geometry (tests, or a screen the window
    will move to). Returns the size given.
    """
    screen = window.screen() or QGuiApplication.primaryScreen()
    if available is None:
        available = screen.availableGeometry() if screen is not None else QRect(0, 0, 1280, 800)
    remember = _Remember(window, settings)
    window.installEventFilter(remember)
    if settings is not None:
        saved = settings.value(screen_key(screen, available))
        if isinstance(saved, QByteArray) and window.restoreGeometry(saved):
            if available.contains(window.geometry()):
                remember.fit_toolbars(window)
                return window.size()
    size = first_size(available)
    window.resize(size)
    window.move(available.x() + (available.width() - size.width()) // 2,
                available.y() + (available.height() - size.height()) // 2)
    proportion_docks(window, size)
    remember.fit_toolbars(window)
    return size
