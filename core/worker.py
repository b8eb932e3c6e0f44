"""The worker process: owns torch, runs one user script, talks to its parent in JSON lines.

Started by ``core.client`` as ``python -m core.worker --fault-file PATH``. The protocol
channel is a duplicate of the original stdout; file descriptors 1 and 2 are then pointed
at the stderr pipe, so whatever the script prints (from Python or from C) can never
corrupt the protocol. Commands arrive on stdin and are read on a thread, so a running
script can be cancelled (KeyboardInterrupt in the main thread) and, later, stepped.

Messages sent: ``hello`` (pid, torch version, devices), ``started``, ``call`` and
``call_done`` (progress), ``exiting`` (the script called ``os._exit``), ``trace`` (the
result, in the trace format) and ``bye``; while stepping ``step_begin``, ``step_paused``,
``step``, ``step_memory`` and ``step_end``. Every kind is a dataclass in ``core.protocol``.

A debug run (``run`` with ``debug``) pauses the script itself at each backward /
``autograd.grad`` call that hits a breakpoint, before the engine runs: the call's graph is
sent with ``step_begin`` and the call is stepped in place, so the numbers stepped are the
run's own. Every run records its seeds (torch, Python ``random``, NumPy) in the trace; a
run given ``seeds`` uses them instead, so a re-run for stepping draws the same numbers.
"""

from __future__ import annotations

import _thread
import argparse
import faulthandler
import json
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import replace

from core import protocol

DEFAULT_MEMORY_RATE = 50.0  # samples per second while a script runs
STEP_BATCH, STEP_BATCH_S = 1000, 0.05  # finished nodes are sent at least this often
PHASE_OF_EVENT = {"call": "backward", "call_done": "between", "forward": "forward"}  # capture event -> memory phase

class Channel:
    """Writes one JSON message per line on the protocol descriptor, from any thread."""

    def __init__(self, fd: int):
        self._file = os.fdopen(fd, "w", encoding="utf-8", buffering=1 << 16)
        self._lock = threading.Lock()

    def send(self, msg: dict) -> None:
        from core.trace import paused_gc

        with paused_gc():
            text = json.dumps(msg, separators=(",", ":"))
        with self._lock:
            self._file.write(text + "\n")
            self._file.flush()


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

    def __init__(self, channel: Channel):
        self.channel = channel
        self.commands: queue.Queue = queue.Queue()
        self.running = False
        self.stepper = None
        self.sampler = None
        self._memory_due = None
        self._early: list[dict] = []  # step commands that arrived before the stepped call began
        self.debug: DebugPlan | None = None
        self._steps: list[dict] = []  # finished nodes not sent yet
        self._steps_since = 0.0

    def read_commands(self) -> None:
        for line in sys.stdin:
            try:
                cmd = json.loads(line)
            except json.JSONDecodeError:
                continue
            if cmd.get("cmd") == "cancel":
                if self.stepper is not None:
                    self.stepper.stop()
                if self.running:
                    _thread.interrupt_main()
                continue
            if cmd.get("cmd") in self.STEP_COMMANDS:
                self.control_step(cmd)
                continue
            if cmd.get("cmd") == "breakpoints":
                if self.debug is not None:
                    self.debug.update(cmd)
                continue
            self.commands.put(cmd)
        self.commands.put({"cmd": "quit"})

    def serve(self) -> None:
        threading.Thread(target=self.read_commands, name="commands", daemon=True).start()
        while True:
            cmd = self.commands.get()
            kind = cmd.get("cmd")
            if kind == "quit":
                self.channel.send({"type": "bye"})
                return
            if kind == "devices":
                self.channel.send({"type": "devices", "devices": list_devices()})
            elif kind == "run":
                self.run(cmd)

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
        if len(self._steps) >= STEP_BATCH or time.perf_counter() - self._steps_since > STEP_BATCH_S:
            self._flush_steps(index)

    def _flush_steps(self, index: int) -> None:
        if self._steps:
            records, self._steps = self._steps, []
            self.channel.send({"type": "steps", "call": index, "records": records})

    def _on_pause(self, index: int, pending: dict) -> None:
        self._flush_steps(index)
        self.channel.send({"type": "step_paused", "call": index, "pending": pending})
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
        self.channel.send({"type": "step_memory", "call": index, "step": step, "t": sample.t,
                           "saved_bytes": sample.saved_bytes, "allocated": sample.allocated})

    def _step_hook(self, capture, step: dict | None = None, debug: DebugPlan | None = None):
        """A call hook that runs backward calls under a BackwardStepper: call ``step['call']``
        (a stepping run), or each call where ``debug`` pauses (a debug run)."""
        from core.step_state import leaf_digest
        from core.stepping import BackwardStepper
        from core.trace import call_to_dict

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
        from core.trace import ErrorInfo, Trace

        run_id = cmd.get("run")
        device = cmd.get("device") or "cpu"
        seeds = seed_run(cmd.get("seeds"))
        self.channel.send(protocol.Started(run=run_id, t=time.time(), seeds=seeds).to_dict())
        problem = check_device(device)
        if problem:
            err = ErrorInfo(type="DeviceError", message=problem, kind="device")
            trace = Trace(calls=[], error=err, script=cmd.get("path", ""), device=device)
        else:
            sampler = None

            def on_event(event: dict) -> None:
                event["run"] = run_id
                if sampler is not None:
                    phase = PHASE_OF_EVENT.get(event.get("type"))
                    if phase:
                        sampler.mark(phase, event)
                if event.get("type") != "forward":
                    self.channel.send(event)

            self.running = True
            try:
                apply_device(device)
                capture = Capture(cmd["path"], device=device, mode=cmd.get("mode", "auto"), on_event=on_event)
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
            sys.stdout.flush()
            sys.stderr.flush()
        trace = replace(trace, seeds=seeds)
        self.channel.send({"type": "trace", "run": run_id, "trace": trace.to_dict()})


def _patch_exit(channel: Channel) -> None:
    """Tell the parent where ``os._exit`` was called before the process vanishes."""
    real_exit = os._exit

    def _exit(code: int = 0) -> None:
        line = None
        try:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.endswith(("worker.py", "capture.py")):
                frame = frame.f_back
            line = frame.f_lineno if frame is not None else None
            file = frame.f_code.co_filename if frame is not None else None
            channel.send({"type": "exiting", "code": code, "line": line, "file": file})
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            real_exit(code)

    os._exit = _exit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="core.worker")
    parser.add_argument("--fault-file", default=None)
    args = parser.parse_args(argv)

    channel = Channel(os.dup(1))
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", buffering=1, closefd=False)
    if args.fault_file:
        fault = open(args.fault_file, "w", encoding="utf-8")
        faulthandler.enable(file=fault, all_threads=True)
        if hasattr(signal, "SIGUSR1"):
            # The parent sends SIGUSR1 before killing a hung run: the dump names the line.
            faulthandler.register(signal.SIGUSR1, file=fault, all_threads=True, chain=False)
    _patch_exit(channel)
    import torch

    channel.send({"type": "hello", "pid": os.getpid(), "torch": torch.__version__, "devices": list_devices(),
                  "python": sys.version.split()[0]})
    Worker(channel).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
