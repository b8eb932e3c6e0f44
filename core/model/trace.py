"""The trace model: plain, frozen dataclasses with string ids and a JSON round trip.

A trace is what the worker process sends to the GUI, what the exporters read and what
``main.py trace --json`` writes. It holds no torch objects, so the GUI never needs torch.
The key names are the public format described in ``docs/trace-format.md``; the JSON round trip
is in ``core.model.trace_json``, the compact columnar encoding used on the wire in ``core.protocol.columns``.
"""

from __future__ import annotations

import gc
import json
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

FORMAT = "backprop-studio-trace"
VERSION = 1

API_NAMES = ("Tensor.backward", "autograd.backward", "autograd.grad", "unreached", "model")
NODE_KINDS = ("backward", "accumulate_grad", "custom", "other")


class TraceFormatError(ValueError):
    """A trace file or message that cannot be read; the message names the field."""


@dataclass(frozen=True)
class ErrorInfo:
    type: str
    message: str
    line: int | None = None
    traceback: str = ""
    # "exception" (the script raised), "exit" (sys.exit / os._exit), "crash" (signal),
    # "timeout", "cancelled", "syntax", "load" (bad file), "disconnected" (the pipe to a remote worker
    # closed: the link dropped, or the script closed it).
    kind: str = "exception"
    file: str | None = None
    fault: str = ""
    where: str = ""  # "cell 4, line 2" in a notebook: shown instead of the bare line
    reason: str = ""  # why a file could not be opened (unsafe_pickle, needs_shapes, ...): the window offers a fix
    # The script raised inside a torch op in forward: that op, as ``core.model.forward_errors``
    # describes it ({name, text, line, inputs, call}); drives the failed-op mark and the export's title.
    failed_op: dict | None = None


@dataclass(frozen=True)
class Values:
    numel: int
    data: list | None = None  # flat list when numel <= 1,000
    sample: list | None = None  # first elements otherwise
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    approx: bool = False  # min / max / mean come from a strided sample (tensors past the exact bound)


@dataclass(frozen=True)
class GradInfo:
    shape: list[int]
    values: Values
    # ‖g‖₂ of the whole gradient (a number, or "nan" / "inf"), for edge gradients: values keep only a
    # sample of big ones. Drives Colour by Gradient Norm (core.model.edge_norms).
    norm: float | str | None = None


@dataclass(frozen=True)
class TensorInfo:
    id: str
    name: str | None
    shape: list[int]
    dtype: str
    device: str
    requires_grad: bool
    is_leaf: bool
    retains_grad: bool
    stride: list[int]
    storage_offset: int
    storage: str | None
    version: int
    values: Values
    grad: GradInfo | None = None
    base: str | None = None  # tensor id of the view's base, when the base is in the trace
    is_view: bool = False
    grad_fn: str | None = None  # node id, when the node is in the same call
    grad_fn_name: str | None = None
    element_size: int = 4
    nbytes: int = 0
    origin: str | None = None  # "detach" / "no_grad": how a tensor without grad was cut off the graph
    output_nr: int | None = None  # which output of its grad_fn it is, when not the first (unbind, split)
    hooks: list | None = None  # Tensor.register_hook functions on it, as "name (line N)"; drawn on its node


@dataclass(frozen=True)
class Edge:
    node: str
    input_nr: int


@dataclass(frozen=True)
class Saved:
    name: str
    tensor: str | None = None  # tensor id
    value: Any = None  # a scalar, a list of ints, a string
    freed: bool = False  # the saved tensor was already released when captured


@dataclass(frozen=True)
class Stale:
    saved: str
    saved_version: int | None
    version: int | None
    message: str = ""
    op_line: int | None = None  # script line of the in-place op that modified the saved tensor
    op: str | None = None  # that op's name, e.g. "mul_"


@dataclass(frozen=True)
class NodeInfo:
    id: str
    name: str
    kind: str
    next: list[Edge | None]
    saved: list[Saved] = field(default_factory=list)
    variable: str | None = None  # tensor id, for AccumulateGrad
    tensor: str | None = None  # the named tensor whose grad_fn this node is
    label: str | None = None  # the script's name for that tensor
    line: int | None = None  # script line of the op that created the node
    module: str | None = None  # nn.Module path the node was created in
    stale: Stale | None = None
    device: str | None = None  # device of the output of the op that created the node
    inplace: str | None = None  # the in-place op that created the node (e.g. "mul_")
    # One entry per None in ``next``: {"input": position, "cause": "constant" | "detach" | "no_grad" |
    # "number" | "item" | None, "name": the script's name (for "item": its text of the .item() call)
    # or None, "value": short text}. Drives the cut stubs.
    cuts: list | None = None
    # Edges where the gradient is summed to a broadcast input's shape or cast to another dtype:
    # {"input": position, "sum": [from shape, to shape], "dtype": [from, to]} (either key may be absent).
    edge_marks: list | None = None
    # Made under non-reentrant checkpointing: its saved tensors are recomputed when backward needs them.
    recomputed: bool | None = None
    # The autograd sequence number torch gave the node when the op made it (its creation order on
    # its thread; None for AccumulateGrad) and the time it was made, in seconds from the run's start
    # (the memory chart's clock). Drive the forward replay.
    seq: int | None = None
    created: float | None = None


@dataclass(frozen=True)
class StorageInfo:
    id: str
    nbytes: int
    device: str
    tensors: list[str]
    # NumPy arrays of the script on this memory (torch.from_numpy, .numpy()): {"name", "shape",
    # "strides" and "offset" in elements, "dtype"}. Listed by the storage view.
    numpy: list | None = None


@dataclass(frozen=True)
class CallInfo:
    id: str
    index: int
    api: str
    line: int | None
    roots: list[str]
    nodes: list[NodeInfo]
    tensors: list[TensorInfo]
    error: ErrorInfo | None = None
    storages: list[StorageInfo] = field(default_factory=list)
    options: dict = field(default_factory=dict)
    # Loops: calls whose graph has the same structure as an earlier one keep only a summary
    # and name that call in ``same_as``; ``snapshot`` is "full" or "summary".
    snapshot: str = "full"
    same_as: str | None = None
    structure: str = ""
    node_count: int = 0
    edge_count: int = 0
    leaf_grads: dict = field(default_factory=dict)  # leaf name -> Values after the call
    duration_s: float = 0.0
    # Graphs up to 300 nodes: node id -> one GradInfo (or None) per ``next`` entry, the gradient that
    # node sent along that edge in this call. Drives values on edges and "6 + 2 = 8" at leaves.
    edge_grads: dict = field(default_factory=dict)
    # Norms after the call (summaries too): {"params": {name: {"module", "grad", "param", "ratio",
    # "added" (when .grad accumulated)}}, "modules": {module path: norm}}. Drives core.model.grad_health.
    grad_norms: dict | None = None
    # Scalars after the call (summaries too), for the curves of a loop: {"loss": the root's value when
    # it has one element, or null; "values": {leaf name: [its elements]}; "grads": {leaf name: [its
    # .grad's elements]}}, for named leaves of a few elements (core.model.loop_curves).
    scalars: dict | None = None

    def node(self, node_id: str) -> NodeInfo | None:
        return self.node_map().get(node_id)

    def tensor(self, tensor_id: str | None) -> TensorInfo | None:
        if tensor_id is None:
            return None
        return self.tensor_map().get(tensor_id)

    def node_map(self) -> dict[str, NodeInfo]:
        cache = self.__dict__.get("_node_map")
        if cache is None:
            cache = {n.id: n for n in self.nodes}
            object.__setattr__(self, "_node_map", cache)
        return cache

    def consumers(self) -> dict[str, list[str]]:
        """Node id -> ids of the nodes whose ``next`` points at it (one entry per edge)."""
        cache = self.__dict__.get("_consumers")
        if cache is None:
            cache = {}
            for n in self.nodes:
                for e in n.next:
                    if e is not None:
                        cache.setdefault(e.node, []).append(n.id)
            object.__setattr__(self, "_consumers", cache)
        return cache

    def tensor_map(self) -> dict[str, TensorInfo]:
        cache = self.__dict__.get("_tensor_map")
        if cache is None:
            cache = {t.id: t for t in self.tensors}
            object.__setattr__(self, "_tensor_map", cache)
        return cache

    @property
    def title(self) -> str:
        if self.api == "live":  # the graph alive at a debug run's pause in forward
            return f"live graph before line {self.line} (pause {self.index})" if self.line else \
                f"live graph (pause {self.index})"
        where = f"line {self.line}" if self.line else "no line"
        return f"#{self.index} {self.api} ({where})"


@dataclass(frozen=True)
class MemorySample:
    t: float
    device: str
    allocated: int = 0
    reserved: int = 0
    rss: int = 0
    saved_bytes: int = 0
    phase: str = "forward"  # starting (imports, set-up), forward, backward or between: the band drawn
    max_allocated: int = 0
    mark: str = ""  # zero_grad, optimizer.step or empty_cache happened here: a labelled marker
    where: str = ""  # the op (node, script line, module) that just ran: names a peak
    kept_bytes: int = 0  # of saved_bytes, held by graphs a list keeps (losses.append(loss)): a peak's cause
    kept_in: str = ""  # the name of the list keeping the most of kept_bytes
    call: int | None = None  # the backward call whose start this sample marks (nested ones too)


@dataclass(frozen=True)
class Trace:
    calls: list[CallInfo]
    error: ErrorInfo | None = None
    script: str = ""
    source: str = ""
    device: str = "cpu"
    mode: str = "script"
    output: str = ""
    duration_s: float = 0.0
    torch_version: str = ""
    call_count: int = 0  # all backward calls, including ones not stored in ``calls``
    tensors: list[TensorInfo] = field(default_factory=list)
    storages: list[StorageInfo] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    seeds: dict = field(default_factory=dict)  # torch / random / numpy seeds the run used
    # Notebooks: one entry per code cell (cell, first script line, line count); maps lines to
    # "cell N, line M" in errors, the inspector and the Source panel's gutter.
    cells: list[dict] = field(default_factory=list)
    # clip_grad_norm_ / clip_grad_value_, optimizer.step (update per module) and zero_grad, in order,
    # each with "kind", "line" and "after_call" (the call it follows). Drives core.model.grad_health.
    grad_events: list[dict] = field(default_factory=list)
    format: str = FORMAT
    version: int = VERSION
    # The NaN/Inf check (``--nan-check``), absent when it was off: {"forward": the first op whose output
    # held a NaN or an infinity, "backward": the first node whose gradient did}, each None when none did.
    # Drives the trace command's two "first non-finite" lines (core.model.nan_check).
    nan_check: dict | None = None

    def to_dict(self) -> dict:
        with paused_gc():
            return _plain(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, separators=(",", ":") if indent is None else None)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")


@contextmanager
def paused_gc():
    """Pause the cyclic garbage collector around bulk work that allocates many small objects.

    Each collection it triggers walks every object alive, and a 50,000-node trace is millions
    of them: reading, writing and laying out big traces ran up to twice as long with it on.
    Nothing made here is cyclic.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_FAST: dict[type, tuple] = {}


def _fast_spec(cls) -> tuple:
    """(required names, known names, static defaults, default factories) of a dataclass."""
    spec = _FAST.get(cls)
    if spec is None:
        fs = fields(cls)
        required = frozenset(f.name for f in fs if f.default is MISSING and f.default_factory is MISSING)
        defaults = {f.name: f.default for f in fs if f.default is not MISSING}
        factories = tuple((f.name, f.default_factory) for f in fs if f.default_factory is not MISSING)
        spec = (required, frozenset(f.name for f in fs), defaults, factories)
        _FAST[cls] = spec
    return spec


def fast_new(cls, values: dict):
    """A frozen dataclass from trusted field values, without the per-field cost of __init__.

    Capture builds tens of thousands of nodes and tensors; frozen __init__ sets each field
    through object.__setattr__, which made it a tenth of the capture time.
    """
    _, _, defaults, factories = _fast_spec(cls)
    made = cls.__new__(cls)
    attrs = made.__dict__
    attrs.update(defaults)
    for name, factory in factories:
        if name not in values:
            attrs[name] = factory()
    attrs.update(values)
    return made


def with_fields(obj, **changes):
    """``dataclasses.replace`` for trusted values, at a fraction of its cost."""
    values = {k: v for k, v in obj.__dict__.items() if not k.startswith("_")}
    values.update(changes)
    return fast_new(type(obj), values)


# Optional keys written only when set: keeps 5,000-node traces small.
_SPARSE_KEYS = frozenset(("sample", "min", "max", "mean", "tensor", "value", "freed", "approx", "origin", "cuts",
                          "edge_marks", "hooks", "recomputed", "numpy", "output_nr", "failed_op", "nan_check",
                          "call", "grad_norms", "seq", "created", "scalars", "norm"))
_PRIMITIVES = (int, float, str, bool, type(None))


def _plain(obj: Any) -> Any:
    """Dataclasses to JSON-ready dicts, fast: ``dataclasses.asdict`` deep-copies every value
    and took 12 s on a 50,000-node trace. Lists of plain values are shared, not copied."""
    if hasattr(obj, "__dataclass_fields__"):
        return {
            k: _plain(v)
            for k, v in obj.__dict__.items()
            if not k.startswith("_") and not (k in _SPARSE_KEYS and (v is None or (v is False and k in ("freed", "approx"))))
        }
    if isinstance(obj, list):
        for item in obj:
            if type(item) not in _PRIMITIVES:
                return [_plain(v) for v in obj]
        return obj
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items() if not (isinstance(k, str) and k.startswith("_"))}
    if isinstance(obj, tuple):
        return [_plain(v) for v in obj]
    return obj
