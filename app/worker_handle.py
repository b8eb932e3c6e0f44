"""The GUI's handle on the worker: ``core.client.WorkerClient`` events as Qt signals.

The client reads worker messages on background threads; each is re-emitted here as a
signal, which Qt queues onto the GUI thread (qtconsole's pattern). Handlers are found by
message type (``_handle_<type>``).
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal

from core.client import WorkerClient

log = logging.getLogger(__name__)


class WorkerHandle(QObject):
    sig_state = Signal(str)
    """The worker's state changed: starting, ready, running, closed."""
    sig_devices = Signal(list)
    """The worker reported the devices it can use (list of dicts with id, name, kind)."""
    sig_started = Signal(int)
    """A run started in the worker (run id)."""
    sig_output = Signal(str)
    """The script printed text."""
    sig_progress = Signal(dict)
    """A backward call started or finished (index, api, line, nodes)."""
    sig_finished = Signal(object)
    """A run finished: a core.client.RunResult with the trace (or only an error)."""
    sig_step_begin = Signal(object)
    """A stepped backward call was reached (with its graph, structure hash and leaf digest): the
    engine will pause before its first node."""
    sig_step_paused = Signal(object)
    """The engine is paused before a node (``pending``: node, name, grad_outputs)."""
    sig_step = Signal(object)
    """A node finished executing (``record``: node, name, grad_outputs, grad_inputs, leaf_grads, error)."""
    sig_steps = Signal(object)
    """Nodes that finished while backward ran on: a dict with ``call`` and ``records``."""
    sig_step_end = Signal(dict)
    """The stepped backward ended: state finished, stopped or failed, with the error."""
    sig_memory = Signal(list)
    """A batch of memory samples (dicts: t, device, allocated, reserved, rss, saved_bytes, phase)."""
    sig_step_memory = Signal(dict)
    """Memory right after a stepped node ran (t, saved_bytes, allocated)."""
    sig_transfer = Signal(dict)
    """Bytes of a compressed trace received from a remote worker (received, decoded, raw)."""
    sig_rank_trace = Signal(object)
    """A DDP run's trace of a rank other than the picked one (``rank``, ``nproc``, ``trace``, ``run``)."""
    sig_event = Signal(object)
    """Any worker message, as received (internal: carried to the GUI thread). An object, not a
    dict signal: Qt would convert it to a QVariantMap, which cannot hold integers past 2**63
    (a captured graph's ``ignore_index`` of -100 is saved as 2**64 - 100)."""

    def __init__(self, parent=None, prestart: bool = True):
        super().__init__(parent)
        self.sig_event.connect(self._dispatch)
        self.client = WorkerClient(self.sig_event.emit, prestart=prestart)
        self.client.expand_steps = False  # one Qt event per batch, not per node
        self.local = self.client  # the local worker; ``client`` is the one serving the current run
        self.hosts = None  # app.host_devices.HostWorkers: runs on "HOST::DEVICE" go to that host
        self.current_run: int | None = None

    # -- commands --------------------------------------------------------------------------------
    def run(self, path: str, device: str = "cpu", mode: str = "auto", timeout: float = 600.0,
            step: dict | None = None, debug: dict | None = None, seeds: dict | None = None,
            load: dict | None = None, ddp: dict | None = None) -> int:
        """Start a run (a debug run with ``debug``; reseeded with ``seeds``; ``load``: how to open
        the file, see core.programs); returns its id.

        A device ``HOST::DEVICE`` runs on that saved host's worker (app.host_devices)."""
        from app.host_devices import split_device

        host, device = split_device(device)
        client = self.hosts.client_for(host) if host and self.hosts is not None else None
        if client is not self.client and self.client.running:
            self.client.cancel()
        self.client = client or self.local
        self.current_run = self.client.run(path, device=device, mode=mode, timeout=timeout, step=step,
                                           debug=debug, seeds=seeds, load=load, ddp=ddp)
        return self.current_run

    def control(self, cmd: str, **args) -> bool:
        """A stepping or debug command for the running worker (``core.protocol.STEP_COMMANDS``,
        ``breakpoints``)."""
        return self.client.control(cmd, **args)

    def cancel(self) -> None:
        self.client.cancel()

    def close(self) -> None:
        self.local.close()
        if self.hosts is not None:
            self.hosts.close()

    @property
    def running(self) -> bool:
        return self.client.running

    @property
    def devices(self) -> list[dict]:
        return self.client.devices

    # -- messages, on the GUI thread --------------------------------------------------------------
    def _dispatch(self, event: dict) -> None:
        handler = getattr(self, f"_handle_{event.get('type')}", None)
        if handler is not None:
            handler(event)

    def _handle_state(self, event: dict) -> None:
        self.sig_state.emit(event["state"])

    def _handle_hello(self, event: dict) -> None:
        self.sig_devices.emit(event.get("devices", []))

    def _handle_started(self, event: dict) -> None:
        self.sig_started.emit(int(event.get("run", 0)))

    def _handle_output(self, event: dict) -> None:
        self.sig_output.emit(event.get("text", ""))

    def _handle_call(self, event: dict) -> None:
        self.sig_progress.emit(event)

    def _handle_call_done(self, event: dict) -> None:
        self.sig_progress.emit(event)

    def _handle_step_begin(self, event: dict) -> None:
        self.sig_step_begin.emit(event)

    def _handle_step_paused(self, event: dict) -> None:
        self.sig_step_paused.emit(event)

    def _handle_step(self, event: dict) -> None:
        self.sig_step.emit(event)

    def _handle_steps(self, event: dict) -> None:
        self.sig_steps.emit(event)

    def _handle_step_end(self, event: dict) -> None:
        self.sig_step_end.emit(event)

    def _handle_memory(self, event: dict) -> None:
        self.sig_memory.emit(event.get("samples", []))

    def _handle_step_memory(self, event: dict) -> None:
        self.sig_step_memory.emit(event)

    def _handle_transfer(self, event: dict) -> None:
        self.sig_transfer.emit(event)

    def _handle_rank_trace(self, event: dict) -> None:
        self.sig_rank_trace.emit(event)

    def _handle_finished(self, event: dict) -> None:
        if event.get("run") == self.current_run:
            self.current_run = None
        self.sig_finished.emit(event["result"])
