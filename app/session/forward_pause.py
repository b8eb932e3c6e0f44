"""A debug run paused in forward, as the window shows it: the live graph, what is new, where it is.

The worker sends ``forward_paused`` (``core.protocol.messages.ForwardPaused``) before a line of
the script runs: at a breakpoint, after a Step Over / Into / Out, before an in-place op that
will break backward, or at the first NaN/Inf. ``read_pause`` reads it once into a
``ForwardPause``: the live graph as a call (read like a ``step_begin`` graph), the ids of the
nodes made since the previous pause, the frames as a breadcrumb and the sentences the status
bar shows. Plain data, no Qt: the session holds it, ``app.session.forward_debug`` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from core.model.trace import CallInfo, TensorInfo
from core.model.trace_json import call_from_dict
from core.protocol import messages as protocol

CRUMB_SEP = " \u203a "  # between the frames of the breadcrumb: "<module> line 31 › model (MLP).forward line 18"
REASONS = {  # what made the run pause, for the status bar
    "breakpoint": "at a breakpoint",
    "step": "after a step",
    "inplace": "before an in-place op that breaks backward",
    "nan": "at the first NaN/Inf",
}


@dataclass(frozen=True)
class ForwardPause:
    """One pause in forward: the message, its graph read, and the nodes new since the last pause."""

    event: protocol.ForwardPaused
    call: CallInfo  # the live graph (api "live"): its nodes and tensors are the script's at the pause
    new: frozenset[str] = field(default_factory=frozenset)  # node ids of ``call`` made since the last pause

    @property
    def line(self) -> int:
        return int(self.event.line)

    @property
    def file(self) -> str:
        return self.event.file or ""

    @property
    def variables(self) -> list[TensorInfo]:
        """The live variables: the live graph's tensors bound to a name."""
        return [t for t in self.call.tensors if t.name]

    def crumbs(self) -> list[str]:
        """The paused frames, outermost first: "<module> line 31", "model (MLP).forward line 18"."""
        options = self.call.options if isinstance(self.call.options, dict) else {}
        classes = options.get("module_classes") or {}
        frames = [f for f in self.event.stack if isinstance(f, dict)]
        if not frames:
            frames = [{"function": self.event.function or "<module>", "line": self.line, "module": self.event.module}]
        out = []
        for frame in frames:
            function, line, module = frame.get("function") or "?", frame.get("line"), frame.get("module")
            name = function
            if module is not None:
                owner = module or "model"  # the root module's path is ""
                cls = frame.get("class") or classes.get(module)
                name = f"{owner} ({cls}).{function}" if cls else f"{owner}.{function}"
            out.append(f"{name} line {line}" if line else name)
        return out

    def breadcrumb(self) -> str:
        return CRUMB_SEP.join(self.crumbs())

    def headline(self) -> str:
        """What the pause is, in front of the frames: "Paused in forward", or why when the run paused
        on its own ("Paused before an in-place op that breaks backward")."""
        if self.event.reason in ("inplace", "nan"):
            return f"Paused {REASONS[self.event.reason]}"
        return "Paused in forward"

    def warning(self) -> str | None:
        """The note of a pause the run made on its own (an in-place op, a NaN/Inf): Problems lists it."""
        return self.event.note if self.event.reason in ("inplace", "nan") and self.event.note else None

    def new_text(self) -> str:
        """"2 nodes added since the last pause" (the first pause: "since the run started")."""
        count = len(self.new)
        nodes = "1 node" if count == 1 else f"{count} nodes"
        since = "since the run started" if self.event.pause <= 1 else "since the last pause"
        return f"{nodes} added {since}"

    def status(self) -> str:
        """The status bar's sentence: where, why, what grew and which keys go on (the frames are
        the breadcrumb's)."""
        where = Path(self.file).name if self.file else "the script"
        reason = REASONS.get(self.event.reason, self.event.reason)
        note = f" {self.event.note.rstrip('.')}." if self.event.note else ""
        nodes = len(self.call.nodes)
        return (f"Paused in forward before line {self.line} of {where} ({reason}):{note} {nodes} node"
                f"{'' if nodes == 1 else 's'} in the graph, {self.new_text()}. "
                f"F10 steps over, F11 into, Ctrl+F11 out, F5 continues.")


def read_pause(event: protocol.ForwardPaused, previous: ForwardPause | None = None) -> ForwardPause:
    """The pause of ``event``; TraceFormatError (naming the field) when its graph cannot be read.

    A pause without a graph (nothing requires grad yet) shows an empty live call. A leaf's
    AccumulateGrad that ``previous`` (the run's pause before) showed is not new, even when the
    worker says so: torch frees a leaf's AccumulateGrad while no op uses the leaf and makes another
    one later, so a parameter not used yet would glow at every pause."""
    if event.graph is not None:
        call = call_from_dict(event.graph, f"the live graph of forward pause {event.pause}")
    else:
        call = CallInfo(id=f"live{event.pause}", index=0, api="live", line=event.line, roots=[], nodes=[],
                        tensors=[])
    ids = {n.id for n in call.nodes}
    new = {str(n) for n in event.new if str(n) in ids}
    if previous is not None and previous.event.pause == event.pause - 1:
        seen = {_leaf_key(previous.call, n) for n in previous.call.nodes if n.kind == "accumulate_grad"}
        new -= {n.id for n in call.nodes if n.kind == "accumulate_grad" and _leaf_key(call, n) in seen - {None}}
    return ForwardPause(event=event, call=call, new=frozenset(new))


def _leaf_key(call: CallInfo, node) -> str | None:
    """What names a leaf across pauses: its variable's name (node ids are the pause's own)."""
    tensor = call.tensor(node.variable)
    return (tensor.name if tensor is not None and tensor.name else None) or node.label
