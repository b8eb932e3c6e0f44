"""Every message between the app and its worker process, as typed dataclasses.

One JSON object per line. Messages from the worker carry ``type``; commands to the worker
carry ``cmd``. ``to_dict`` gives the JSON-ready dict, ``message_from_dict`` /
``command_from_dict`` the typed object: each field is checked against its annotation, and a
missing required field or a value of the wrong type raises ``ProtocolError`` naming the kind
and the field; unknown keys are kept in ``extra``, so a newer worker's additions are not lost.
Qt-free and torch-free: the worker, the client, the GUI and the CLI all import it.

``core.client.handle`` hands every message on as its dataclass, with the client's own events
(``state``, ``output``, ``exit``, ``refused``, ``spare_failed``, ``transfer``, ``finished``,
``bad_message``), which never cross the wire, defined in ``core.protocol.events``
(``event_from_dict`` here reads both). Readers use the
attributes; ``msg["field"]`` / ``msg.get("field")`` still read a message as the dict it was
sent as, for scripts written against the dict form.

Stepping messages: ``step_begin`` (a call is paused before its first node, with the captured
graph, ``graph``, its ``structure`` hash and a digest of its leaf values), ``step_paused``
(paused before ``pending``), ``steps`` (nodes that ran: ``records``, batched while backward runs
on; ``core.client.handle`` hands them on one ``step`` event per record unless told not to),
``step_memory``, ``step_end``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from core.protocol.events import EVENTS
from core.protocol.record import _TYPES, ProtocolError, _Base
from core.model.trace import CallInfo, Trace, TraceFormatError

# Messages that carry a trace or a call may hold them read already (core.protocol.wire's columns).
_TYPES.update({"Trace": (Trace,), "CallInfo": (CallInfo,), "TraceFormatError": (TraceFormatError,)})


MESSAGES: dict[str, type] = {}
COMMANDS: dict[str, type] = {}

# Written on stderr (not the pipe, which is gone) by a worker behind a launcher just before it
# ends the run because nothing can reach the app any more (core.worker.remote): the script
# closed or replaced its pipe to the app, or the far end of that pipe closed (a link on the way).
PIPE_CLOSED = "backprop-studio worker: the script closed the worker's pipe to the app"
PIPE_BROKEN = "backprop-studio worker: the far end of the worker's pipe to the app closed"


def _message(kind: str):
    def wrap(cls):
        cls.KIND = kind
        MESSAGES[kind] = cls
        return cls
    return wrap


def _command(kind: str):
    def wrap(cls):
        cls.KEY = "cmd"
        cls.KIND = kind
        COMMANDS[kind] = cls
        return cls
    return wrap


# -- worker -> app -------------------------------------------------------------------------------
@_message("hello")
@dataclass
class Hello(_Base):
    pid: int = 0
    torch: str = ""
    devices: list = field(default_factory=list)
    python: str = ""
    protocol: int = 1  # core.protocol.wire.PROTOCOL_VERSION of the worker; the app refuses another one
    codecs: list = field(default_factory=list)  # compressions the worker can send big messages in
    host: str = ""  # the worker machine's host name
    sent_code: bool = False  # the worker runs the code the app sent with its start (core.client.bootstrap)


@_message("devices")
@dataclass
class Devices(_Base):
    devices: list = field(default_factory=list)


@_message("started")
@dataclass
class Started(_Base):
    run: Any = None
    t: float = 0.0
    seeds: dict = field(default_factory=dict)  # the seeds this run uses (torch, random, numpy)


@_message("call")
@dataclass
class CallStarted(_Base):
    index: int = 0
    api: str = ""
    line: int | None = None
    nodes: int = 0
    t: float = 0.0
    run: Any = None


@_message("call_done")
@dataclass
class CallDone(_Base):
    index: int = 0
    error: bool = False
    t: float = 0.0
    run: Any = None


@_message("memory")
@dataclass
class Memory(_Base):
    samples: list = field(default_factory=list)
    run: Any = None


@_message("step_begin")
@dataclass
class StepBegin(_Base):
    call: int = 0
    api: str = ""
    line: int | None = None
    structure: str = ""  # the graph's structure hash (the trace's ``structure``)
    leaves: str = ""  # a digest of the graph's leaf values before backward
    graph: dict | None = None  # the captured call (trace format) in a debug run
    debug: bool = False


@_message("step_paused")
@dataclass
class StepPaused(_Base):
    call: int = 0
    pending: dict = field(default_factory=dict)


@_message("step")
@dataclass
class Step(_Base):
    call: int = 0
    record: dict = field(default_factory=dict)


@_message("steps")
@dataclass
class Steps(_Base):
    """Nodes that finished while backward ran on (Continue, Step to): sent in batches."""
    call: int = 0
    records: list = field(default_factory=list)


@_message("step_memory")
@dataclass
class StepMemory(_Base):
    call: int = 0
    step: int = 0
    t: float = 0.0
    saved_bytes: int = 0
    allocated: int = 0


class StepperState(str, Enum):
    """Where one stepped backward call is (``core.worker.stepper.BackwardStepper.state``).

    ``step_end`` carries the last three as their plain strings (``.value``).
    """

    IDLE = "idle"  # not started
    RUNNING = "running"  # the engine is executing nodes
    PAUSED = "paused"  # the engine waits before the next node
    FINISHED = "finished"  # backward returned
    STOPPED = "stopped"  # the user's Stop ended it (StepperStopped)
    FAILED = "failed"  # backward raised

    def __str__(self) -> str:
        return self.value


@_message("step_end")
@dataclass
class StepEnd(_Base):
    call: int = 0
    state: str = StepperState.FINISHED.value  # a StepperState's value: finished, stopped or failed
    error: dict | None = None


@_message("forward_paused")
@dataclass
class ForwardPaused(_Base):
    """A debug run paused in forward, *before* ``line`` of ``file`` runs (a breakpoint, a Step, an
    autograd error about to happen or the first NaN/Inf), with the graph alive at that moment."""
    pause: int = 0  # 1, 2, ... within the run: the live graph's new nodes are those since the last
    line: int = 0
    file: str = ""
    function: str = ""  # the paused frame's function ("<module>" at the top level)
    # The script's own frames, outermost first: {"function", "line", "file", "module"} ("module": the
    # nn.Module path whose forward that frame runs, or null). The window's breadcrumb.
    stack: list = field(default_factory=list)
    module: str | None = None  # the innermost nn.Module path running
    reason: str = "breakpoint"  # breakpoint | step | inplace | nan
    # The live graph in the trace format (api "live"): every node reachable from the tensors of the
    # paused frames, the globals and the modules' parameters; its tensors are the live variables.
    graph: dict | None = None
    new: list = field(default_factory=list)  # ids (in ``graph``) of nodes made since the previous pause
    note: str = ""  # what the pause is about, in words (an in-place op: the version counters before/after)


@_message("exiting")
@dataclass
class Exiting(_Base):
    code: int = 0
    line: int | None = None
    file: str | None = None


@_message("call_trace")
@dataclass
class CallTrace(_Base):
    """One captured call, sent as soon as it is complete, so a crash or a kill later keeps it."""
    position: int = 0  # its place in the trace's ``calls``
    # The call in the trace format; sent in columns (core.protocol.wire) it arrives read already: a CallInfo,
    # or the TraceFormatError reading it raised.
    call: dict | CallInfo | TraceFormatError = field(default_factory=dict)
    run: Any = None


@_message("call_summary")
@dataclass
class CallSummary(_Base):
    """The call streamed at ``position`` was reduced to a summary (a loop's repeated graph)."""
    position: int = 0
    run: Any = None


@_message("trace")
@dataclass
class TraceDone(_Base):
    # Without the calls already streamed; in columns it arrives read: a Trace, or the TraceFormatError.
    trace: dict | Trace | TraceFormatError = field(default_factory=dict)
    run: Any = None
    streamed: int = 0  # the calls before this position came as ``call_trace``: they go first in ``calls``


@_message("rank_trace")
@dataclass
class RankTrace(_Base):
    """A DDP run's trace of another rank than the one picked (sent before ``trace``), so the
    window can switch between the ranks."""
    rank: int = 0
    nproc: int = 1
    # In the trace format, all-reduce records included; sent in columns (core.protocol.wire) it arrives
    # read: a Trace, or the TraceFormatError reading it raised.
    trace: dict | Trace | TraceFormatError = field(default_factory=dict)
    run: Any = None


@_message("frame")
@dataclass
class Frame(_Base):
    """A big message follows as compressed chunks (see core.protocol.wire); ``of`` is its type."""
    codec: str = "zlib"
    raw: int = 0  # bytes of the message's JSON once decompressed
    of: str = ""


@_message("fault")
@dataclass
class Fault(_Base):
    """Every thread's stack, in answer to ``dump`` from a worker with no fault file (behind a launcher)."""
    text: str = ""


@_message("placed")
@dataclass
class Placed(_Base):
    """Where a script sent with the run was written on the worker's host, and the app's path."""
    path: str = ""
    local: str = ""
    run: Any = None


@_message("bye")
@dataclass
class Bye(_Base):
    pass


# -- app -> worker -------------------------------------------------------------------------------
@_command("run")
@dataclass
class Run(_Base):
    path: str = ""
    run: Any = None
    device: str = "cpu"
    mode: str = "auto"
    step: dict | None = None  # {"call": N, "mode": "interactive" | "all"}: step call N
    # A debug run: {"lines": [...], "skip_to": N, "pause": bool, "pause_on_errors": bool, "to_nan": bool}
    # ("to_nan": the NaN/Inf check is on and the run pauses at the first non-finite op or gradient).
    debug: dict | None = None
    seeds: dict | None = None  # reseed the run with these (a re-run for stepping)
    memory_rate: float = 50.0
    load: dict | None = None  # how to open the file: weights, input_shapes, trust_pickle (core.programs.program)
    # Behind a launcher the run also carries (in ``extra``): ``source`` and ``name`` (the script's
    # text and file name), ``folder`` (base64 tar.gz of the files beside it), ``remote_cwd``,
    # ``compress`` (zlib, zstd or none); any run may carry ``ddp`` ({"nproc": N, "rank": R}): a
    # plain run then starts N ranks under torchrun, a debug or step run one process, rank 0 of 1.


@_command("cancel")
@dataclass
class Cancel(_Base):
    pass


@_command("quit")
@dataclass
class Quit(_Base):
    pass


@_command("dump")
@dataclass
class Dump(_Base):
    """Write every thread's stack to the fault file (before a kill, so the report names the line);
    a worker behind a launcher sends them back as a ``fault`` message instead."""


@_command("devices")
@dataclass
class ListDevices(_Base):
    pass


@_command("step")
@dataclass
class StepCmd(_Base):
    count: int = 1


@_command("step_to")
@dataclass
class StepTo(_Base):
    node: str = ""


@_command("continue")
@dataclass
class Continue(_Base):
    """Run the paused backward to its end; a debug run pauses again at the next breakpoint."""


@_command("next_call")
@dataclass
class NextCall(_Base):
    """Run the paused backward to its end and pause at the next call, breakpoint or not."""


@_command("resume_all")
@dataclass
class ResumeAll(_Base):
    """Run the paused backward and the rest of the script without pausing again."""


@_command("pause")
@dataclass
class Pause(_Base):
    pass


@_command("stop_step")
@dataclass
class StopStep(_Base):
    pass


@_command("breakpoints")
@dataclass
class Breakpoints(_Base):
    """Where a debug run pauses: calls made from ``lines``; ``pause_all`` pauses at every call."""
    lines: list = field(default_factory=list)
    pause_all: bool = True
    skip_to: int | None = None  # pause first at call N (and after it as usual)
    # Pause in forward before an in-place op on a leaf that requires grad or on a tensor saved for
    # backward, at its line (the run's Debug > Pause on Autograd Errors).
    pause_on_errors: bool = False


@_command("forward_step")
@dataclass
class ForwardStep(_Base):
    """Paused in forward: run one line of this frame (``over``), go into the script's own function
    called on it (``into``), or run until this frame returns (``out``). ``continue`` runs to the next
    breakpoint (a backward call pauses as it does without forward pauses: at every call when no
    breakpoint is set, else at a breakpoint's line); ``next_call`` to the next backward call."""
    kind: str = "over"


STEP_COMMANDS = ("step", "step_to", "continue", "next_call", "resume_all", "pause", "stop_step", "forward_step")


def message_from_dict(data: dict) -> _Base:
    """The typed worker message for ``data``; ProtocolError if its ``type`` is unknown."""
    if not isinstance(data, dict):
        raise ProtocolError(f"a worker message must be a JSON object, not a {type(data).__name__}")
    cls = MESSAGES.get(data.get("type"))
    if cls is None:
        raise ProtocolError(f"unknown worker message type {data.get('type')!r}")
    return cls.from_dict(data)


def command_from_dict(data: dict) -> _Base:
    """The typed command for ``data``; ProtocolError if its ``cmd`` is unknown."""
    cls = COMMANDS.get(data.get("cmd"))
    if cls is None:
        raise ProtocolError(f"unknown command {data.get('cmd')!r}")
    return cls.from_dict(data)


def event_from_dict(data: dict) -> _Base:
    """A worker message or one of the client's own events, typed; ProtocolError when it does not fit."""
    if isinstance(data, dict) and data.get("type") in EVENTS:
        return EVENTS[data["type"]].from_dict(data)
    return message_from_dict(data)
