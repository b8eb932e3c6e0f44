"""The GUI's handle on the worker: ``core.client.handle.WorkerClient`` events as Qt signals.

The client reads worker messages on background threads and types them (``core.protocol.messages``
dataclasses); each is re-emitted here as a signal, which Qt queues onto the GUI thread
(qtconsole's pattern). A table maps each message kind to its signal; the signals carry the
dataclasses (or the one field that matters), and readers use their attributes.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal

from core.protocol import events
from core.protocol import messages as protocol
from app.session.host_devices import split_device
from core.client.handle import WorkerClient

log = logging.getLogger(__name__)


class WorkerHandle(QObject):
    sig_state = Signal(object)
    """The worker's state changed: a core.client.handle.ClientState (starting, ready, running, closed)."""
    sig_devices = Signal(list)
    """The worker reported the devices it can use (list of dicts with id, name, kind)."""
    sig_started = Signal(int)
    """A run started in the worker (run id)."""
    sig_output = Signal(str)
    """The script printed text."""
    sig_progress = Signal(object)
    """A backward call started or finished (a protocol.CallStarted or CallDone)."""
    sig_finished = Signal(object)
    """A run finished: a core.client.handle.RunResult with the trace (or only an error)."""
    sig_step_begin = Signal(object)
    """A stepped backward call was reached (a protocol.StepBegin: its graph, structure hash and leaf
    digest): the engine will pause before its first node."""
    sig_step_paused = Signal(object)
    """The engine is paused before a node (a protocol.StepPaused; ``pending``: node, name, grad_outputs)."""
    sig_step = Signal(object)
    """A node finished executing (a protocol.Step; ``record``: node, name, grad_outputs, grad_inputs,
    leaf_grads, error)."""
    sig_steps = Signal(object)
    """Nodes that finished while backward ran on (a protocol.Steps: ``call`` and ``records``)."""
    sig_step_end = Signal(object)
    """The stepped backward ended (a protocol.StepEnd: state finished, stopped or failed, with the error)."""
    sig_forward_paused = Signal(object)
    """A debug run paused in forward before a line (a protocol.ForwardPaused: line, file, stack, reason,
    the live graph and the ids of the nodes made since the previous pause)."""
    sig_memory = Signal(list)
    """A batch of memory samples (dicts: t, device, allocated, reserved, rss, saved_bytes, phase)."""
    sig_step_memory = Signal(object)
    """Memory right after a stepped node ran (a protocol.StepMemory: t, saved_bytes, allocated)."""
    sig_transfer = Signal(object)
    """Bytes of a compressed trace received from a remote worker, or of a model file sent to it (a
    events.Transfer)."""
    sig_bad_message = Signal(str)
    """The worker sent a message that does not match the protocol: what is wrong, naming the field."""
    sig_rank_trace = Signal(object)
    """A DDP run's trace of a rank other than the picked one (a protocol.RankTrace: ``rank``, ``nproc``,
    ``trace``, ``run``)."""
    sig_event = Signal(object)
    """Any worker message or client event, a core.protocol.messages dataclass (internal: carried to the GUI
    thread)."""

    def __init__(self, parent=None, prestart: bool = True):
        super().__init__(parent)
        self.sig_event.connect(self._dispatch)
        self.client = WorkerClient(self.sig_event.emit, prestart=prestart)
        self.client.expand_steps = False  # one Qt event per batch, not per node
        self.local = self.client  # the local worker; ``client`` is the one serving the current run
        self.hosts = None  # app.session.host_devices.HostWorkers: runs on "HOST::DEVICE" go to that host
        self.current_run: int | None = None
        self.host: str | None = None  # the saved host the current run went to (None: this machine)

    # -- commands --------------------------------------------------------------------------------
    def run(self, path: str, device: str = "cpu", mode: str = "auto", timeout: float = 600.0,
            step: dict | None = None, debug: dict | None = None, seeds: dict | None = None,
            load: dict | None = None, ddp: dict | None = None, nan_check: bool = False) -> int:
        """Start a run (a debug run with ``debug``; reseeded with ``seeds``; ``load``: how to open
        the file, see core.programs.program; ``nan_check``: name the first NaN/Inf, ``Trace.nan_check``);
        returns its id.

        A device ``HOST::DEVICE`` runs on that saved host's worker (app.session.host_devices)."""
        host, device = split_device(device)
        client = self.hosts.client_for(host) if host and self.hosts is not None else None
        if client is not self.client and self.client.running:
            self.client.cancel()
        self.client = client or self.local
        self.host = host if client is not None else None
        self.current_run = self.client.run(path, device=device, mode=mode, timeout=timeout, step=step,
                                           debug=debug, seeds=seeds, load=load, ddp=ddp, nan_check=nan_check)
        return self.current_run

    def control(self, cmd: str, **args) -> bool:
        """A stepping or debug command for the running worker (``core.protocol.messages.STEP_COMMANDS``,
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
    # Message kind -> (signal, what it carries: the message itself when None, else that of it).
    _ROUTES = {
        "state": ("sig_state", lambda e: e.state),
        "hello": ("sig_devices", lambda e: list(e.devices)),
        "started": ("sig_started", lambda e: int(e.run or 0)),
        "output": ("sig_output", lambda e: e.text),
        "call": ("sig_progress", None),
        "call_done": ("sig_progress", None),
        "step_begin": ("sig_step_begin", None),
        "step_paused": ("sig_step_paused", None),
        "step": ("sig_step", None),
        "steps": ("sig_steps", None),
        "step_end": ("sig_step_end", None),
        "forward_paused": ("sig_forward_paused", None),
        "memory": ("sig_memory", lambda e: list(e.samples)),
        "step_memory": ("sig_step_memory", None),
        "transfer": ("sig_transfer", None),
        "bad_message": ("sig_bad_message", lambda e: e.error),
        "rank_trace": ("sig_rank_trace", None),
    }

    def _dispatch(self, event: protocol._Base) -> None:
        if isinstance(event, events.Finished):
            if event.run == self.current_run:
                self.current_run = None
            self.sig_finished.emit(event.result)
            return
        route = self._ROUTES.get(event.kind)
        if route is not None:
            signal, carried = route
            getattr(self, signal).emit(event if carried is None else carried(event))
