"""Help > Keyboard Shortcuts and Help > Getting Started.

The shortcuts are read from the window's actions each time the dialog opens, so the list is
always the one the keys do. The tour lists the bundled examples with what each teaches (the
examples' README table, or the example's own title line) and opens one on a double-click.
"""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QAbstractItemView, QDialog, QDialogButtonBox, QHeaderView, QLabel, QListWidget,
                               QListWidgetItem, QTableWidget, QTableWidgetItem, QVBoxLayout)

from app.window.resources import EXAMPLES, example_scripts

TOUR_INTRO = ("Each example is a short PyTorch script that shows one thing about autograd. Open one "
              "(double-click), look at its graph, then press F9 to debug it and F10 to step backward "
              "node by node. Click a line number first to pause before that line instead: F10 then runs "
              "one line (F11 steps into a function, Ctrl+F11 out of it) and the nodes each line adds "
              "light up. Scripts marked “raises” stop with the error they demonstrate.")


def shortcut_rows(window) -> list[tuple[str, str]]:
    """(action, keys) for every action of ``window`` that has a shortcut, in menu order of creation."""
    rows, seen = [], set()
    for action in window.findChildren(QAction):
        keys = [k.toString(QKeySequence.SequenceFormat.NativeText) for k in action.shortcuts() if not k.isEmpty()]
        name = action.text().replace("&&", "\0").replace("&", "").replace("\0", "&").rstrip("…").strip()
        if not keys or not name or (name, tuple(keys)) in seen:
            continue
        seen.add((name, tuple(keys)))
        rows.append((name, ", ".join(keys)))
    return rows


class ShortcutsDialog(QDialog):
    """The window's keyboard shortcuts, one row per action."""

    def __init__(self, window):
        super().__init__(window)
        self.setWindowTitle("Keyboard Shortcuts")
        rows = shortcut_rows(window)
        self.table = QTableWidget(len(rows), 2, self)
        self.table.setHorizontalHeaderLabels(["Action", "Shortcut"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        for row, (name, keys) in enumerate(rows):
            self.table.setItem(row, 0, QTableWidgetItem(name))
            self.table.setItem(row, 1, QTableWidgetItem(keys))
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(buttons)
        self.resize(460, 560)

    def rows(self) -> list[tuple[str, str]]:
        return [(self.table.item(r, 0).text(), self.table.item(r, 1).text()) for r in range(self.table.rowCount())]


def example_lessons() -> list[tuple[Path, str]]:
    """(example, what it teaches): the README's table where it has the example, else its title line."""
    lessons = {}
    try:
        readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    except OSError:
        readme = ""
    for match in re.finditer(r"^\|\s*`([^`]+\.py)`\s*\|\s*(.+?)\s*\|\s*$", readme, re.MULTILINE):
        lessons[match.group(1)] = _plain(match.group(2))
    return [(path, lessons.get(path.name) or title) for path, title in example_scripts()]


def _plain(markdown: str) -> str:
    """A README cell as text: code and emphasis marks dropped."""
    return re.sub(r"[`*]", "", markdown).strip()


class GettingStartedDialog(QDialog):
    """A short tour: the bundled examples, one line each on what they teach; double-click opens one."""

    def __init__(self, window):
        super().__init__(window)
        self.window_ = window
        self.setWindowTitle("Getting Started")
        intro = QLabel(TOUR_INTRO, self)
        intro.setWordWrap(True)
        self.list = QListWidget(self)
        self.list.setWordWrap(True)
        self.list.setAlternatingRowColors(True)
        for path, lesson in example_lessons():
            item = QListWidgetItem(f"{path.name} — {lesson}")
            item.setData(Qt.ItemDataRole.UserRole, str(path))
            item.setToolTip(str(path))
            self.list.addItem(item)
        self.list.itemActivated.connect(self.open_item)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Close,
                                   self)
        buttons.accepted.connect(lambda: self.open_item(self.list.currentItem()))
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.list)
        layout.addWidget(buttons)
        self.resize(720, 560)

    def open_item(self, item: QListWidgetItem | None) -> None:
        """Open the example ``item`` names in the window, and close the tour."""
        if item is None:
            return
        self.accept()
        self.window_.open_script(item.data(Qt.ItemDataRole.UserRole))


def show_shortcuts(window) -> ShortcutsDialog:
    dialog = ShortcutsDialog(window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
    return dialog


def show_getting_started(window) -> GettingStartedDialog:
    dialog = GettingStartedDialog(window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
    return dialog
