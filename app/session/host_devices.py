"""Saved hosts in the window's device picker: "gpu-box: cuda:0 (H100, 80 GB)".

Each saved host gets a ``WorkerClient`` behind its launcher, started with the window so its
worker's hello (the host's devices) arrives while the user reads the first graph; that spare
worker then serves the first run on the host. A picked host device has the data
``HOST::DEVICE``; ``WorkerHandle.run`` sends such a run to the host's client. A host that
cannot start a worker (ssh refused, another protocol version) is listed greyed out with the
reason as its tooltip, and one whose worker has not said hello yet as "gpu-box: connecting…".
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Qt, Signal

from app.cli.hosts import device_label, load_hosts
from app.window.hosts_dialog import add_menu_action
from core.protocol import events
from core.protocol import messages as protocol
from core.client.handle import WorkerClient
from core.client.launchers import LauncherError, from_host
from core.model.memory import format_bytes

log = logging.getLogger(__name__)

SEP = "::"
LOCAL_BAR_MIN = 4_000_000  # raw bytes of a local worker's trace below which no bar flashes by


def split_device(device: str) -> tuple[str | None, str]:
    """``("gpu-box", "cuda:0")`` for ``"gpu-box::cuda:0"``; ``(None, device)`` for a local device."""
    host, sep, dev = device.partition(SEP)
    return (host, dev) if sep else (None, device)


class HostWorkers(QObject):
    sig_devices = Signal(str, list)
    """A host's worker said hello: the host name and its devices."""
    sig_failed = Signal(str, str)
    """A host's worker could not start: the host name and why."""
    _sig_hello = Signal(str, object)
    """(internal) a hello from a host's client, carried to the GUI thread."""

    def __init__(self, handle, hosts: list[dict] | None = None):
        super().__init__(handle)
        self.handle = handle
        self.clients: dict[str, WorkerClient] = {}
        self.devices: dict[str, list] = {}
        self.failed: dict[str, str] = {}
        self._sig_hello.connect(self._on_hello)
        for host in load_hosts() if hosts is None else hosts:
            try:
                launcher = from_host(host)
            except LauncherError as exc:
                self.failed[str(host.get("name"))] = str(exc)
                continue
            client = WorkerClient(lambda e, name=launcher.name: self._relay(name, e), prestart=True,
                                  launcher=launcher)
            client.expand_steps = handle.local.expand_steps  # the same events as the local worker
            self.clients[launcher.name] = client

    def _relay(self, name: str, event: protocol._Base) -> None:
        if isinstance(event, (protocol.Hello, events.SpareFailed)):
            self._sig_hello.emit(name, event)
        else:
            self.handle.sig_event.emit(event)  # a run on the host: the same signals as a local run

    def _on_hello(self, name: str, event: protocol.Hello | events.SpareFailed) -> None:
        if isinstance(event, events.SpareFailed):
            self.failed[name] = event.message
            self.sig_failed.emit(name, self.failed[name])
            return
        self.devices[name] = [d for d in event.devices if d.get("kind") != "error"]
        self.sig_devices.emit(name, self.devices[name])

    def client_for(self, host: str) -> WorkerClient | None:
        return self.clients.get(host)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def fill_picker(box, hosts: HostWorkers | None) -> None:
    """Append every host's devices (or its failure, or that it is connecting) to the device
    picker, after the local ones."""
    current = box.currentData()
    for i in range(box.count() - 1, -1, -1):
        if SEP in str(box.itemData(i)):
            box.removeItem(i)
    names = [] if hosts is None else list(hosts.clients) + [n for n in hosts.failed if n not in hosts.clients]
    for name in names:
        for d in hosts.devices.get(name, []):
            box.addItem(device_label(name, d), f"{name}{SEP}{d['id']}")
        if name in hosts.failed:
            _add_note(box, f"{name}: unavailable", name, hosts.failed[name])
        elif name not in hosts.devices:  # its worker has not said hello yet
            client = hosts.clients[name]
            _add_note(box, f"{name}: connecting…", name, f"Starting a worker: {client.launcher.describe()}")
    index = box.findData(current)
    if index < 0:
        index = keep_picked(box, current, hosts)
    if index >= 0:
        box.setCurrentIndex(index)


def _add_note(box, text: str, host: str, tooltip: str) -> None:
    """A line of the picker that says how a host is doing rather than naming a device: not pickable."""
    box.addItem(text, f"{host}{SEP}")
    box.model().item(box.count() - 1).setEnabled(False)
    box.setItemData(box.count() - 1, tooltip, Qt.ItemDataRole.ToolTipRole)


def keep_picked(box, device, hosts: HostWorkers | None) -> int:
    """Add ``device`` (``HOST::DEVICE``), picked (``--device``) before its host's worker said
    hello, under its own name until the host's devices replace it; its index in ``box``, or -1
    where it is not a device of a saved host whose worker is starting."""
    host = split_device(str(device))[0]
    if not host or hosts is None or host not in hosts.clients or host in hosts.failed:
        return -1
    box.addItem(str(device).replace(SEP, ": ", 1), device)
    return box.count() - 1


def install(window) -> None:
    """Start a worker on every saved host, list their devices in ``window.device_box``, and add
    Run > Hosts… (saving there starts the hosts' workers again)."""
    handle = window.handle
    refill = lambda *_: fill_picker(window.device_box, handle.hosts)  # noqa: E731

    def start() -> None:
        old = handle.hosts
        if old is not None:
            if handle.client is not handle.local and handle.client in old.clients.values():
                handle.client = handle.local
            old.close()
        hosts = HostWorkers(handle)
        handle.hosts = hosts if hosts.clients or hosts.failed else None
        hosts.sig_devices.connect(refill)
        hosts.sig_failed.connect(refill)
        refill()

    handle.sig_devices.connect(refill)  # connected after the window's own slot: runs after it
    handle.sig_transfer.connect(lambda e: show_transfer(window, e))
    handle.sig_finished.connect(lambda _: end_transfer(window))
    add_menu_action(window, start)
    window.restart_hosts = start
    start()


def show_transfer(window, event: events.Transfer) -> None:
    """The status bar's progress bar follows a trace arriving, or a model file leaving, over a slow
    link; and a big trace from the local worker (uncompressed columns) while the app reads it."""
    raw = max(int(event.raw or 0), 1)
    if event.codec == "raw" and raw < LOCAL_BAR_MIN:
        return  # read in a blink: no bar
    bar = window.busy
    if event.of == "upload":  # a saved model or its weights on the way to the host (core.protocol.uploads)
        name = str(event.name or "").rsplit("/", 1)[-1]
        if event.sent >= raw:
            end_transfer(window)  # all sent: the busy indicator again while the run starts
            return
        bar.setRange(0, 1000)
        bar.setValue(int(1000 * min(event.sent, raw) / raw))
        bar.setFormat(f"sending {name} %p%")
        bar.setTextVisible(True)
        bar.setToolTip(f"Sending {name} to the host: {format_bytes(event.sent)} of {format_bytes(raw)} "
                       f"({event.codec or 'uncompressed'})")
        bar.show()
        return
    bar.setRange(0, 1000)
    bar.setValue(int(1000 * min(event.decoded, raw) / raw))
    bar.setFormat("trace %p%")
    bar.setTextVisible(True)
    codec = "uncompressed" if event.codec in (None, "raw") else event.codec
    bar.setToolTip(f"Receiving the trace: {format_bytes(event.received)} received ({codec}), "
                   f"{format_bytes(event.decoded)} of {format_bytes(raw)} decoded")
    bar.show()


def end_transfer(window) -> None:
    """Back to the busy indicator for the next run."""
    window.busy.setRange(0, 0)
    window.busy.setTextVisible(False)
    window.busy.setToolTip("")
