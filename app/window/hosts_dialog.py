"""Run > Hosts…: the saved hosts as a table the user edits (name, ssh destination or worker
command, the host's Python, a remote folder). Saving checks every row and names the first bad
field; the picker then lists the new hosts' devices as their workers say hello. Test starts a
worker on the selected row's host, on a thread, and shows what it reports (its machine,
Python, torch, devices) or why it did not start, as ``hosts check`` prints it."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QAbstractItemView, QDialog, QDialogButtonBox, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout)

from app.cli.hosts import check_host, load_hosts, save_hosts
from core.client.launchers import LauncherError, from_host

COLUMNS = ("Name", "ssh destination", "or worker command", "Python on the host", "Remote folder", "Send folder")
SEND = len(COLUMNS) - 1  # a check box: send the files beside each script
HELP = ("A host runs the worker where the GPU is. Give an ssh destination (user@host, "
        "ssh://user@host:port or a ~/.ssh/config alias; your keys and agent are used, no password "
        "is stored) and the host's Python with torch (the app sends the worker's code), or a whole worker command "
        "such as <code>srun -p gpu python</code>, <code>docker exec -i box python</code> or "
        "<code>kubectl exec -i pod -- python</code> (end it in <code>-m core.worker</code> to use a "
        "Backprop Studio installed there).")


def row_to_host(values: list[str], send_folder: bool = False) -> dict:
    name, dest, command, python, cwd = (v.strip() for v in values)
    host = {"name": name, "remote_cwd": cwd or None, "send_folder": send_folder}
    if command:
        host.update(kind="command", command=command)
    else:
        host.update(kind="ssh", dest=dest or name, python=python or "python3")
    return host


def host_to_row(host: dict) -> list[str]:
    if host.get("kind") == "command":
        return [host.get("name", ""), "", host.get("command", ""), "", host.get("remote_cwd") or ""]
    return [host.get("name", ""), host.get("dest", ""), "", host.get("python", ""), host.get("remote_cwd") or ""]


class _CheckDone(QObject):
    """Carries a check's result from its thread to the dialog: (text, whether the worker came up)."""
    done = Signal(str, bool)


class HostsDialog(QDialog):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Hosts")
        self.resize(860, 320)
        layout = QVBoxLayout(self)
        intro = QLabel(HELP, self)
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        layout.addWidget(self.table)
        for host in load_hosts():
            self.add_row(host_to_row(host), bool(host.get("send_folder")))
        buttons = QHBoxLayout()
        add, remove = QPushButton("Add", self), QPushButton("Remove", self)
        add.clicked.connect(lambda: self.add_row(["", "", "", "python3", ""]))
        remove.clicked.connect(lambda: self.table.removeRow(self.table.currentRow()))
        self.test = QPushButton("Test", self)
        self.test.setToolTip("Start a worker on the selected row's host and show what it reports (Ctrl+T)")
        self.test.setShortcut("Ctrl+T")
        self.test.clicked.connect(self.check_selected)
        buttons.addWidget(add)
        buttons.addWidget(remove)
        buttons.addWidget(self.test)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        self.report = QLabel("", self)  # what the last Test found
        self.report.setWordWrap(True)
        self.report.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.report)
        self._checks = _CheckDone(self)
        self._checks.done.connect(self._checked)
        self.error = QLabel("", self)
        self.error.setStyleSheet("color: #b00020")
        layout.addWidget(self.error)
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel, self)
        box.accepted.connect(self.save)
        box.rejected.connect(self.reject)
        layout.addWidget(box)

    def add_row(self, values: list[str], send_folder: bool = False) -> None:
        r = self.table.rowCount()
        self.table.insertRow(r)
        for c, v in enumerate(values):
            self.table.setItem(r, c, QTableWidgetItem(v))
        check = QTableWidgetItem("")
        check.setFlags(Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsEnabled)
        check.setCheckState(Qt.CheckState.Checked if send_folder else Qt.CheckState.Unchecked)
        self.table.setItem(r, SEND, check)

    def row_host(self, r: int) -> dict:
        values = [(self.table.item(r, c).text() if self.table.item(r, c) else "") for c in range(SEND)]
        check = self.table.item(r, SEND)
        return row_to_host(values, check is not None and check.checkState() == Qt.CheckState.Checked)

    def check_selected(self) -> None:
        """Test: start a worker on the selected row's host (on a thread; the dialog stays usable)."""
        r = self.table.currentRow()
        if r < 0:
            r = 0 if self.table.rowCount() == 1 else -1
        if r < 0:
            self._show_report("Select a host to test.", False)
            return
        try:
            launcher = from_host(self.row_host(r))
        except LauncherError as exc:
            self._show_report(f"row {r + 1}: {exc}", False)
            return
        self.test.setEnabled(False)
        self.test.setText("Testing…")
        self.report.setStyleSheet("")
        self.report.setText(f"Starting a worker on {launcher.name}: {launcher.describe()}…")
        signal = self._checks.done

        def check() -> None:
            ok, lines = check_host(launcher)
            try:
                signal.emit("\n".join(line.strip() for line in lines), ok)
            except RuntimeError:  # the dialog was closed meanwhile
                pass

        threading.Thread(target=check, name=f"check-{launcher.name}", daemon=True).start()

    def _checked(self, text: str, ok: bool) -> None:
        self.test.setEnabled(True)
        self.test.setText("Test")
        self._show_report(text, ok)

    def _show_report(self, text: str, ok: bool) -> None:
        self.report.setStyleSheet("color: #1b5e20" if ok else "color: #b00020")
        self.report.setText(text)

    def hosts(self) -> list[dict]:
        """Every row as a host record; LauncherError naming the row and field of the first bad one."""
        out, names = [], set()
        for r in range(self.table.rowCount()):
            values = [(self.table.item(r, c).text() if self.table.item(r, c) else "") for c in range(SEND)]
            if not any(v.strip() for v in values):
                continue
            host = self.row_host(r)
            try:
                from_host(host)
            except LauncherError as exc:
                raise LauncherError(f"row {r + 1}: {exc}") from None
            if host["name"] in names:
                raise LauncherError(f"row {r + 1}: the name '{host['name']}' is used twice")
            names.add(host["name"])
            out.append(host)
        return out

    def save(self) -> None:
        try:
            hosts = self.hosts()
        except LauncherError as exc:
            self.error.setText(str(exc))
            return
        save_hosts(hosts)
        self.accept()


def add_menu_action(window, restart) -> QAction:
    """Run > Hosts… and Run > Reconnect Hosts; ``restart()`` starts the saved hosts' workers
    again (after a save, or when a host that was unreachable may be back: a VPN came up)."""
    run_menu = next((a.menu() for a in window.menuBar().actions() if a.text() == "&Run"), None)
    act = QAction("&Hosts…", window)
    act.setToolTip("Hosts the worker can run on (ssh, Slurm, Docker, Kubernetes)")

    def open_dialog() -> None:
        if HostsDialog(window).exec() == QDialog.DialogCode.Accepted:
            restart()

    act.triggered.connect(open_dialog)
    again = QAction("Rec&onnect Hosts", window)
    again.setToolTip("Start the saved hosts' workers again: a host listed as unavailable may be reachable now")
    again.triggered.connect(lambda: restart())
    if run_menu is not None:
        run_menu.addSeparator()
        run_menu.addAction(act)
        run_menu.addAction(again)
    window.act_hosts = act
    window.act_reconnect_hosts = again
    return act
