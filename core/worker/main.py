"""The worker process: owns torch, runs one user script, talks to its parent in JSON lines.

Started by ``core.client.handle`` as ``python -m core.worker --fault-file PATH``; at the process
boundary stdin carries commands and stdout the protocol (so any command whose stdin and
stdout are the worker's can start it). The first line on stdin sets up the channel, before
anything is sent: ``{"cmd": "channel", "key": HEX, "fallback": PATH}``, the key that seals every
message (``core.protocol.wire``) and the local worker's fallback file, neither of which is in
the worker's arguments or environment, where a script could read them; a first line that is
any other command is served as one, and the channel is not sealed. Inside, both move to private descriptors numbered
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

Messages sent: ``hello`` (pid, torch version, devices, whether the app sent this code), ``started``, ``call`` and
``call_done`` (progress), ``call_trace`` (each captured call as soon as it is complete, so a
crash keeps it; a loop's repeated call past the first few as its summary, since the capture
keeps it in full only while it is the last), ``call_summary`` (an earlier streamed call was
reduced to a summary), ``exiting`` (the script called ``os._exit``), ``trace`` (the result,
in the trace format, without the calls already streamed, but with a loop's last call in full
where it went as its summary; a run the app ends gets that call whole when it asks for the
stacks) and ``bye``; while stepping ``step_begin``,
``step_paused``, ``step``, ``step_memory`` and ``step_end``. Every kind is a dataclass in
``core.protocol.messages``.

A debug run (``run`` with ``debug``) pauses at breakpoints (``core.worker.debug``). Every
run records its seeds (torch, Python ``random``, NumPy) in the trace; a run given ``seeds``
uses them instead, so a re-run for stepping draws the same numbers.

The pipe ends live in ``core.worker.channel``, the script's process set-up in
``core.worker.env``, stepping in ``core.worker.debug``, what a run on another machine
needs in ``core.worker.remote``.
"""

from __future__ import annotations

import _thread
import argparse
import faulthandler
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import replace
from itertools import chain
from pathlib import Path

from core.worker import ddp
from core.protocol import messages as protocol
from core.protocol import uploads
from core.protocol import wire
from core.worker import remote as worker_remote
from core.model.trace import ErrorInfo, Trace
from core.worker.channel import Channel, _open_fault_file, _private_fd
from core.worker.children import keep_children
from core.worker.interrupts import INTERRUPTS
from core.worker.memory_marks import describe_node, install_marks, script_line
from core.worker.env import (_flush_quietly, _patch_exit, _say_no_input, apply_device, check_device, list_devices,
                             script_environment, seed_run)
from core.worker.debug import DebugPlan, Stepping

__all__ = ["Channel", "Worker", "apply_device", "check_device", "list_devices", "main", "script_environment",
           "seed_run"]

DEFAULT_MEMORY_RATE = 50.0  # samples per second while a script runs
_decoder = json.JSONDecoder()
_decoder.raw_decode = _decoder.raw_decode  # bound now: a script's patched json does not reach the commands
_loads = _decoder.decode
PHASE_OF_EVENT = {"call": "backward", "call_done": "between", "forward": "forward"}  # capture event -> memory phase


class Worker(Stepping):
    STEP_COMMANDS = protocol.STEP_COMMANDS

    def __init__(self, channel: Channel, command_fd: int = 0, fault=None, reader=None, pending=()):
        self.channel = channel
        self.command_fd = command_fd
        self.reader = reader  # the command reader main() read the channel's set-up line with
        self.pending = list(pending)  # lines it read that are commands
        self.fault = fault
        self.cancelled = False
        self.script_cwd: str | None = None  # the folder the last script ran in: its atexit functions run there too
        self.commands: queue.Queue = queue.Queue()
        self.running = False
        self.stepper = None
        self.sampler = None
        self._memory_due = None
        self._early: list[dict] = []  # step commands that arrived before the stepped call began
        self._summarised: set[int] = set()  # streamed calls the app was told are summaries
        self._short: set[int] = set()  # streamed as summaries while the capture still held them in full
        self._live = None  # (capture, run id) while a script runs
        self.debug: DebugPlan | None = None
        self._steps: list[dict] = []  # finished nodes not sent yet
        self._steps_since = 0.0
        self.finish = None  # a travelling script's run: maps the trace's paths back (worker_remote)
        self.inbox = uploads.Inbox()  # files sent before a run (a saved model, weights): core.protocol.uploads

    def read_commands(self) -> None:
        reader = self.reader or uploads.CommandReader(self.command_fd)
        for line in chain(self.pending, reader):
            try:
                cmd = _loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if not isinstance(cmd, dict):
                continue
            if cmd.get("cmd") in ("file", "file_chunk", "file_abort"):  # a file on its way (core.protocol.uploads)
                data = reader.read_exact(int(cmd.get("bytes") or 0)) if cmd["cmd"] == "file_chunk" else b""
                if data is None:
                    break  # the connection dropped in the middle of a piece
                self.inbox.receive(cmd, data)
                continue
            if cmd.get("cmd") == "cancel":
                self.cancelled = True
                if self.stepper is not None:
                    self.stepper.stop()
                self.stop_forward()  # a pause in forward ends the run itself
                if self.running:
                    _thread.interrupt_main()
                continue
            if cmd.get("cmd") == "dump":  # the app is about to end the run
                self.dump_stacks()
                if self.fault is None:  # behind a launcher: the stacks travel back as a message
                    self.channel.send({"type": "fault", "text": worker_remote.dump_stacks()})
                self._send_short_calls()  # after the stacks, which name the line whatever the link
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
        from core.worker.memory import MemorySampler  # torch's: loaded once main() has set the fault handler

        self.sampler = MemorySampler(
            device if device.startswith("cuda") else "cpu",
            rate_hz=rate,
            saved_bytes_fn=capture.live_saved_storages,
            on_batch=lambda batch: self.channel.send({"type": "memory", "run": run_id, "samples": batch}),
        )

        def on_node(node) -> None:
            md = node.metadata
            module = md.get("bps_module")
            self.sampler.on_node(node, describe_node(
                node, md.get("bps_line"), capture.names.module_paths.get(module) if module is not None else None))

        capture.on_node = on_node
        return self.sampler

    def run(self, cmd: dict) -> None:
        from core.worker.capture.recorder import Capture  # torch's: loaded once main() has set the fault handler

        self.channel.codec = wire.pick_codec(cmd.get("compress"))
        self.channel.columns = "columns" in (cmd.get("encodings") or ())
        if "source" in cmd or cmd.get("uploads"):  # from another machine: write it here, then run it
            worker_remote.run_materialized(self, cmd)
            return
        run_id = cmd.get("run")
        device = cmd.get("device") or "cpu"
        seeds = seed_run(cmd.get("seeds"))
        self.channel.send(protocol.Started(run=run_id, t=time.time(), seeds=seeds).to_dict())
        problem = check_device(device)
        streamed = 0
        self._summarised.clear()
        self._short.clear()
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

            INTERRUPTS.start()
            self.running = True
            try:
                if self.cancelled:  # Stop came before the run did (the worker was still starting)
                    _thread.interrupt_main()
                apply_device(device)
                capture = Capture(cmd["path"], device=device, mode=cmd.get("mode", "auto"), on_event=on_event,
                                  load=cmd.get("load"))
                capture.script_ended = INTERRUPTS.script_ended
                if cmd.get("nan_check"):  # off, the capture pushes no check mode and hooks no node
                    from core.worker.capture.nan_check import NanCheck  # torch's, like Capture above

                    capture.nan_check = NanCheck()
                self._live = (capture, run_id)
                self._stepped = False
                if cmd.get("debug") is not None:
                    d = cmd["debug"]
                    self.debug = DebugPlan.from_run(d)
                    capture.call_hook = self._step_hook(capture, debug=self.debug)
                elif cmd.get("step"):
                    capture.call_hook = self._step_hook(capture, cmd["step"])
                rate = float(cmd.get("memory_rate", DEFAULT_MEMORY_RATE))
                if rate > 0:
                    sampler = self._sampler(capture, device, rate, run_id)
                capture.started = time.perf_counter()
                remove_marks = None
                if sampler is not None:
                    sampler.origin = capture.started
                    sampler.start()
                    remove_marks = install_marks(sampler.note, script_line(capture.names))
                try:
                    self.script_cwd = cmd.get("cwd") or str(Path(cmd["path"]).resolve().parent)
                    with script_environment(cmd["path"], cmd.get("cwd")):
                        if cmd.get("ddp") and not (cmd.get("step") or cmd.get("debug")):
                            trace = ddp.run_ranks(self, cmd)  # torchrun on this host, one capture per rank
                        else:  # a DDP script paused here, in this process, runs in a world of one
                            with ddp.world_of_one() if cmd.get("ddp") else nullcontext():
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
                INTERRUPTS.script_ended()
                self._live = None
                if self.debug is not None and self.debug.forward is not None:
                    self.debug.forward.close()  # sys.monitoring's id and events, where it had them
                self.debug = None
                self._early.clear()
            if self.cancelled and trace.error is not None and trace.error.kind == "cancelled":
                where = f" at line {trace.error.line}" if trace.error.line else ""
                trace = replace(trace, error=replace(trace.error, message=f"stopped by you{where}"))
            self.cancelled = False  # a worker serves one run; were it to serve another, that one starts afresh
            _flush_quietly()
        trace = replace(trace, seeds=seeds)
        if self.finish is not None:  # a travelling script: paths back to the app's own
            trace = self.finish(trace)
        # Calls already streamed are not sent again; the parent puts them first. A loop's last
        # call, streamed as its summary while a later one could still replace it, goes in full.
        streamed = min(self._still_whole(trace.calls) + [streamed])
        data = replace(trace, calls=trace.calls[streamed:])  # the channel encodes it (core.protocol.wire)
        self.channel.send(protocol.TraceDone(trace=data, run=run_id, streamed=streamed).to_dict())

    def _send_short_calls(self) -> None:
        """Whole, the calls streamed as summaries that the capture still holds in full (a loop's
        last call): sent on this thread after the stacks of a run the app is about to end (its
        time limit, a Stop the script ignored), since that run sends no trace; the app waits
        while they arrive (``WorkerProcess.dump_and_wait``)."""
        live = self._live
        if live is None:
            return
        capture, run_id = live
        calls = capture.calls
        for i in self._still_whole(calls):
            self._short.discard(i)
            self._summarised.discard(i)  # a later call still makes it a summary, and says so
            self.channel.send(protocol.CallTrace(position=i, call=calls[i], run=run_id).to_dict())

    def _still_whole(self, calls: list) -> list[int]:
        """The positions of the calls streamed as summaries that ``calls`` still holds whole (a
        loop's last call), in order. ``list`` copies the set in one step: the script's thread
        may add to it meanwhile."""
        return sorted(i for i in list(self._short) if i < len(calls) and calls[i].snapshot != "summary")

    def _stream_calls(self, capture, run_id, streamed: int) -> int:
        """Send each call the capture has stored since the last time, and earlier calls it summarised."""
        calls = capture.calls
        for i in range(max(0, streamed - 2), streamed):
            if i < len(calls) and calls[i].snapshot == "summary" and i not in self._summarised:
                self._summarised.add(i)
                self.channel.send(protocol.CallSummary(position=i, run=run_id).to_dict())
        while streamed < len(calls):
            call = capture.streamable(streamed)
            if call is not calls[streamed]:  # its summary: the full call may follow with the trace
                self._summarised.add(streamed)
                self._short.add(streamed)
            self.channel.send(protocol.CallTrace(position=streamed, call=call, run=run_id).to_dict())
            streamed += 1
        return streamed



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="core.worker")
    parser.add_argument("--fault-file", default=None)
    parser.add_argument("--fallback-file", default=None)
    parser.add_argument("--sent-code", action="store_true")  # started by core.client.bootstrap's program
    args = parser.parse_args(argv)
    worker_remote.become_group_leader()
    keep_children()  # children that leave the group with setsid still end with the run

    # stdout -> protocol and stdin -> commands at the boundary; private high fds inside.
    channel = Channel(_private_fd(1))
    command_fd = _private_fd(0)
    reader, pending = uploads.CommandReader(command_fd), []
    first = next(iter(reader), None)  # the channel's set-up (see above), before the first message
    setup = _channel_setup(first)
    if setup is not None:
        channel.seal_with(bytes.fromhex(setup["key"]))
        if setup.get("fallback"):
            channel.use_fallback(str(setup["fallback"]))
    elif first is not None:
        pending.append(first)
    if args.fallback_file is not None:
        channel.use_fallback(args.fallback_file)
    if channel.fallback is None:  # behind a launcher: a pipe the script closes ends the run
        channel.on_lost = worker_remote.pipe_closed
    del first, setup
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
    else:  # behind a launcher: a hard crash's dump travels back with the output, through a
        # private copy of stderr, so a script that silences fd 2 (or closes it) does not lose it
        worker_remote.REPORT_FD = _private_fd(2)
        faulthandler.enable(file=worker_remote.REPORT_FD, all_threads=True)
    _patch_exit(channel)
    os.environ["BACKPROP_STUDIO_WORKER"] = "1"  # show() inside a traced script leaves the capture to us
    try:
        # Imported now, while the app's folder is on sys.path: a script that calls show() finds it.
        import backprop_studio  # noqa: F401
    except ImportError:
        pass
    import torch

    channel.send({"type": "hello", "pid": os.getpid(), "torch": torch.__version__, "devices": list_devices(),
                  "python": sys.version.split()[0], "protocol": wire.PROTOCOL_VERSION,
                  "codecs": wire.available_codecs(), "host": socket.gethostname(),
                  "sent_code": args.sent_code})
    worker = Worker(channel, command_fd, fault, reader, pending)
    try:
        worker.serve()
    finally:
        uploads.remove_all()  # files that arrived for a run that never came
    _leave(worker.script_cwd)
    return 0


def _channel_setup(line: str | None) -> dict | None:
    """The set-up command in the first line on stdin, or None when it is another command."""
    try:
        cmd = _loads(line) if line else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(cmd, dict) or cmd.get("cmd") != "channel":
        return None
    try:
        if len(bytes.fromhex(str(cmd.get("key")))) < 16:
            return None
    except ValueError:
        return None
    return cmd


_REAL_EXIT = os._exit  # saved before _patch_exit replaces it


def _leave(script_cwd: str | None = None) -> None:
    """End the worker once its run is served: what interpreter exit runs for the script (its
    non-daemon threads are waited for, its ``atexit`` functions run, in the script's folder, its
    streams flushed), then exit without tearing down every module and object one by one, which
    with torch and a big model loaded takes most of a second that nobody waits for usefully."""
    try:
        if script_cwd:
            try:
                os.chdir(script_cwd)
            except OSError:
                pass
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        import atexit

        atexit._run_exitfuncs()
    finally:
        _flush_quietly()
        _REAL_EXIT(0)


if __name__ == "__main__":
    sys.exit(main())
