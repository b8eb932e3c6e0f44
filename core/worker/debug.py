"""Stepping inside the worker: where a debug run pauses, and the backward stepper's messages.

A debug run pauses the script itself at each backward / ``autograd.grad`` call that hits a
breakpoint, before the engine runs: the call's graph is sent with ``step_begin`` and the call
is stepped in place, so the numbers stepped are the run's own. ``Stepping`` is the part of
``core.worker.main.Worker`` that drives a ``core.worker.stepper.BackwardStepper`` from the command thread
and sends ``step_begin``, ``steps`` (batched), ``step_paused``, ``step_memory`` and ``step_end``.
"""

from __future__ import annotations

import time

from core.protocol import messages as protocol
from core.protocol.step_pack import pack_records
from core.protocol.switch_interval import quick_switch
from core.model.step_state import leaf_digest
from core.model.trace_json import call_to_dict
from core.worker.capture.retained import live_retained

STEP_BATCH, STEP_BATCH_S = 1000, 0.05  # finished nodes are sent at least this often
STEP_BATCH_RUN_ON_S = 0.5  # while backward runs on (Continue): fewer, bigger batches, fewer frames


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


class Stepping:
    """Mixed into the Worker: needs ``channel``, ``stepper``, ``sampler``, ``debug``, ``_early``,
    ``_steps``, ``_steps_since``, ``_memory_due`` and ``_stepped``."""

    def control_step(self, cmd: dict) -> None:
        """Drive the paused backward from the command thread."""
        stepper = self.stepper
        kind = cmd["cmd"]
        if "t" in cmd:  # the app times this command's round trip: stamps echoed with the next pause
            self._hops = {"cmd": cmd["t"], "read": time.monotonic()}
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
        every = STEP_BATCH_RUN_ON_S if running_on else STEP_BATCH_S
        if len(self._steps) >= STEP_BATCH or time.perf_counter() - self._steps_since > every:
            self._flush_steps(index)

    def _flush_steps(self, index: int) -> None:
        if self._steps:
            if self.stepper is not None:
                self.stepper.settle()  # previews of a run-on are read in batches: fill them before sending
            records, self._steps = self._steps, []
            # each gradient preview once per batch (core.protocol.step_pack; the app's reader unpacks it)
            records, previews = pack_records(records)
            msg = protocol.Steps(call=index, records=records)
            msg.extra["previews"] = previews
            self.channel.send(msg.to_dict())

    def _on_pause(self, index: int, pending: dict) -> None:
        hops, self._hops = getattr(self, "_hops", None), None
        if hops is not None:
            hops["woke"] = self.stepper.woke if self.stepper is not None else 0.0
            hops["paused"] = time.monotonic()
        self._flush_steps(index)
        msg = protocol.StepPaused(call=index, pending=pending)
        if hops is not None:
            hops["sent"] = time.monotonic()
            msg.extra["hops"] = hops
        self.channel.send(msg.to_dict())
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
        from core.worker.stepper import BackwardStepper  # imported now: the script's run hides the app's modules

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
                watch=[*(t for _, t in capture.names.named_tensors()), *live_retained()],
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
            quick_switch(True, "worker")  # the hops of a Step cross threads: see core.protocol.switch_interval
            try:
                return stepper.run()
            finally:
                quick_switch(False, "worker")
                hops, self._hops = getattr(self, "_hops", None), None
                if hops is not None:
                    hops["ran"] = time.monotonic()
                self._flush_steps(index)
                self.stepper = None
                self._step_memory(index)
                err = stepper.error
                end = protocol.StepEnd(call=index, state=stepper.state.value,
                                       error=None if err is None or stepper.state is protocol.StepperState.STOPPED
                                       else {"type": type(err).__name__, "message": str(err)})
                if hops is not None:
                    hops["sent"] = time.monotonic()
                    end.extra["hops"] = hops
                send(end.to_dict())

        return hook
