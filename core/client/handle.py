"""The parent's handle on its workers (Qt-free: the GUI wraps it, the CLI uses it as is).

``WorkerClient`` runs each script in a fresh worker process (``core.client.process``); to hide
torch's import time a spare worker is started ahead and takes the next run. Every message
and event reaches ``on_event`` as a ``core.protocol.messages`` dataclass; a dead worker ends its run
with an error built by ``core.client.run_errors`` (exit code or signal, faulthandler text, the
script line found in it).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Callable

from core.client.launchers import launcher_error, run_payload, send_run_files, start_failure
from core.client.process import WorkerProcess, typed
from core.client.run_errors import STOPPED, _source, death_error, summary_dict
from core.model.trace import CallInfo, ErrorInfo, Trace, TraceFormatError
from core.model.trace_json import call_from_dict, trace_from_dict
from core.protocol import events
from core.protocol import messages as protocol
from core.protocol.step_pack import unpack_steps
from core.protocol.wire import ENCODINGS, RAW

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 600.0
STOP_GRACE = 1.0  # seconds a script gets to stop on KeyboardInterrupt before its worker is killed
# How long a run waits for its worker's hello: its time limit and this much more (torch's import
# on a loaded machine), then it ends; a run without a limit (stepping, debugging) is sent after
# HELLO_WAIT whatever came (a Slurm job may still be queued).
HELLO_GRACE = 10.0
HELLO_WAIT = 120.0
# After the app kills a run's worker, how long its exit may take to be reported before the run
# is ended without it (a reader that is stuck must not keep a run "running" past its limit).
KILL_GRACE = 8.0


def _daemon_timer(seconds: float, fn, *args) -> threading.Timer:
    """A timer that never keeps the process alive at exit."""
    timer = threading.Timer(seconds, fn, args=args)
    timer.daemon = True
    timer.start()
    return timer


class ClientState(str, Enum):
    """Where a ``WorkerClient`` is (its ``state``, handed on in ``State`` events)."""

    STARTING = "starting"  # no worker ready yet
    READY = "ready"  # a worker waits for the next run
    RUNNING = "running"  # a run is under way
    CLOSED = "closed"  # every worker ended; no run starts any more

    def __str__(self) -> str:
        return self.value


class RunResult:
    """What a finished run produced: the trace (possibly only an error) and the output."""

    def __init__(self, trace: Trace, output: str, output_bytes: int, elapsed: float, run_id: int = 0,
                 bad_messages: list[str] | None = None):
        self.run_id = run_id
        self.bad_messages = list(bad_messages or [])  # worker messages that did not match the protocol
        self.trace = trace
        self.output = output
        self.output_bytes = output_bytes
        self.elapsed = elapsed


class WorkerClient:
    """Runs scripts in worker processes and reports every event to ``on_event``.

    States: a ``ClientState`` (``starting``: no worker ready yet, ``ready``, ``running``, ``closed``).
    Events are ``core.protocol.messages`` dataclasses: the worker's messages (``Hello``, ``CallStarted``,
    ``StepBegin``...) and the client's own (``State``, ``Output``, ``Finished`` with a RunResult,
    ``BadMessage`` for a message that did not match the protocol). ``on_event`` is called on
    background threads.
    """

    def __init__(self, on_event: Callable[[protocol._Base], None] | None = None, python: str | None = None,
                 prestart: bool = True, launcher=None):
        self.on_event = on_event or (lambda e: None)
        self.python = python
        self.launcher = launcher  # a core.client.launchers.Launcher, or None for a local worker
        self.prestart = prestart
        self.memory_rate = 50.0  # memory samples per second in the worker; 0 turns sampling off
        self.expand_steps = True  # hand each batched ``steps`` message on as one ``step`` event per node
        self.state = ClientState.STARTING
        self.devices: list[dict] = [{"id": "cpu", "name": "CPU", "kind": "cpu"}]
        self.torch_version = ""
        self._spare: WorkerProcess | None = None
        self._active: WorkerProcess | None = None
        self._run: dict | None = None
        self._lock = threading.RLock()
        self._run_ids = itertools.count(1)
        self._retired: list[threading.Thread] = []  # threads closing workers that served their run
        if prestart:
            self._spare = self._new_worker()

    # -- public --------------------------------------------------------------------------------
    def run(self, path: str, device: str = "cpu", mode: str = "auto", timeout: float = DEFAULT_TIMEOUT,
            step: dict | None = None, debug: dict | None = None, seeds: dict | None = None,
            load: dict | None = None, ddp: dict | None = None, nan_check: bool = False) -> int:
        """Start running ``path``; returns the run id. A run in progress is cancelled first.

        ``step`` (``{"call": N, "mode": "interactive" | "all"}``) runs backward call N under the
        stepper; ``debug`` (``{"lines": [...], "pause_all": bool, "skip_to": N}``) makes a debug
        run that pauses at each call a breakpoint selects; drive both with ``control()``. Stepping
        and debug runs have no time limit: the user sets the pace. ``seeds`` reseeds the run.
        ``nan_check`` names the first op and node that made a NaN or an infinity (``Trace.nan_check``).
        """
        with self._lock:
            old, self._run = self._run, None
        if old is not None:
            # Killed and reported outside the lock: the reader thread that sees the worker exit
            # needs the lock, and waiting for it while holding the lock froze the caller for 5 s.
            self._finish_dead_run(run=old, reason="the run was cancelled: a new run started")
        with self._lock:
            worker, self._spare = self._spare, None
            if worker is not None and not worker.alive:
                # The spare died while it waited (a connection that dropped, the out-of-memory
                # killer): its exit reached no run. This run gets a fresh worker, not a dead one.
                self._retire(worker)
                worker = None
            worker = worker or self._new_worker()
            run_id = next(self._run_ids)
            self._active = worker
            self._run = {"id": run_id, "path": str(path), "device": device, "start": time.monotonic(),
                         "worker": worker, "timeout": timeout, "done": False, "step": step, "debug": debug}
            self._set_state(ClientState.RUNNING)
        extra = {"debug": debug, "seeds": seeds, "load": load, "ddp": ddp, "nan_check": nan_check}
        threading.Thread(target=self._launch, args=(worker, run_id, path, device, mode, timeout, step, extra),
                         name=f"run-{run_id}", daemon=True).start()
        return run_id

    def control(self, cmd: str, **args) -> bool:
        """Send a stepping or debug command to the running worker (``core.protocol.messages.STEP_COMMANDS``
        and ``breakpoints``); False when no run is in progress."""
        with self._lock:
            run = self._run
        if run is None:
            return False
        command = protocol.COMMANDS[cmd](**args)  # a KeyError / TypeError names a command that does not exist
        return run["worker"].send(command.to_dict())

    def cancel(self) -> None:
        """Stop the current run: interrupt the script, and kill the worker if it does not stop."""
        with self._lock:
            run = self._run
        if run is None:
            return
        worker = run["worker"]
        worker.send(protocol.Cancel().to_dict())
        self._timer(run, STOP_GRACE, self._stop_hard, run["id"])

    def _stop_hard(self, run_id: int) -> None:
        """The script did not stop on KeyboardInterrupt: dump its stacks (for the line), then kill it."""
        with self._lock:
            run = self._run
        if run is None or run["id"] != run_id:
            return
        run["worker"].dump_and_wait()
        self._kill_if_running(run_id, STOPPED)

    def close(self) -> None:
        """End every worker this client started and wait for them (no process or temp file is left)."""
        with self._lock:
            workers = [w for w in (self._spare, self._active) if w is not None]
            retired, self._retired = self._retired, []
            run, self._run = self._run, None
            self._spare = self._active = None
            self._set_state(ClientState.CLOSED)
        if run is not None:
            self._cancel_timers(run)
        for t in retired:
            t.join(timeout=10)
        for w in workers:
            w.close()

    @property
    def running(self) -> bool:
        return self._run is not None

    # -- internals ---------------------------------------------------------------------------
    def _new_worker(self) -> WorkerProcess:
        holder: dict = {}

        def on_message(msg: protocol._Base) -> None:
            self._on_worker_message(holder["w"], msg)

        w = WorkerProcess(on_message, python=self.python, launcher=self.launcher)
        holder["w"] = w
        w.start()
        return w

    def _set_state(self, state: ClientState) -> None:
        self.state = state
        self.on_event(events.State(state=state))

    def _launch(self, worker: WorkerProcess, run_id: int, path: str, device: str, mode: str, timeout: float,
                step: dict | None = None, extra: dict | None = None):
        extra = extra or {}
        limited = bool(timeout) and extra.get("debug") is None and not step
        limit = timeout + HELLO_GRACE if limited else HELLO_WAIT
        said_hello = worker.ready.wait(timeout=limit)
        with self._lock:
            if self._run is None or self._run["id"] != run_id:
                return
            run = self._run
        if not said_hello and limited:  # a worker that never came up: not a run that passed its time limit
            run["no_hello"] = limit
            self._kill_if_running(run_id, "")
            return
        cmd = protocol.Run(run=run_id, path=str(Path(path).resolve()), device=device, mode=mode, step=step,
                           debug=extra.get("debug"), seeds=extra.get("seeds"), memory_rate=self.memory_rate,
                           load=extra.get("load"))
        if extra.get("ddp"):
            cmd.extra["ddp"] = extra["ddp"]
        if extra.get("nan_check"):
            cmd.extra["nan_check"] = True
        if self.launcher is None:  # traces in columns, uncompressed, through the local pipe
            cmd.extra.update({"compress": RAW, "encodings": ENCODINGS})
        else:
            try:
                cmd.extra.update(run_payload(self.launcher, path, extra.get("load")))
            except (OSError, ValueError) as exc:
                err = ErrorInfo(type=type(exc).__name__, message=str(exc), kind="load", file=str(path))
                self._complete(run, Trace(calls=[], error=err, script=str(path), device=device), "", 0)
                threading.Thread(target=worker.close, daemon=True).start()
                return
            # A saved model, its weights, a model folder: sent as files before the run (core.protocol.uploads).
            files = cmd.extra.pop("_files", None)
            if files and not send_run_files(worker, files, lambda e: self.on_event(typed(e)), lambda: self._run is run):
                return  # replaced meanwhile, or the worker is gone (its exit reports why)
        if not worker.send(cmd.to_dict()):
            if worker.finished.is_set():  # its exit came before the run was its own: report it here
                self._finish_dead_run(run=run)
            return  # otherwise the exit message reports the death
        if self.prestart:
            with self._lock:
                if self._spare is None and self.state is not ClientState.CLOSED:
                    self._spare = self._new_worker()
        if timeout and extra.get("debug") is None and not (step and step.get("mode") != "all"):
            with self._lock:
                run = self._run
            if run is not None and run["id"] == run_id:
                self._timer(run, timeout, self._timed_out, run_id, timeout)

    def _timer(self, run: dict, seconds: float, fn, *args) -> None:
        """A timer owned by ``run``: cancelled when the run completes, so none piles up."""
        timer = _daemon_timer(seconds, fn, *args)
        run.setdefault("timers", []).append(timer)

    @staticmethod
    def _cancel_timers(run: dict) -> None:
        for timer in run.get("timers", ()):
            timer.cancel()

    def _timed_out(self, run_id: int, timeout: float) -> None:
        with self._lock:
            run = self._run
        if run is None or run["id"] != run_id:
            return
        run["worker"].dump_and_wait()
        self._kill_if_running(run_id, f"the run passed its time limit of {timeout:g} s")

    def _kill_if_running(self, run_id: int, reason: str) -> None:
        with self._lock:
            run = self._run
            if run is None or run["id"] != run_id:
                return
            run["reason"] = reason
        run["worker"].kill()
        # Its exit ends the run; should it not be reported, the run ends anyway.
        self._timer(run, KILL_GRACE, self._finish_dead_run, None, run)

    def _on_worker_message(self, worker: WorkerProcess, msg: protocol._Base) -> None:
        if isinstance(msg, protocol.Hello):
            self.devices = msg.devices or self.devices
            self.torch_version = msg.torch
            with self._lock:
                if self.state is ClientState.STARTING:
                    self._set_state(ClientState.READY)
            self.on_event(msg)
            return
        with self._lock:
            run = self._run
            current = run is not None and run["worker"] is worker
        if not current:
            if isinstance(msg, events.Exit) and self.launcher is not None and worker.hello is None:
                with worker._lock:
                    said = worker.output_tail.decode("utf-8", errors="replace")
                why = worker.refused or start_failure(self.launcher, msg.code or 0, said)
                self.on_event(events.SpareFailed(message=why))
            return  # a spare's exit, or an old worker's last words
        if isinstance(msg, protocol.CallTrace):  # kept for the result; not passed on (a big graph)
            run.setdefault("calls", {})[msg.position] = msg.call
            return
        if isinstance(msg, protocol.CallSummary):
            call = run.get("calls", {}).get(msg.position)
            if isinstance(call, (dict, CallInfo)):  # a CallInfo when sent in columns
                run["calls"][msg.position] = summary_dict(call)
            return
        if isinstance(msg, events.BadMessage):
            run.setdefault("bad_messages", []).append(msg.error)
        if isinstance(msg, protocol.Steps):  # previews sent once per batch (core.protocol.step_pack)
            unpack_steps({"records": msg.records, "previews": msg.extra.pop("previews", None)})
        if isinstance(msg, protocol.Steps) and self.expand_steps:
            for record in msg.records:
                self.on_event(protocol.Step(call=msg.call, record=record, extra=dict(msg.extra)))
        elif isinstance(msg, protocol.TraceDone):
            self._finish_with_trace(worker, run, msg)
        elif isinstance(msg, events.Exit):
            self._finish_dead_run(code=msg.code, run=run)
        else:
            self.on_event(msg)

    def _finish_with_trace(self, worker: WorkerProcess, run: dict, msg: protocol.TraceDone) -> None:
        try:
            trace = trace_from_dict(msg.trace)
            streamed = self._streamed_calls(run, msg.streamed)
            if streamed:
                trace = replace(trace, calls=streamed + list(trace.calls))
        except TraceFormatError as exc:
            trace = Trace(calls=[], error=ErrorInfo(type="TraceFormatError", message=str(exc), kind="load"))
        worker.drain_output()  # what the script printed last travels on another pipe than the trace
        with worker._lock:
            output = worker.output_tail.decode("utf-8", errors="replace")
        self._retire(worker)  # it has served its run
        self._complete(run, trace, output, worker.output_bytes)

    def _retire(self, worker: WorkerProcess) -> None:
        """Close ``worker`` off the caller's thread; ``close()`` waits for it."""
        closer = threading.Thread(target=worker.close, name=f"close-worker-{worker.id}", daemon=True)
        closer.start()
        with self._lock:
            self._retired = [t for t in self._retired if t.is_alive()] + [closer]

    @staticmethod
    def _streamed_calls(run: dict, before: int | None = None) -> list:
        """The calls the worker streamed as it captured them, in order (unreadable ones skipped);
        ``before``: only those before this position (the trace brings the rest, a loop's last call
        in full where it was streamed as its summary)."""
        calls = []
        for position in sorted(run.get("calls", {})):
            if before is not None and position >= before:
                break
            try:
                calls.append(call_from_dict(run["calls"][position], f"call {position}"))
            except TraceFormatError as exc:
                log.warning("a streamed call could not be read: %s", exc)
        return calls

    def _finish_dead_run(self, code: int | None = None, run: dict | None = None, reason: str = "") -> None:
        with self._lock:
            run = run or self._run
            if run is None or run.get("done"):
                return
        worker: WorkerProcess = run["worker"]
        if code is None:
            worker.kill()
            worker.finished.wait(timeout=5)
            code = worker.proc.returncode if worker.proc is not None else -9
        reason = reason or run.get("reason", "")
        if run.get("bad_messages") and not reason:
            # The worker's last messages did not match the protocol: say which field.
            reason = "the worker sent a message the app cannot read (" + "; ".join(run["bad_messages"][-3:]) + ")"
        if run.get("no_hello") and worker.hello is None:
            err = ErrorInfo(type="WorkerNotStarted", message=_no_hello(worker, run["no_hello"]), kind="load",
                            file=run["path"])
        elif worker.stream_error and not reason:
            err = replace(death_error(code if code is not None else -9, worker.fault_text(), None, run["path"],
                                      worker.stream_error), type="ChannelError", kind="disconnected")
        elif worker.launcher is not None:
            err = launcher_error(worker, code, run["path"], reason)
        elif worker.refused and not reason:
            err = ErrorInfo(type="ProtocolError", message=worker.refused, kind="load", file=run["path"])
        else:
            err = death_error(code if code is not None else -9, worker.fault_text(), worker.exiting, run["path"],
                              reason)
        if worker.cut_off:  # the stream ended in the middle of a message: say which, and that it is lost
            err = replace(err, message=f"{err.message}; {worker.cut_off}")
        calls = self._streamed_calls(run)
        trace = Trace(calls=calls, error=err, script=run["path"], device=run["device"], source=_source(run["path"]),
                      call_count=max([c.index + 1 for c in calls], default=0))
        worker.cleanup()
        with worker._lock:
            output = worker.output_tail.decode("utf-8", errors="replace")
        self._complete(run, trace, output, worker.output_bytes)

    def _complete(self, run: dict, trace: Trace, output: str, output_bytes: int) -> None:
        with self._lock:
            if run.get("done"):
                return
            run["done"] = True
            self._cancel_timers(run)
            if self._run is run:
                self._run = None
                self._active = None
            elapsed = time.monotonic() - run["start"]
            if self.state is not ClientState.CLOSED and self._run is None:
                self._set_state(ClientState.READY)
        trace = replace(trace, output=output)
        bad = list(run.get("bad_messages") or ())
        check = run["worker"].check
        if check is not None and check.summary():  # messages a script wrote on the worker's channel
            bad.append(check.summary())
        result = RunResult(trace, output, output_bytes, elapsed, run["id"], bad)
        self.on_event(events.Finished(run=run["id"], result=result))


def _no_hello(worker: WorkerProcess, limit: float) -> str:
    """Why a run's worker is not there: it never said hello."""
    with worker._lock:
        said = worker.output_tail.decode("utf-8", errors="replace").strip().splitlines()
    last = f"; its last words: {said[-1].strip()}" if said else ""
    if worker.launcher is not None:
        return (f"the worker on {worker.launcher.name} never started: nothing said hello within {limit:g} s of "
                f"the run's start (the command {worker.launcher.describe()} ran, but does it start "
                f"'python -m core.worker'?){last}")
    return (f"the worker never started: it did not say hello within {limit:g} s (its Python, or torch's "
            f"import, hung or is too slow here){last}")


def run_capture(path: str, device: str = "cpu", mode: str = "auto", timeout: float = DEFAULT_TIMEOUT,
                on_event: Callable[[protocol._Base], None] | None = None, step: dict | None = None,
                seeds: dict | None = None, load: dict | None = None, launcher=None,
                ddp: dict | None = None, memory_rate: float | None = None, nan_check: bool = False) -> RunResult:
    """Run one script in a fresh worker and wait for its result (the CLI and tests use this).
    ``memory_rate`` sets the memory samples per second (0: none, when nothing shows them)."""
    with capture_run(path, memory_rate=memory_rate, launcher=launcher, device=device, mode=mode,
                     timeout=timeout, on_event=on_event, step=step, seeds=seeds, load=load,
                     ddp=ddp, nan_check=nan_check) as result:
        return result


@contextmanager
def capture_run(path: str, memory_rate: float | None = None, launcher=None, **run_args):
    """``run_capture`` for a caller with more to do with the result: it is handed over as soon as
    the trace has arrived, and the worker, which exits meanwhile, is waited for when the block
    ends (the headless export renders while the worker's process goes away)."""
    done = threading.Event()
    box: dict = {}
    on_event = run_args.pop("on_event", None)

    def handle(event: protocol._Base) -> None:
        if on_event is not None:
            on_event(event)
        if isinstance(event, events.Finished):
            box["result"] = event.result
            done.set()

    client = WorkerClient(handle, prestart=False, launcher=launcher)
    if memory_rate is not None:
        client.memory_rate = memory_rate
    try:
        client.run(path, **run_args)
        done.wait()
        yield box["result"]
    finally:
        client.close()


class CheckFailed(RuntimeError):
    """A worker that did not come up when checked: why, in words."""


CHECK_TIMEOUT = 30.0  # seconds a checked worker has to say hello (ssh, then Python and torch importing)


def check_worker(launcher, timeout: float = CHECK_TIMEOUT) -> protocol.Hello:
    """Start one worker behind ``launcher``, wait for its hello and end it: what the worker said
    of itself (its machine, Python, torch, protocol version, codecs, devices). CheckFailed says
    why it did not come up: the launcher's last words (ssh refused, no such command), another
    protocol version, or no hello within ``timeout`` seconds. Nothing is left running either way."""
    answer = threading.Event()
    box: list = []

    def on_event(event: protocol._Base) -> None:
        if isinstance(event, (protocol.Hello, events.Refused, events.SpareFailed)) and not box:
            box.append(event)
            answer.set()

    client = WorkerClient(on_event, prestart=True, launcher=launcher)
    try:
        if not answer.wait(timeout):
            raise CheckFailed(f"no answer from the worker within {timeout:g} s (is the host reachable, "
                              f"and does the command start 'python -m core.worker'?)")
    finally:
        client.close()
    event = box[0]
    if not isinstance(event, protocol.Hello):
        raise CheckFailed(event.message)
    return event
