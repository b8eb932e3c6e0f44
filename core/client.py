"""The parent's handle on a worker process (Qt-free: the GUI wraps it, the CLI uses it as is).

A worker serves one run: each run gets a fresh interpreter, so a script that patches
torch, leaks memory or crashes cannot affect the next one. To hide torch's import time a
spare worker is started ahead and takes the next run. Messages are read on background
threads and handed to ``on_message``; a dead worker becomes one ``died`` message with the
exit code or signal, the faulthandler text and the script line found in it.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
from pathlib import Path
from typing import Callable

from dataclasses import replace

from core import protocol
from core.step_pack import unpack_steps
from core.trace import CallInfo, ErrorInfo, Trace, TraceFormatError, call_from_dict, paused_gc, with_fields

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_TAIL = 64 * 1024
DEFAULT_TIMEOUT = 600.0
STOPPED = "stopped by you"
STOP_GRACE = 1.0  # seconds a script gets to stop on KeyboardInterrupt before its worker is killed


class WorkerProcess:
    """One worker interpreter, in its own session and process group, and the threads that read its pipes.

    The worker's children (a ``multiprocessing`` pool, a ``subprocess``) share its process
    group: killing and closing signal the whole group (as Jupyter does with kernels), so no
    child outlives the run and no inherited pipe keeps a reader waiting. The fault file is
    made by ``tempfile`` (0600, exclusive create) and removed with ``cleanup()``.
    """

    _ids = itertools.count()

    def __init__(self, on_message: Callable[[dict], None], python: str | None = None, launcher=None):
        self.on_message = on_message
        self.launcher = launcher  # a core.launchers.Launcher: the worker runs behind that command
        self.python = python or sys.executable
        self.id = next(self._ids)
        # A worker behind a launcher cannot write our files: its stacks come back as messages.
        self.fault_path = _private_temp("fault", ".txt") if launcher is None else None
        self.fallback_path = _private_temp("result", ".jsonl") if launcher is None else None
        self.refused = ""  # why the worker's hello was refused (another protocol version)
        self.remote_fault = ""  # stacks a remote worker sent back in answer to ``dump``
        self.placed = ("", "")  # (path on the worker's host, the app's path) of a travelling script
        self.proc: subprocess.Popen | None = None
        self.hello: dict | None = None
        self.ready = threading.Event()
        self.output_tail = bytearray()
        self.output_bytes = 0
        self.exiting: dict | None = None
        self._lock = threading.Lock()
        self.finished = threading.Event()
        self._output_done = threading.Event()
        self._exited = threading.Event()
        self._fault_cache: str | None = None

    def start(self) -> None:
        env = dict(os.environ)
        # The worker restores the user's PYTHONPATH before the script runs (its children inherit it).
        env["BACKPROP_STUDIO_PYTHONPATH"] = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"
        cmd = [self.python, "-m", "core.worker"]
        if self.fault_path:
            cmd += ["--fault-file", str(self.fault_path)]
        if self.fallback_path:
            cmd += ["--fallback-file", str(self.fallback_path)]
        if self.launcher is not None:
            from core.launchers import missing_command

            cmd = list(self.launcher.argv)
            env.update(self.launcher.env)
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=str(ROOT),
                env=env,
                start_new_session=hasattr(os, "killpg"),
            )
        except OSError as exc:
            if self.launcher is None:
                raise
            # ssh / docker / kubectl not installed: reported like any worker that did not start.
            self.proc = subprocess.Popen(missing_command(self.launcher, exc), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        threading.Thread(target=self._wait, name=f"worker-{self.id}-wait", daemon=True).start()
        threading.Thread(target=self._read_protocol, name=f"worker-{self.id}-proto", daemon=True).start()
        threading.Thread(target=self._read_output, name=f"worker-{self.id}-output", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, msg: dict) -> bool:
        if not self.alive:
            return False
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def dump_stacks(self, signal_too: bool = True) -> None:
        """Ask faulthandler in the worker to write every thread's stack to the fault file.

        Two ways, so a script that ignores SIGUSR1 (or holds the GIL in C) is still named:
        a command read on the worker's command thread, and the signal.
        """
        self.send(protocol.Dump().to_dict())
        if signal_too:
            self._signal_dump()

    def _signal_dump(self) -> None:
        if self.alive and hasattr(signal, "SIGUSR1"):
            try:
                self.proc.send_signal(signal.SIGUSR1)
            except OSError:
                pass

    def dump_and_wait(self, limit: float = 2.0) -> None:
        """Ask for a stack dump and wait (up to ``limit`` s) until the fault file stops growing.

        The command goes first and the signal only if no dump came of it: two dumps written at
        once interleave their lines in the file, and the script's line could not be read back.
        """
        if self.launcher is not None:  # signals do not cross ssh: the stacks come back as a message
            self.send(protocol.Dump().to_dict())
            deadline = time.monotonic() + limit
            while not self.remote_fault and self.alive and time.monotonic() < deadline:
                time.sleep(0.05)
            return
        before = self._fault_size()
        self.dump_stacks(signal_too=False)
        first = min(0.6, limit / 2)
        if not self._wait_for_dump(before, first):
            self._signal_dump()
            self._wait_for_dump(before, limit - first)

    def _wait_for_dump(self, before: int, limit: float) -> bool:
        """Wait until the fault file has grown past ``before`` and stopped growing."""
        deadline = time.monotonic() + limit
        last, stable_since = self._fault_size(), None
        while time.monotonic() < deadline and self.alive:
            time.sleep(0.05)
            size = self._fault_size()
            if size > before and size == last:
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since >= 0.15:
                    return True
            else:
                stable_since = None
            last = size
        return False

    def _fault_size(self) -> int:
        try:
            return self.fault_path.stat().st_size if self.fault_path else 0
        except OSError:
            return 0

    def kill(self) -> None:
        """Kill the worker and every process in its group."""
        if self.proc is None:
            return
        if hasattr(os, "killpg"):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass

    def close(self, wait: float = 2.0) -> None:
        """Ask the worker to quit, then kill what is left of its group and remove its files."""
        if self.alive:
            self.send({"cmd": "quit"})
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.finished.wait(timeout=5)
            self._close_pipes()
        self.cleanup()

    def cleanup(self) -> None:
        """Remove the fault and fallback files (the fault text is kept in memory first)."""
        self.fault_text()
        for path in (self.fault_path, self.fallback_path):
            if path is not None:
                try:
                    path.unlink()
                except OSError:
                    pass

    def fault_text(self) -> str:
        if self.launcher is not None:
            from core.launchers import fault_in_output

            with self._lock:
                tail = self.output_tail.decode("utf-8", errors="replace")
            text = self.remote_fault or fault_in_output(tail)
            return text.replace(*self.placed) if self.placed[0] else text
        if self._fault_cache is not None:
            return self._fault_cache
        try:
            text = self.fault_path.read_text(encoding="utf-8", errors="replace") if self.fault_path else ""
        except OSError:
            text = ""
        if self.proc is not None and self.proc.poll() is not None:
            self._fault_cache = text
        return text

    def _wait(self) -> None:
        """When the worker exits, end its group: orphans would keep the pipes open."""
        assert self.proc is not None
        self.proc.wait()
        if hasattr(os, "killpg"):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        self._exited.set()

    def _chunks(self, fd: int):
        """Bytes read from ``fd`` until end of file, or until the worker has been gone a moment
        (a child that left the process group may still hold the pipe)."""
        gone_since = None
        while True:
            try:
                ready, _, _ = select.select([fd], [], [], 0.25)
            except (OSError, ValueError):
                return
            if not ready:
                if self._exited.is_set():
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > 1.0:
                        return
                continue
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError:
                return
            if not chunk:
                return
            yield chunk

    def _read_protocol(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        from core.launchers import transfer_progress
        from core.wire import StreamDecoder

        # Lines, and compressed frames from a worker behind a launcher (core.wire).
        decoder = StreamDecoder(self._handle_line, transfer_progress(self._deliver))
        for chunk in self._chunks(self.proc.stdout.fileno()):
            decoder.feed(chunk)
        decoder.close()
        self._exited.wait()
        code = self.proc.wait()
        # Messages the worker could not send on its channel (the script closed it).
        try:
            if self.fallback_path is not None:
                for raw in self.fallback_path.read_bytes().split(b"\n"):
                    self._handle_line(raw)
        except OSError:
            pass
        # Let the output reader drain what the worker printed last.
        drained = self._output_done.wait(timeout=2)
        self.ready.set()
        self._deliver({"type": "exit", "code": code})
        self.finished.set()
        # The worker is gone: its pipes are closed now rather than whenever the garbage collector
        # gets to them (hundreds of runs and stops would otherwise pile up open descriptors).
        self._close_pipes(stderr=drained)

    def _close_pipes(self, stderr: bool = True) -> None:
        if self.proc is None:
            return
        pipes = [self.proc.stdin, self.proc.stdout] + ([self.proc.stderr] if stderr else [])
        for pipe in pipes:
            try:
                if pipe is not None:
                    pipe.close()
            except (OSError, ValueError):
                pass

    def _handle_line(self, raw: bytes | dict) -> None:
        if isinstance(raw, dict):  # a message core.wire decoded already (a trace sent in columns)
            msg = raw
        elif not raw.strip():
            return
        else:
            try:
                if len(raw) > 1 << 20:  # a big trace: millions of small objects at once
                    with paused_gc():
                        msg = json.loads(raw)
                else:
                    msg = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                log.warning("worker %s sent a line that is not JSON", self.id)
                return
        if not isinstance(msg, dict):
            return
        kind = msg.get("type")
        if kind == "hello":
            from core.wire import ProtocolMismatch, check_hello

            try:
                check_hello(msg, f"the worker on {self.launcher.name}" if self.launcher else "the worker")
            except ProtocolMismatch as exc:
                self.refused = str(exc)
                self._deliver({"type": "refused", "message": self.refused})
                self.kill()
                return
            self.hello = msg
            self.ready.set()
        elif kind == "fault":
            self.remote_fault = msg.get("text", "")
            return
        elif kind == "placed":  # where the travelling script was written on the worker's host
            self.placed = (msg.get("path", ""), msg.get("local", ""))
        elif kind == "exiting":
            self.exiting = msg
        self._deliver(msg)

    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for chunk in self._chunks(self.proc.stderr.fileno()):
            with self._lock:
                self.output_bytes += len(chunk)
                self.output_tail += chunk
                if len(self.output_tail) > OUTPUT_TAIL:
                    del self.output_tail[: len(self.output_tail) - OUTPUT_TAIL]
            self._deliver({"type": "output", "text": chunk.decode("utf-8", errors="replace")})
        self._output_done.set()
        if self.finished.is_set():  # the protocol reader finished first and left this pipe open
            try:
                self.proc.stderr.close()
            except (OSError, ValueError):
                pass

    def _deliver(self, msg: dict) -> None:
        msg["worker"] = self.id
        try:
            self.on_message(msg)
        except Exception:
            log.exception("a worker message handler failed")


def _private_temp(kind: str, suffix: str) -> Path | None:
    """An empty file only this user can read, made with an unpredictable name and exclusive create."""
    try:
        fd, name = tempfile.mkstemp(prefix=f"backprop-studio-{kind}-", suffix=suffix)
    except OSError:
        return None
    os.close(fd)
    return Path(name)


def script_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be run or opened, in words, or None when it is a readable file."""
    p = Path(path)
    try:
        p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            return f"{p}: a symbolic link to a file that does not exist"
        return f"{p}: no such file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{p}: a loop of symbolic links"
        return f"{p}: cannot be read ({exc.strerror})"
    if p.is_dir():
        return f"{p}: a folder, not a file"
    if not p.is_file():
        return f"{p}: not a regular file"
    if not os.access(p, os.R_OK):
        return f"{p}: cannot be read (permission denied)"
    return None


def _daemon_timer(seconds: float, fn, *args) -> threading.Timer:
    """A timer that never keeps the process alive at exit."""
    timer = threading.Timer(seconds, fn, args=args)
    timer.daemon = True
    timer.start()
    return timer


def death_error(code: int, fault: str, exiting: dict | None, script: str | None, reason: str = "") -> ErrorInfo:
    """The structured error for a worker that vanished mid-run."""
    line = None
    if exiting is not None:
        line = exiting.get("line")
        message = f"the script called os._exit({exiting.get('code')}): the worker exited with code {code}"
        kind, etype = "exit", "WorkerExited"
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        message = f"the worker died with signal {-code} ({name})"
        kind, etype = "crash", "WorkerDied"
    else:
        message = f"the worker exited with code {code} before the run finished"
        kind, etype = "exit", "WorkerExited"
    if line is None and script:
        line = script_line_in_fault(fault, script)
    if reason == STOPPED:
        where = f" at line {line}" if line else ""
        return ErrorInfo(type="Stopped", message=f"stopped by you{where}", line=line, kind="cancelled",
                         fault=fault.strip(), file=script)
    if reason:
        message = f"{reason}; {message}"
        kind = "timeout" if "time limit" in reason else "cancelled" if "cancel" in reason else kind
    return ErrorInfo(type=etype, message=message, line=line, kind=kind, fault=fault.strip(), file=script)


def script_line_in_fault(fault: str, script: str) -> int | None:
    """The innermost line of ``script`` in a faulthandler dump (which lists innermost first)."""
    pattern = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
    target = str(Path(script).resolve())
    for m in pattern.finditer(fault):
        if m.group("file") == target or m.group("file") == script:
            return int(m.group("line"))
    return None


def summary_dict(call: dict | CallInfo) -> dict | CallInfo:
    """A streamed call reduced to its summary, as the capture reduces repeated calls in a loop."""
    if isinstance(call, CallInfo):  # sent in columns (core.trace_columns)
        return with_fields(call, nodes=[], tensors=[], storages=[], roots=[], snapshot="summary")
    return {**call, "nodes": [], "tensors": [], "storages": [], "roots": [], "snapshot": "summary"}


def read_script(path: str | os.PathLike) -> str:
    """A script's text decoded as Python decodes it (a PEP 263 coding cookie, a BOM, else UTF-8).

    Raises OSError, or ValueError (SyntaxError, UnicodeDecodeError) for an unknown coding.
    """
    with tokenize.open(path) as f:
        return f.read()


def _source(path: str) -> str:
    try:
        return read_script(path)
    except (OSError, ValueError):
        return ""


class RunResult:
    """What a finished run produced: the trace (possibly only an error) and the output."""

    def __init__(self, trace: Trace, output: str, output_bytes: int, elapsed: float, run_id: int = 0):
        self.run_id = run_id
        self.trace = trace
        self.output = output
        self.output_bytes = output_bytes
        self.elapsed = elapsed


class WorkerClient:
    """Runs scripts in worker processes and reports every event to ``on_event``.

    States: ``starting`` (no worker ready yet), ``ready``, ``running``, ``closed``.
    Events are dicts with a ``type``: ``state``, ``hello``, ``output``, ``call``,
    ``call_done``, ``finished`` (with ``result``: a RunResult) and the raw worker messages.
    ``on_event`` is called on background threads.
    """

    def __init__(self, on_event: Callable[[dict], None] | None = None, python: str | None = None,
                 prestart: bool = True, launcher=None):
        self.on_event = on_event or (lambda e: None)
        self.python = python
        self.launcher = launcher  # a core.launchers.Launcher, or None for a local worker
        self.prestart = prestart
        self.memory_rate = 50.0  # memory samples per second in the worker; 0 turns sampling off
        self.expand_steps = True  # hand each batched ``steps`` message on as one ``step`` event per node
        self.state = "starting"
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
            load: dict | None = None, ddp: dict | None = None) -> int:
        """Start running ``path``; returns the run id. A run in progress is cancelled first.

        ``step`` (``{"call": N, "mode": "interactive" | "all"}``) runs backward call N under the
        stepper; ``debug`` (``{"lines": [...], "pause_all": bool, "skip_to": N}``) makes a debug
        run that pauses at each call a breakpoint selects; drive both with ``control()``. Stepping
        and debug runs have no time limit: the user sets the pace. ``seeds`` reseeds the run.
        """
        with self._lock:
            old, self._run = self._run, None
        if old is not None:
            # Killed and reported outside the lock: the reader thread that sees the worker exit
            # needs the lock, and waiting for it while holding the lock froze the caller for 5 s.
            self._finish_dead_run(run=old, reason="the run was cancelled: a new run started")
        with self._lock:
            worker = self._spare or self._new_worker()
            self._spare = None
            run_id = next(self._run_ids)
            self._active = worker
            self._run = {"id": run_id, "path": str(path), "device": device, "start": time.monotonic(),
                         "worker": worker, "timeout": timeout, "done": False, "step": step, "debug": debug}
            self._set_state("running")
        extra = {"debug": debug, "seeds": seeds, "load": load, "ddp": ddp}
        threading.Thread(target=self._launch, args=(worker, run_id, path, device, mode, timeout, step, extra),
                         name=f"run-{run_id}", daemon=True).start()
        return run_id

    def control(self, cmd: str, **args) -> bool:
        """Send a stepping or debug command to the running worker (``core.protocol.STEP_COMMANDS``
        and ``breakpoints``); False when no run is in progress."""
        with self._lock:
            run = self._run
        if run is None:
            return False
        return run["worker"].send({"cmd": cmd, **args})

    def cancel(self) -> None:
        """Stop the current run: interrupt the script, and kill the worker if it does not stop."""
        with self._lock:
            run = self._run
        if run is None:
            return
        worker = run["worker"]
        worker.send({"cmd": "cancel"})
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
            self._set_state("closed")
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

        def on_message(msg: dict) -> None:
            self._on_worker_message(holder["w"], msg)

        w = WorkerProcess(on_message, python=self.python, launcher=self.launcher)
        holder["w"] = w
        w.start()
        return w

    def _set_state(self, state: str) -> None:
        self.state = state
        self.on_event({"type": "state", "state": state})

    def _launch(self, worker: WorkerProcess, run_id: int, path: str, device: str, mode: str, timeout: float,
                step: dict | None = None, extra: dict | None = None):
        extra = extra or {}
        worker.ready.wait(timeout=120)
        with self._lock:
            if self._run is None or self._run["id"] != run_id:
                return
            run = self._run
        cmd = protocol.Run(run=run_id, path=str(Path(path).resolve()), device=device, mode=mode, step=step,
                           debug=extra.get("debug"), seeds=extra.get("seeds"), memory_rate=self.memory_rate,
                           load=extra.get("load"))
        if extra.get("ddp"):
            cmd.extra["ddp"] = extra["ddp"]
        if self.launcher is not None:
            from core.launchers import run_payload, send_run_files

            try:
                cmd.extra.update(run_payload(self.launcher, path, extra.get("load")))
            except (OSError, ValueError) as exc:
                err = ErrorInfo(type=type(exc).__name__, message=str(exc), kind="load", file=str(path))
                self._complete(run, Trace(calls=[], error=err, script=str(path), device=device), "", 0)
                threading.Thread(target=worker.close, daemon=True).start()
                return
            # A saved model, its weights, a model folder: sent as files before the run (core.uploads).
            files = cmd.extra.pop("_files", None)
            if files and not send_run_files(worker, files, self.on_event, lambda: self._run is run):
                return  # replaced meanwhile, or the worker is gone (its exit reports why)
        if not worker.send(cmd.to_dict()):
            return  # the exit message reports the death
        if self.prestart:
            with self._lock:
                if self._spare is None and self.state != "closed":
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

    def _on_worker_message(self, worker: WorkerProcess, msg: dict) -> None:
        kind = msg.get("type")
        if kind == "hello":
            self.devices = msg.get("devices", self.devices)
            self.torch_version = msg.get("torch", "")
            with self._lock:
                if self.state == "starting":
                    self._set_state("ready")
            self.on_event(msg)
            return
        with self._lock:
            run = self._run
            current = run is not None and run["worker"] is worker
        if not current:
            if kind == "exit" and self.launcher is not None and worker.hello is None:
                from core.launchers import start_failure

                with worker._lock:
                    said = worker.output_tail.decode("utf-8", errors="replace")
                why = worker.refused or start_failure(self.launcher, msg.get("code") or 0, said)
                self.on_event({"type": "spare_failed", "message": why})
            return  # a spare's exit, or an old worker's last words
        if kind == "call_trace":  # kept for the result; not passed on (a big graph, of no use to the views yet)
            run.setdefault("calls", {})[int(msg.get("position", 0))] = msg.get("call")
            return
        if kind == "call_summary":
            position = int(msg.get("position", -1))
            call = run.get("calls", {}).get(position)
            if isinstance(call, (dict, CallInfo)):
                run["calls"][position] = summary_dict(call)
            return
        if kind == "steps":
            unpack_steps(msg)  # previews sent once per batch (core.step_pack)
        if kind == "steps" and self.expand_steps:
            for record in msg.get("records", ()):
                self.on_event({"type": "step", "call": msg.get("call"), "record": record, "worker": msg.get("worker")})
        elif kind == "trace":
            self._finish_with_trace(worker, run, msg)
        elif kind == "exit":
            self._finish_dead_run(code=msg.get("code"), run=run)
        else:
            self.on_event(msg)

    def _finish_with_trace(self, worker: WorkerProcess, run: dict, msg: dict) -> None:
        try:
            trace = Trace.from_dict(msg["trace"])
            streamed = self._streamed_calls(run)
            if streamed:
                trace = replace(trace, calls=streamed + list(trace.calls))
        except TraceFormatError as exc:
            trace = Trace(calls=[], error=ErrorInfo(type="TraceFormatError", message=str(exc), kind="load"))
        with worker._lock:
            output = worker.output_tail.decode("utf-8", errors="replace")
        # The worker has served its run: it is closed off the caller's thread; close() waits for it.
        closer = threading.Thread(target=worker.close, name=f"close-worker-{worker.id}", daemon=True)
        closer.start()
        with self._lock:
            self._retired = [t for t in self._retired if t.is_alive()] + [closer]
        self._complete(run, trace, output, worker.output_bytes)

    @staticmethod
    def _streamed_calls(run: dict) -> list:
        """The calls the worker streamed as it captured them, in order (unreadable ones skipped)."""
        calls = []
        for position in sorted(run.get("calls", {})):
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
        if worker.launcher is not None:
            from core.launchers import launcher_error

            err = launcher_error(worker, code, run["path"], reason)
        else:
            err = death_error(code if code is not None else -9, worker.fault_text(), worker.exiting, run["path"],
                              reason)
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
            if self.state != "closed" and self._run is None:
                self._set_state("ready")
        trace = replace(trace, output=output)
        self.on_event({"type": "finished", "run": run["id"], "result": RunResult(trace, output, output_bytes, elapsed, run["id"])})


def run_capture(path: str, device: str = "cpu", mode: str = "auto", timeout: float = DEFAULT_TIMEOUT,
                on_event: Callable[[dict], None] | None = None, step: dict | None = None,
                seeds: dict | None = None, load: dict | None = None, launcher=None,
                ddp: dict | None = None, memory_rate: float | None = None) -> RunResult:
    """Run one script in a fresh worker and wait for its result (the CLI and tests use this).
    ``memory_rate`` sets the memory samples per second (0: none, when nothing shows them)."""
    done = threading.Event()
    box: dict = {}

    def handle(event: dict) -> None:
        if on_event is not None:
            on_event(event)
        if event.get("type") == "finished":
            box["result"] = event["result"]
            done.set()

    client = WorkerClient(handle, prestart=False, launcher=launcher)
    if memory_rate is not None:
        client.memory_rate = memory_rate
    try:
        client.run(path, device=device, mode=mode, timeout=timeout, step=step, seeds=seeds, load=load, ddp=ddp)
        done.wait()
        return box["result"]
    finally:
        client.close()
