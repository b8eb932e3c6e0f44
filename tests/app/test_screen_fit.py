"""The window's first size follows the screen; at 1280x800 every panel is on screen and usable."""

from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, QRect, QSettings, QSize

from app.window.screen_fit import LARGEST, first_size, fit_window, screen_key

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"
LAPTOP = QRect(0, 0, 1280, 800)


@pytest.mark.parametrize("available, expected", [
    (QRect(0, 0, 1280, 800), QSize(1177, 736)),
    (QRect(0, 25, 1280, 775), QSize(1177, 713)),  # a menu bar on top
    (QRect(0, 0, 3840, 2160), LARGEST),
    (QRect(0, 0, 800, 600), QSize(800, 600)),  # smaller than the smallest useful window: the screen
])
def test_first_size_fits_the_available_geometry(available, expected):
    size = first_size(available)
    assert size == expected
    assert size.width() <= available.width() and size.height() <= available.height()


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.window.window import MainWindow

    w = MainWindow(timeout=60)
    qtbot.addWidget(w)
    yield w
    w.handle.close()


def _inside(window, widget, screen: QRect) -> bool:
    top_left = widget.mapTo(window, QPoint(0, 0)) + window.geometry().topLeft()
    return screen.contains(QRect(top_left, widget.size()))


@pytest.mark.slow
def test_every_dock_is_on_a_1280x800_screen(qtbot, window, tmp_path):
    settings = QSettings(str(tmp_path / "fit.ini"), QSettings.Format.IniFormat)
    size = fit_window(window, settings, LAPTOP)
    window.show()
    qtbot.waitExposed(window)
    assert LAPTOP.contains(window.geometry()) and size == window.size()
    for key, dock in window.docks.items():
        dock.raise_()
        qtbot.waitUntil(lambda: dock.widget().isVisible())
        inner = dock.widget()
        assert _inside(window, inner, LAPTOP), key
        assert inner.width() >= 180 and inner.height() >= 120, (key, inner.size())
    for widget in (window.statusBar(), window.search_box if hasattr(window, "search_box") else window.statusBar()):
        assert widget.isVisible() and _inside(window, widget, LAPTOP)
    window.close()  # the size is remembered for the screen the window is on
    available = window.screen().availableGeometry()
    assert settings.value(screen_key(window.screen(), available)) is not None


@pytest.mark.slow
def test_the_storage_view_shows_every_cell_of_a_3x4_tensor(qtbot, window, tmp_path):
    fit_window(window, None, LAPTOP)
    window.show()
    qtbot.waitExposed(window)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.open_script(str(EXAMPLES / "20_views_and_strides.py"))
    assert window.select_named("x")
    window.center.setCurrentWidget(window.storage)
    storage = window.storage
    qtbot.waitUntil(lambda: storage.picture().count == 12)
    qtbot.waitUntil(lambda: not storage.scroll.verticalScrollBar().isVisible(), timeout=10_000)  # layout settles
    viewport = storage.scroll.viewport().rect()
    canvas = storage.canvas
    for i in range(12):
        rect = storage.cell_rect(i).toAlignedRect().translated(canvas.pos())
        assert viewport.contains(rect), (i, rect, viewport)
    assert not storage.scroll.verticalScrollBar().isVisible()
    assert not storage.scroll.horizontalScrollBar().isVisible()
    # The Tensors table keeps to its dock: the columns that fit, sized to content, the rest in tooltips.
    window.left_tabs.setCurrentWidget(window.tensors)
    tree = window.tensors.tree
    qtbot.waitUntil(lambda: tree.isVisible())
    window.tensors.fit_columns()
    shown = [c for c in range(tree.columnCount()) if not tree.isColumnHidden(c)]
    assert shown[:3] == [0, 1, 2]  # name, shape, stride always
    qtbot.waitUntil(lambda: sum(tree.columnWidth(c) for c in shown) <= tree.viewport().width() + 1, timeout=10_000)
    assert not tree.horizontalScrollBar().isVisible()
    assert "dtype: float32" in tree.topLevelItem(0).toolTip(0)


@pytest.mark.slow
def test_the_size_is_remembered_per_screen(qtbot, window, tmp_path):
    settings = QSettings(str(tmp_path / "fit.ini"), QSettings.Format.IniFormat)
    available = window.screen().availableGeometry()
    fit_window(window, settings, available)
    window.show()
    qtbot.waitExposed(window)
    window.resize(available.width() - 40, available.height() - 60)
    window.close()
    from app.window.window import MainWindow

    again = MainWindow(timeout=60)
    qtbot.addWidget(again)
    try:
        assert fit_window(again, settings, available) == QSize(available.width() - 40, available.height() - 60)
        other = QRect(0, 0, available.width() + 100, available.height() + 100)  # another screen: a first size
        assert fit_window(again, settings, other) == first_size(other)
    finally:
        again.handle.close()


@pytest.mark.slow
def test_long_names_break_between_words_and_accumulate_grad_shows_its_leaf(qtbot, window):
    from widgets.panels.inspector import breakable

    assert breakable("BinaryCrossEntropyWithLogitsBackward0").split("\u200b") == [
        "Binary", "Cross", "Entropy", "With", "Logits", "Backward0"]
    assert breakable("fc1.weight<") == "fc1.\u200bweight&lt;"
    window.resize(1280, 800)
    window.show()
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.open_script(str(EXAMPLES / "13_mlp_classifier.py"))
    node = next(n for n in window.call.nodes if n.name == "AccumulateGrad" and n.label == "fc1.weight")
    window.select_node(node.id)
    assert window.storage.tensor_id() == node.variable
    assert window.storage.picture().count == 64  # fc1.weight: 16 x 4 floats
    assert "AccumulateGrad" in window.inspector.text()
