"""The worker process: owns torch, runs one user script, talks to its parent in JSON lines.

Started by ``core.client`` as ``python -m core.worker --fault-file PATH``; at the process
boundary stdin carries commands and stdout the protocol (so any command whose stdin and
stdout are the worker's can start it). Inside, both move to private descriptors numbered
high and marked close-on-exec; fd 0 becomes ``/dev/null`` (``input()`` fails at once with a
message saying scripts get no input) and fds 1 and 2 point at the stderr pipe, so whatever
the script prints (from Python or from C) can never corrupt the protocol, and a script that
closes fds 0-2 or writes to fd 3 cannot reach it. Only this process writes messages: a
forked child (``multiprocessing``) is recognised by its pid. Commands are read on a thread
with ``os.read`` (no ``sys.stdin`` lock a forked child could inherit held), so a running
script can be cancelled (KeyboardInterrupt in the main thread) and stepped.

The script runs as under ``python script.py``: cwd and ``sys.path[0]`` are its folder,
``__name__ == "__main__"``, ``__file__`` set, and the app's own packages (``core``, ``app``,
``widgets``) are out of ``sys.modules``, ``sys.path`` and ``PYTHONPATH`` while it runs, so a
project with its own ``core`` package imports its own.

Messages sent: ``hello`` (pid, torch version, devices), ``started``, ``call`` and
``call_done`` (progress), ``call_trace`` (each captured call as soon as it is complete, so a
crash keeps it), ``call_summary`` (an earlier streamed call was reduced to a summary),
``exiting`` (the script called ``os._exit``), ``trace`` (the result, in the trace format,
without the calls already streamed) and ``bye``; while stepping ``step_begin``,
``step_paused``, ``step``, ``step_memory`` and ``step_end``. Every kind is a dataclass in
``core.protocol``.

A debug run (``run`` with ``debug``) pauses the script itself at each backward /
``autograd.grad`` call that hits a breakpoint, before the engine runs: the call's graph is
sent with ``step_begin`` and the call is stepped in place, so the numbers stepped are the
run's own. Every run records its seeds (torch, Python ``random``, NumPy) in the trace; a
run given ``seeds`` uses them instead, so a re-run for stepping draws the same numbers.
"""

from __future__ import annotations

import _thread
import argparse
import builtins
import faulthandler
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from core import ddp, protocol, wire, worker_remote
from core.trace import ErrorInfo, Trace, call_to_dict, paused_gc

ROOT = Path(__file__).resolve().parents[1]
APP_PACKAGES = ("core", "app", "widgets")
PRIVATE_FD_MIN = 600  # the protocol and command descriptors live above what scripts touch
NO_INPUT = ("scripts get no input in Backprop Studio (stdin is empty, as with `python script.py < /dev/null`); "
            "set the value in the script instead")

DEFAULT_MEMORY_RATE = 50.0  # samples per second while a script runs
STEP_BATCH, STEP_BATCH_S = 1000, 0.05  # finished nodes are sent at least this often
STEP_BATCH_RUN_ON_S = 0.5  # while backward runs on (Continue): fewer, bigger batches, fewer frames
PHASE_OF_EVENT = {"call": "backward", "call_done": "between", "forward": "forward"}  # capture event -> memory phase

class Channel:
    """Writes one JSON message per line on the protocol descriptor, from any thread.

    Only the process that made it writes (a forked child's messages are dropped). If the
    script closed or replaced the descriptor, messages go to ``fallback`` (a file the parent
    made and reads after the worker exits) instead of being lost.
    """

    def __init__(self, fd: int, fallback: str | None = None):
        self.fd = fd
        self.pid = os.getpid()
        self.fallback = fallback
        self._identity = _identity(fd)
        self._lock = threading.Lock()
        self.broken = False  # the script closed or replaced the descriptor
        self.codec: str | None = None  # compress big messages (behind a launcher): see core.wire

    def send(self, msg: dict) -> None:
        if os.getpid() != self.pid:
            return
        with paused_gc():
            data = (json.dumps(msg, separators=(",", ":")) + "\n").encode("utf-8")
        if self.codec and len(data) > wire.FRAME_MIN_BYTES:
            self._send_frame(data, msg.get("type", ""))
            return
        with self._lock:
            if _identity(self.fd) == self._identity:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(self.fd, view):]
                    return
                except OSError:
                    pass
            self.broken = True
            self._send_fallback(data)

    def _send_frame(self, data: bytes, kind: str) -> None:
        """A big message as compressed chunks; a thread writes while the next chunk is compressed."""
        header = (json.dumps(wire.frame_header(kind, len(data), self.codec)) + "\n").encode("utf-8")
        out: queue.Queue = queue.Queue(maxsize=16)
        failed = []

        def write() -> None:  # blocks on a slow link
            while (chunk := out.get()) is not None:
                if not failed:
                    try:
                        _write_all(self.fd, chunk)
                    except OSError as exc:
                        failed.append(exc)

        with self._lock:
            try:
                _write_all(self.fd, header)
            except OSError:
                self.broken = True
                return
            writer = threading.Thread(target=write, name="frame-writer", daemon=True)
            writer.start()
            for chunk in wire.frame_chunks(data, self.codec):
                out.put(chunk)
            out.put(None)
            writer.join()
            self.broken = self.broken or bool(failed)

    def _send_fallback(self, data: bytes) -> None:
        if not self.fallback:
            return
        try:
            fd = os.open(self.fallback, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _identity(fd: int) -> tuple | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _private_fd(fd: int) -> int:
    """A close-on-exec duplicate of ``fd`` numbered high, out of the script's usual reach."""
    try:
        import fcntl

        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD_MIN)
    except (ImportError, OSError, AttributeError):
        new = os.dup(fd)
        os.set_inheritable(new, False)
        return new


def _say_no_input() -> None:
    """``input()`` fails at once with a message saying why (stdin is ``/dev/null``)."""
    real_input = builtins.input

    def no_input(prompt: object = "") -> str:
        try:
            return real_input(prompt)
        except EOFError:
            raise EOFError(NO_INPUT) from None

    builtins.input = no_input


@contextmanager
def script_environment(script: str, cwd: str | None = None):
    """The process as ``python script.py`` would give it: cwd, sys.path, PYTHONPATH, no app modules.

    The app's modules stay alive (the worker's functions hold them) but leave ``sys.modules``
    while the script runs, so its own ``core`` or ``app`` package imports; they come back after.
    """
    folder = str(Path(script).resolve().parent)
    old_cwd = os.getcwd()
    old_path = list(sys.path)
    old_env = os.environ.get("PYTHONPATH")
    ours = {}
    for name, mod in list(sys.modules.items()):
        if name.split(".")[0] in APP_PACKAGES and _is_ours(mod):
            ours[name] = sys.modules.pop(name)
    sys.path[:] = [p for p in sys.path if not _is_root(p)]
    original = os.environ.get("BACKPROP_STUDIO_PYTHONPATH")
    if original is not None:
        if original:
            os.environ["PYTHONPATH"] = original
        else:
            os.environ.pop("PYTHONPATH", None)
    try:
        os.chdir(cwd or folder)  # ``cwd``: a remote run's --remote-cwd, where its data is
    except OSError:
        pass
    try:
        yield
    finally:
        try:
            os.chdir(old_cwd)
        except OSError:
            pass
        sys.path[:] = old_path
        if old_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_env
        for name in [n for n in sys.modules if n.split(".")[0] in APP_PACKAGES]:
            del sys.modules[name]  # the script's own packages of those names
        sys.modules.update(ours)


def _is_ours(mod) -> bool:
    file = getattr(mod, "__file__", None) or ""
    paths = list(getattr(mod, "__path__", []) or [])
    return any(str(p).startswith(str(ROOT)) for p in [file, *paths] if p)


def _is_root(entry: str) -> bool:
    if ROOT.name in ("site-packages", "dist-packages"):
        return False  # an installed worker: that folder also holds torch and what the script imports
    try:
        return Path(entry or ".").resolve() == ROOT
    except OSError:
        return False


def list_devices() -> list[dict]:
    import torch

    devices = [{"id": "cpu", "name": "CPU", "kind": "cpu"}]
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devices.append({
                    "id": f"cuda:{i}", "name": p.name, "kind": "cuda",
                    "capability": f"{p.major}.{p.minor}", "total_memory": p.total_memory,
                })
    except Exception as exc:  # a broken driver must not stop the CPU from working
        devices.append({"id": "cuda", "name": f"CUDA unavailable: {exc}", "kind": "error"})
    try:
        if torch.backends.mps.is_available():
            devices.append({"id": "mps", "name": "Apple MPS", "kind": "mps"})
    except Exception:
        pass
    return devices


def check_device(device: str) -> str | None:
    """None when ``device`` can be used, else a sentence saying why not."""
    import torch

    try:
        dev = torch.device(device)
    except Exception as exc:
        return f"'{device}' is not a device name: {exc}"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return f"{device} was asked for, but CUDA is not available on this machine"
        if (dev.index or 0) >= torch.cuda.device_count():
            return f"{device} was asked for, but this machine has {torch.cuda.device_count()} CUDA device(s)"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return "MPS was asked for, but it is not available on this machine"
    return None


def apply_device(device: str) -> None:
    """Make the picked device the one a script finds.

    Scripts choose with ``torch.device("cuda" if torch.cuda.is_available() else "cpu")``: on
    ``cpu`` the worker answers that CUDA and MPS are unavailable; on ``cuda:N`` device N becomes
    the current device, so a plain ``"cuda"`` means it. The choice is also in the environment
    variable BACKPROP_STUDIO_DEVICE. The default device is left alone: setting it would move
    tensors made from NumPy arrays and data loaders behind the script's back.
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        torch.cuda.is_available = lambda: False
        try:
            torch.backends.mps.is_available = lambda: False
        except AttributeError:
            pass
    elif dev.type == "cuda":
        torch.cuda.set_device(dev.index or 0)
    elif dev.type == "mps":
        torch.cuda.is_available = lambda: False


def seed_run(seeds: dict | None) -> dict:
    """Seed torch, ``random`` and NumPy for a run (fresh seeds when none are given); returns them."""
    import random

    import torch

    seeds = dict(seeds or {})
    # Fresh seeds fit in 63 bits, so every JSON and Qt layer carries them as plain integers.
    fresh = [int.from_bytes(os.urandom(8), "little") >> 1 for _ in range(2)]
    seeds.setdefault("torch", fresh[0])
    seeds.setdefault("random", fresh[1])
    torch.manual_seed(int(seeds["torch"]))
    random.seed(int(seeds["random"]))
    try:
        import numpy
    except ImportError:
        seeds.pop("numpy", None)
    else:
        seeds.setdefault("numpy", fresh[1] & 0xFFFFFFFF)
        numpy.random.seed(int(seeds["numpy"]) & 0xFFFFFFFF)
    return seeds


class DebugPlan:
    """Where a debug run pauses; changed from the command thread while the script runs."""

    def __init__(self, lines=(), pause_all: bool = True, skip_to: int | None = None):
        self.lines = {int(x) for x in lines or ()}
        self.pause_all = pause_all
        self.skip_to = skip_to
        self.next_call = False  # pause at the next call whatever the breakpoints say
        self.free = False  # resume to the end: no more pauses

    def update(self, cmd: dict) -> None:
        if "lines" in cmd:
            self.lines = {int(x) for x in cmd.get("lines") or ()}
        if "pause_all" in cmd:
            self.pause_all = bool(cmd["pause_all"])
        if "skip_to" in cmd:
            self.skip_to = None if cmd["skip_to"] is None else int(cmd["skip_to"])

    def pauses_at(self, index: int, line: int | None) -> bool:
        if self.free:
            return False
        if self.next_call:
            self.next_call = False
            return True
        if self.skip_to is not None:
            if index < self.skip_to:
                return False
            if index == self.skip_to:
                return True
        if self.lines:
            return line in self.lines
        return self.pause_all


class Worker:
    STEP_COMMANDS = protocol.STEP_COMMANDS

    def __init__(self, channel: Channel, command_fd: int = 0, fault=None):
        self.channel = channel
        self.command_fd = command_fd
        self.fault = fault
        self.cancelled = False
        self.commands: queue.Queue = queue.Queue()
        self.running = False
        self.stepper = None
        self.sampler = None
        self._memory_due = None
        self._early: list[dict] = []  # step commands that arrived before the stepped call began
        self._summarised: set[int] = set()
        self.debug: DebugPlan | None = None
        self._steps: list[dict] = []  # finished nodes not sent yet
        self._steps_since = 0.0
        self.finish = None  # a travelling script's run: maps the trace's paths back (worker_remote)

    def read_commands(self) -> None:
        for line in _lines(self.command_fd):
            try:
                cmd = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if not isinstance(cmd, dict):
                continue
            if cmd.get("cmd") == "cancel":
                self.cancelled = True
                if self.stepper is not None:
                    self.stepper.stop()
                if self.running:
                    _thread.interrupt_main()
                continue
            if cmd.get("cmd") == "dump":
                self.dump_stacks()
                if self.fault is None:  # behind a launcher: the stacks travel back as a message
                    self.channel.send({"type": "fault", "text": worker_remote.dump_stacks()})
                continue
            if cmd.get("cmd") in self.STEP_COMMANDS:
                self.control_step(cmd)
                continue
            if cmd.get("cmd") == "breakpoints":
                if self.debug is not None:
                    self.debug.update(cmd)
                continue
            self.commands.put(cmd)
        if self.running:  # the connection dropped mid-run: end everything this worker started
            worker_remote.end_group()
        self.commands.put({"cmd": "quit"})

    def dump_stacks(self) -> None:
        """Write every thread's stack to the fault file (works even if the script ignores SIGUSR1)."""
        if self.fault is not None:
            try:
                faulthandler.dump_traceback(file=self.fault, all_threads=True)
                self.fault.flush()
            except (OSError, ValueError):
                pass

    def serve(self) -> None:
        threading.Thread(target=self.read_commands, name="commands", daemon=True).start()
        while True:
            cmd = self.commands.get()
            kind = cmd.get("cmd")
            if kind == "quit":
                self.channel.send(protocol.Bye().to_dict())
                return
            if kind == "devices":
                self.channel.send(protocol.Devices(devices=list_devices()).to_dict())
            elif kind == "run":
                self.run(cmd)
                if self.channel.broken:
                    return  # the script closed the channel: the parent reads the rest from the fallback file

    def _sampler(self, capture, device: str, rate: float, run_id):
        from core.memory import MemorySampler

        self.sampler = MemorySampler(
            device if device.startswith("cuda") else "cpu",
            rate_hz=rate,
            saved_bytes_fn=capture.live_saved_storages,
            on_batch=lambda batch: self.channel.send({"type": "memory", "run": run_id, "samples": batch}),
        )
        from core.memory_marks import describe_node

        def on_node(node) -> None:
            md = node.metadata
            module = md.get("bps_module")
            self.sampler.on_node(node, describe_node(
                node, md.get("bps_line"), capture.names.module_paths.get(module) if module is not None else None))

        capture.on_node = on_node
        return self.sampler

    def control_step(self, cmd: dict) -> None:
        """Drive the paused backward from the command thread."""
        stepper = self.stepper
        kind = cmd["cmd"]
        debug = self.debug
        if debug is not None and kind in ("next_call", "resume_all"):
            if kind == "next_call":
                debug.next_call = True
            else:
                debug.free = True
            if stepper is not None:
                stepper.resume()
            return
        if stepper is None:
            if debug is None or kind != "continue":  # Continue between calls has nothing to continue
                self._early.append(cmd)
            return
        if kind == "step":
            stepper.step(int(cmd.get("count", 1)))
        elif kind == "step_to":
            stepper.run_to(str(cmd.get("node")))
        elif kind == "continue":
            stepper.resume()
        elif kind == "pause":
            stepper.pause()
        elif kind == "stop_step":
            stepper.stop()

    def _on_step(self, index: int, record: dict) -> None:
        # Batched: Continue on 5,000 nodes sent 5,000 messages; a pause or the end flushes at once,
        # so a single Step is not delayed.
        if not self._steps:
            self._steps_since = time.perf_counter()
        self._steps.append(record)
        self._memory_due = record.get("index")
        running_on = self.stepper is not None and self.stepper.running_on
        if len(self._steps) >= STEP_BATCH or time.perf_counter() - self._steps_since > (
                STEP_BATCH_RUN_ON_S if running_on else STEP_BATCH_S):
            self._flush_steps(index)

    def _flush_steps(self, index: int) -> None:
        if self._steps:
            if self.stepper is not None:
                self.stepper.settle()  # previews of a run-on are read in batches: fill them before sending
            records, self._steps = self._steps, []
            self.channel.send(protocol.Steps(call=index, records=records).to_dict())

    def _on_pause(self, index: int, pending: dict) -> None:
        self._flush_steps(index)
        self.channel.send(protocol.StepPaused(call=index, pending=pending).to_dict())
        self._step_memory(index)

    def _step_memory(self, index: int) -> None:
        """A sample after a node ran: the memory its saved tensors held is released now.

        Taken once the pause is announced, so walking the graph for saved bytes (tens of ms
        on 5,000 nodes) never delays the frame that shows the step.
        """
        step, self._memory_due = self._memory_due, None
        if self.sampler is None or step is None:
            return
        # Saved bytes are recomputed at most ~5% of the time: fast stepping stays fast.
        sample = self.sampler.mark("backward", {"t": time.perf_counter() - self.sampler.origin}, force_saved=False)
        self.channel.send(protocol.StepMemory(call=index, step=step, t=sample.t, saved_bytes=sample.saved_bytes,
                                              allocated=sample.allocated).to_dict())

    def _step_hook(self, capture, step: dict | None = None, debug: DebugPlan | None = None):
        """A call hook that runs backward calls under a BackwardStepper: call ``step['call']``
        (a stepping run), or each call where ``debug`` pauses (a debug run)."""
        from core.step_state import leaf_digest
        from core.stepping import BackwardStepper  # imported now: the script's run hides the app's modules

        step = step or {}
        wanted = int(step.get("call", 0))
        free_run = step.get("mode") == "all"
        line_of = step.get("line")  # headless: step the first call made from this line

        def hook(index, api, roots, real):
            line = capture.hook_call[2] if capture.hook_call else None
            if debug is not None:
                if not debug.pauses_at(index, line):
                    return real()
            elif line_of is not None:
                if line != int(line_of) or self._stepped:
                    return real()
            elif index != wanted:
                return real()
            self._stepped = True
            send = self.channel.send
            before = capture.call_before()
            stepper = BackwardStepper(
                roots,
                real,
                names=capture.names.name_of,
                on_step=lambda record: self._on_step(index, record),
                on_pause=lambda pending: self._on_pause(index, pending),
                watch=[t for _, t in capture.names.named_tensors()],
            )
            send(protocol.StepBegin(call=index, api=api, line=line, structure=before.structure,
                                    leaves=leaf_digest(before), debug=debug is not None,
                                    graph=call_to_dict(before)).to_dict())
            del before
            if free_run:
                stepper.resume()
            self.stepper = stepper
            for early in self._early:
                self.control_step(early)
            self._early.clear()
            try:
                return stepper.run()
            finally:
                self._flush_steps(index)
                self.stepper = None
                self._step_memory(index)
                err = stepper.error
                send(protocol.StepEnd(call=index, state=stepper.state,
                                      error=None if err is None or stepper.state == "stopped"
                                      else {"type": type(err).__name__, "message": str(err)}).to_dict())

        return hook

    def run(self, cmd: dict) -> None:
        from core.capture import Capture

        self.channel.codec = wire.pick_codec(cmd.get("compress"))
        if "source" in cmd:  # the script travelled from another machine: write it here, then run it
            worker_remote.run_materialized(self, cmd)
            return
        run_id = cmd.get("run")
        device = cmd.get("device") or "cpu"
        self.cancelled = False
        seeds = seed_run(cmd.get("seeds"))
        self.channel.send(protocol.Started(run=run_id, t=time.time(), seeds=seeds).to_dict())
        problem = check_device(device)
        streamed = 0
        if problem:
            err = ErrorInfo(type="DeviceError", message=problem, kind="device")
            trace = Trace(calls=[], error=err, script=cmd.get("path", ""), device=device)
        else:
            sampler = None
            capture = None

            def on_event(event: dict) -> None:
                nonlocal streamed
                event["run"] = run_id
                if sampler is not None:
                    phase = PHASE_OF_EVENT.get(event.get("type"))
                    if phase:
                        sampler.mark(phase, event)
                if event.get("type") != "forward":
                    self.channel.send(event)
                if event.get("type") == "call_done" and capture is not None:
                    streamed = self._stream_calls(capture, run_id, streamed)

            self.running = True
            try:
                apply_device(device)
                capture = Capture(cmd["path"], device=device, mode=cmd.get("mode", "auto"), on_event=on_event,
                                  load=cmd.get("load"))
                self._stepped = False
                if cmd.get("debug") is not None:
                    d = cmd["debug"]
                    self.debug = DebugPlan(d.get("lines"), d.get("pause_all", True), d.get("skip_to"))
                    capture.call_hook = self._step_hook(capture, debug=self.debug)
                elif cmd.get("step"):
                    capture.call_hook = self._step_hook(capture, cmd["step"])
                rate = float(cmd.get("memory_rate", DEFAULT_MEMORY_RATE))
                if rate > 0:
                    sampler = self._sampler(capture, device, rate, run_id)
                capture.started = time.perf_counter()
                remove_marks = None
                if sampler is not None:
                    from core.memory_marks import install_marks, script_line

                    sampler.origin = capture.started
                    sampler.start()
                    remove_marks = install_marks(sampler.note, script_line(capture.names))
                try:
                    with script_environment(cmd["path"], cmd.get("cwd")):
                        if cmd.get("ddp"):  # torchrun on this host, one capture per rank
                            trace = ddp.run_ranks(self, cmd)
                        else:
                            trace = capture.run()
                finally:
                    if sampler is not None:
                        remove_marks()
                        sampler.stop()
                if sampler is not None:
                    trace = replace(trace, memory=sampler.samples)
            except KeyboardInterrupt:
                err = ErrorInfo(type="KeyboardInterrupt", message="the run was cancelled", kind="cancelled")
                trace = Trace(calls=[], error=err, script=cmd.get("path", ""), device=device)
            finally:
                self.running = False
                self.debug = None
                self._early.clear()
            if self.cancelled and trace.error is not None and trace.error.kind == "cancelled":
                where = f" at line {trace.error.line}" if trace.error.line else ""
                trace = replace(trace, error=replace(trace.error, message=f"stopped by you{where}"))
            _flush_quietly()
        trace = replace(trace, seeds=seeds)
        if self.finish is not None:  # a travelling script: paths back to the app's own
            trace = self.finish(trace)
        # Calls already streamed are not sent again; the parent puts them first.
        data = replace(trace, calls=trace.calls[streamed:]).to_dict()
        self.channel.send(protocol.TraceDone(trace=data, run=run_id, streamed=streamed).to_dict())

    def _stream_calls(self, capture, run_id, streamed: int) -> int:
        """Send each call the capture has stored since the last time, and earlier calls it summarised."""
        calls = capture.calls
        for i in range(max(0, streamed - 2), streamed):
            if i < len(calls) and calls[i].snapshot == "summary" and i not in self._summarised:
                self._summarised.add(i)
                self.channel.send(protocol.CallSummary(position=i, run=run_id).to_dict())
        while streamed < len(calls):
            self.channel.send(protocol.CallTrace(position=streamed, call=call_to_dict(calls[streamed]),
                                                 run=run_id).to_dict())
            streamed += 1
        return streamed


def _flush_quietly() -> None:
    """Flush the script's streams; a script that closed fd 1 or 2 must not lose the result."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _lines(fd: int):
    """Lines read from ``fd`` with ``os.read`` until end of file or a closed descriptor."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode("utf-8", errors="replace")


def _patch_exit(channel: Channel) -> None:
    """Tell the parent where ``os._exit`` was called before the process vanishes (not a forked child's)."""
    real_exit = os._exit

    def _exit(code: int = 0) -> None:
        if os.getpid() != channel.pid:
            real_exit(code)
        try:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.endswith(("worker.py", "capture.py")):
                frame = frame.f_back
            line = frame.f_lineno if frame is not None else None
            file = frame.f_code.co_filename if frame is not None else None
            channel.send({"type": "exiting", "code": code, "line": line, "file": file})
            _flush_quietly()
        finally:
            real_exit(code)

    os._exit = _exit


def _open_fault_file(path: str):
    """The parent's fault file (made 0600 by ``tempfile``); never follows a planted symlink."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    os.set_inheritable(fd, False)
    try:
        import fcntl

        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, PRIVATE_FD_MIN)
        os.close(fd)
        fd = high
    except (ImportError, OSError, AttributeError):
        pass
    return os.fdopen(fd, "w", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="core.worker")
    parser.add_argument("--fault-file", default=None)
    parser.add_argument("--fallback-file", default=None)
    args = parser.parse_args(argv)
    worker_remote.become_group_leader()

    # stdout -> protocol and stdin -> commands at the boundary; private high fds inside.
    channel = Channel(_private_fd(1), fallback=args.fallback_file)
    command_fd = _private_fd(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdin = open(0, "r", encoding="utf-8", closefd=False)
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", buffering=1, closefd=False)
    _say_no_input()
    fault = _open_fault_file(args.fault_file) if args.fault_file else None
    if fault is not None:
        faulthandler.enable(file=fault, all_threads=True)
        if hasattr(signal, "SIGUSR1"):
            # The parent sends SIGUSR1 (and a dump command) before killing a run: the dump names the line.
            faulthandler.register(signal.SIGUSR1, file=fault, all_threads=True, chain=False)
    else:  # behind a launcher: a hard crash's dump travels back with the output
        faulthandler.enable(file=sys.stderr, all_threads=True)
    _patch_exit(channel)
    os.environ["BACKPROP_STUDIO_WORKER"] = "1"  # show() inside a traced script leaves the capture to us
    try:
        # Imported now, while the app's folder is on sys.path: a script that calls show() finds it.
        import backprop_studio  # noqa: F401
    except ImportError:
        pass
    import torch

    import core.capture  # noqa: F401  (loaded before the script hides the app's modules)
    import core.memory  # noqa: F401
    import core.stepping  # noqa: F401

    channel.send({"type": "hello", "pid": os.getpid(), "torch": torch.__version__, "devices": list_devices(),
                  "python": sys.version.split()[0], "protocol": wire.PROTOCOL_VERSION,
                  "codecs": wire.available_codecs(), "host": socket.gethostname()})
    Worker(channel, command_fd, fault).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
