"""The worker process: owns torch, runs one user script, talks to its parent in JSON lines.

Started by ``core.client`` as ``python -m core.worker --fault-file PATH``. The protocol
channel is a duplicate of the original stdout; file descriptors 1 and 2 are then pointed
at the stderr pipe, so whatever the script prints (from Python or from C) can never
corrupt the protocol. Commands arrive on stdin and are read on a thread, so a running
script can be cancelled (KeyboardInterrupt in the main thread) and, later, stepped.

Messages sent: ``hello`` (pid, torch version, devices), ``started``, ``call`` and
``call_done`` (progress), ``exiting`` (the script called ``os._exit``), ``trace`` (the
result, in the trace format) and ``bye``.
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

DEFAULT_MEMORY_RATE = 50.0  # samples per second while a script runs
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


class Worker:
    STEP_COMMANDS = ("step", "step_to", "continue", "pause", "stop_step")

    def __init__(self, channel: Channel):
        self.channel = channel
        self.commands: queue.Queue = queue.Queue()
        self.running = False
        self.stepper = None
        self.sampler = None
        self._memory_due = None
        self._early: list[dict] = []  # step commands that arrived before the stepped call began

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
        if stepper is None:
            self._early.append(cmd)
            return
        kind = cmd["cmd"]
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
        self.channel.send({"type": "step", "call": index, "record": record})
        self._memory_due = record.get("index")

    def _on_pause(self, index: int, pending: dict) -> None:
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

    def _step_hook(self, capture, step: dict):
        """A call hook that runs backward call ``step['call']`` under a BackwardStepper."""
        from core.stepping import BackwardStepper

        wanted = int(step.get("call", 0))
        free_run = step.get("mode") == "all"

        def hook(index, api, roots, real):
            if index != wanted:
                return real()
            send = self.channel.send
            stepper = BackwardStepper(
                roots,
                real,
                names=capture.names.name_of,
                on_step=lambda record: self._on_step(index, record),
                on_pause=lambda pending: self._on_pause(index, pending),
                watch=[t for _, t in capture.names.named_tensors()],
            )
            send({"type": "step_begin", "call": index, "api": api})
            if free_run:
                stepper.resume()
            self.stepper = stepper
            for early in self._early:
                self.control_step(early)
            self._early.clear()
            try:
                return stepper.run()
            finally:
                self.stepper = None
                self._step_memory(index)
                err = stepper.error
                send({"type": "step_end", "call": index, "state": stepper.state,
                      "error": None if err is None or stepper.state == "stopped"
                      else {"type": type(err).__name__, "message": str(err)}})

        return hook

    def run(self, cmd: dict) -> None:
        from core.capture import Capture
        from core.trace import ErrorInfo, Trace

        run_id = cmd.get("run")
        device = cmd.get("device") or "cpu"
        self.channel.send({"type": "started", "run": run_id, "t": time.time()})
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
                if cmd.get("step"):
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
            sys.stdout.flush()
            sys.stderr.flush()
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
