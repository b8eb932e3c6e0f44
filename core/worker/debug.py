"""Stepping inside the worker: where a debug run pauses, and the backward stepper's messages.

A debug run pauses the script itself at each backward / ``autograd.grad`` call that hits a
breakpoint, before the engine runs: the call's graph is sent with ``step_begin`` and the call
is stepped in place, so the numbers stepped are the run's own. ``Stepping`` is the part of
``core.worker.main.Worker`` that drives a ``core.worker.stepper.BackwardStepper`` from the command thread
and sends ``step_begin``, ``steps`` (batched), ``step_paused``, ``step_memory`` and ``step_end``.

A debug run also pauses in forward, before a breakpoint's line runs (``core.worker.forward_pause``,
set up with the call hook); while it is paused there, the step commands are that pause's. With Run to
First NaN/Inf each call runs under a stepper that goes on without pausing (nothing is sent) until a
node's incoming gradient is not finite: the call's ``step_begin`` and the steps so far are sent then,
and it pauses before that node.
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
    """Where a debug run pauses; changed from the command thread while the script runs.

    ``lines`` pause at the backward calls made from them and, for the other lines, in forward before
    the line runs (``core.worker.forward_pause``, the plan's ``forward``); ``pause_on_errors`` pauses in
    forward before an in-place op that will break backward, ``to_nan`` at the first non-finite value
    (forward: the op that made it; backward: the node it reaches). ``at_line``: the headless
    ``step --at-line``, which pauses in forward only, once, without waiting."""

    def __init__(self, lines=(), pause_all: bool = True, skip_to: int | None = None,
                 pause_on_errors: bool = False, to_nan: bool = False, at_line: bool = False):
        self.lines = {int(x) for x in lines or ()}
        self.pause_all = pause_all
        self.skip_to = skip_to
        self.pause_on_errors = pause_on_errors
        self.to_nan = to_nan
        self.at_line = at_line
        self.nan_found = False  # backward's first non-finite gradient was paused at
        self.next_call = False  # pause at the next call whatever the breakpoints say
        self.free = False  # resume to the end: no more pauses
        self.forward = None  # the run's core.worker.forward_pause.ForwardPauser, once the run starts

    @classmethod
    def from_run(cls, debug: dict) -> "DebugPlan":
        """The plan of a ``run`` command's ``debug``."""
        return cls(debug.get("lines"), debug.get("pause_all", True), debug.get("skip_to"),
                   bool(debug.get("pause_on_errors")), bool(debug.get("to_nan")), bool(debug.get("at_line")))

    def update(self, cmd: dict) -> None:
        if "lines" in cmd:
            self.lines = {int(x) for x in cmd.get("lines") or ()}
        if "pause_all" in cmd:
            self.pause_all = bool(cmd["pause_all"])
        if "skip_to" in cmd:
            self.skip_to = None if cmd["skip_to"] is None else int(cmd["skip_to"])
        if "pause_on_errors" in cmd:
            self.pause_on_errors = bool(cmd["pause_on_errors"])
        if self.forward is not None:
            self.forward.plan_changed()

    def pauses_at(self, index: int, line: int | None) -> bool:
        if self.free or self.at_line:
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
        pauser = debug.forward if debug is not None else None
        if pauser is not None and pauser.paused:  # paused in forward: the command is the pause's
            if kind == "next_call":
                debug.next_call = True
            elif kind == "resume_all":
                debug.free = True
            pauser.command(kind, cmd)
            return
        if kind == "forward_step":  # not paused in forward (a late click): nothing to step
            return
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

    def stop_forward(self) -> None:
        """The run is cancelled: a forward pause ends it (the command thread)."""
        debug = self.debug
        if debug is not None and debug.forward is not None:
            debug.forward.stop()

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
        (a stepping run), or each call where ``debug`` pauses (a debug run, which also pauses in
        forward: ``core.worker.forward_pause``, set up here before the script runs)."""
        from core.worker.forward_pause import BackwardStepper, ForwardPauser, nonfinite  # now: a run hides core

        step = step or {}
        wanted = int(step.get("call", 0))
        free_run = step.get("mode") == "all"
        line_of = step.get("line")  # headless: step the first call made from this line
        if debug is not None:
            debug.forward = ForwardPauser(capture, debug, self.channel.send, headless=debug.at_line)

        def hook(index, api, roots, real):
            line = capture.hook_call[2] if capture.hook_call else None
            check = capture.nan_check
            # Run to First NaN/Inf: no node's gradient has been found not finite yet
            nan_search = debug is not None and debug.to_nan and not debug.nan_found and not debug.free \
                and check is not None and check.backward is None
            nan_only = False  # stepped only to pause where a gradient first is not finite
            if debug is not None:
                if not debug.pauses_at(index, line):
                    nan_only = nan_search
                    if not nan_only:
                        return real()
            elif line_of is not None:
                if line != int(line_of) or self._stepped:
                    return real()
            elif index != wanted:
                return real()
            self._stepped = True
            send = self.channel.send
            began = [not nan_only]
            held: list[dict] = []  # a NaN search's steps, sent if it pauses

            def begin() -> None:
                before = capture.call_before()
                send(protocol.StepBegin(call=index, api=api, line=line, structure=before.structure,
                                        leaves=leaf_digest(before), debug=debug is not None,
                                        graph=call_to_dict(before)).to_dict())

            def on_step(record: dict) -> None:
                if began[0]:
                    self._on_step(index, record)
                else:
                    held.append(record)

            def on_pause(pending: dict) -> None:
                if not began[0]:  # the first non-finite gradient: the call is shown from here
                    began[0] = True
                    debug.nan_found = True
                    begin()
                    for record in held:
                        self._on_step(index, record)
                    held.clear()
                self._on_pause(index, pending)

            stepper = BackwardStepper(
                roots,
                real,
                names=capture.names.name_of,
                on_step=on_step,
                on_pause=on_pause,
                watch=[*(t for _, t in capture.names.named_tensors()), *live_retained()],
                stop_when=nonfinite if nan_search else None,
            )
            if began[0]:
                begin()
            if free_run or nan_only:
                stepper.resume()
            self.stepper = stepper
            if debug is not None and debug.free:
                # Resume Without Pausing came between step_begin and now: it found no stepper to resume.
                stepper.resume()
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
                if began[0]:
                    self._flush_steps(index)
                self.stepper = None
                if began[0]:
                    self._end_step(index, stepper, hops)

        return hook

    def _end_step(self, index: int, stepper, hops) -> None:
        self._step_memory(index)
        err = stepper.error
        end = protocol.StepEnd(call=index, state=stepper.state.value,
                               error=None if err is None or stepper.state is protocol.StepperState.STOPPED
                               else {"type": type(err).__name__, "message": str(err)})
        if hops is not None:
            hops["sent"] = time.monotonic()
            end.extra["hops"] = hops
        self.channel.send(end.to_dict())
