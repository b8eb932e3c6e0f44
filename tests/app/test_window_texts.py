"""The window's own texts: the Help menu's shortcuts and tour, and the title naming the graph shown."""

from pathlib import Path

from PySide6.QtCore import Qt

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"


def _help_menu(window):
    return next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")


def test_help_menu_has_shortcuts_and_getting_started(qtbot, window):
    texts = [a.text() for a in _help_menu(window).actions() if not a.isSeparator()]
    assert texts == ["&Getting Started", "&Keyboard Shortcuts", "&About Backprop Studio"]


def test_shortcuts_dialog_lists_the_actions_keys(qtbot, window):
    from app.window.help_dialogs import ShortcutsDialog

    dialog = ShortcutsDialog(window)
    qtbot.addWidget(dialog)
    rows = dialog.rows()
    assert ("Open", "Ctrl+O") in rows and ("Continue", "F5") in rows and ("Step", "F10") in rows
    assert ("Debug", "F9") in rows and ("Export", "Ctrl+E") in rows and ("Open Trace", "Ctrl+Shift+O") in rows
    assert ("Keyboard Shortcuts", "Ctrl+/") in rows and ("Getting Started", "F1") in rows
    # Read from the actions: a shortcut changed is listed as it now is.
    window.act_fit.setShortcut("Ctrl+9")
    assert ("Fit to Window", "Ctrl+9") in ShortcutsDialog(window).rows()
    keys = [k for _, k in rows]
    assert len(keys) == len(set(keys)), "two actions share a shortcut"


def test_getting_started_lists_every_example_and_opens_one(qtbot, window, monkeypatch):
    from app.window.help_dialogs import GettingStartedDialog

    opened = []
    monkeypatch.setattr(window, "open_script", lambda path, **_: opened.append(path) or True)
    dialog = GettingStartedDialog(window)
    qtbot.addWidget(dialog)
    items = [dialog.list.item(i) for i in range(dialog.list.count())]
    assert [Path(i.data(Qt.ItemDataRole.UserRole)).name for i in items] == \
        sorted(p.name for p in EXAMPLES.glob("[0-9]*.py"))
    lines = {Path(i.data(Qt.ItemDataRole.UserRole)).name: i.text() for i in items}
    assert lines["07_grad_accumulation.py"] == \
        "07_grad_accumulation.py — .grad accumulates across backward calls until it is zeroed."
    assert all(" — " in text and "`" not in text for text in lines.values())
    dialog.list.itemActivated.emit(items[0])
    assert opened == [str(EXAMPLES / "01_multiply.py")]
