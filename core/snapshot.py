"""Snapshot a live grad_fn DAG into trace dataclasses (runs in the worker, imports torch).

The walk uses an explicit stack and a visited map, never recursion, so a 200-step unrolled
RNN or a 50,000-node graph does not hit Python's recursion limit. Which ``_saved_*``
attributes a node type has is cached per type: calling ``dir()`` on every node costs as
much as the computation on small tensors.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from typing import Any, Callable

import torch

from core.trace import Edge, GradInfo, NodeInfo, Saved, Stale, StorageInfo, TensorInfo, Values, fast_new, with_fields

FULL_VALUES = 1000
SAMPLE_VALUES = 24
VALUE_BUDGET = 6_000
EXACT_LIMIT = 1 << 28  # elements: statistics of a bigger tensor come from a strided sample (approx)
# Elements of CPU tensors one snapshot reduces exactly; past it, statistics come from a strided
# sample (approx). On a CPU a full pass over every weight, grad and activation of GPT-2 small
# (~300 M elements) would cost seconds; on an accelerator it is milliseconds, so no budget there.
CPU_EXACT_BUDGET = 1 << 25
APPROX_SAMPLE = 4096  # elements of that sample
STACK_LIMIT = 1 << 16  # elements: smaller tensors of one shape are previewed stacked together
CHUNK_ELEMENTS = 1 << 22  # elements copied at once when stacking (16 MB of float32)

_saved_attrs_cache: dict[type, tuple[str, ...]] = {}


def saved_attr_names(node) -> tuple[str, ...]:
    cls = type(node)
    names = _saved_attrs_cache.get(cls)
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_saved_"))
        _saved_attrs_cache[cls] = names
    return names


def grad_fn_of(t: torch.Tensor):
    """``t.grad_fn``, or None where reading it would raise.

    Reading the grad_fn of a view made under ``no_grad`` whose base was later changed in
    place with grad mode on raises, although the script itself never reads it (BERT's
    weight initialisation does this). Capture must not turn that into the script's error.
    """
    if not t.requires_grad:
        return None
    try:
        return t.grad_fn
    except RuntimeError:
        return None


def node_kind(node) -> str:
    name = node.name()
    if name == "torch::autograd::AccumulateGrad" or name == "AccumulateGrad":
        return "accumulate_grad"
    if isinstance(node, torch.autograd.function.BackwardCFunction):
        return "custom"
    return "backward"


def node_name(node) -> str:
    name = node.name()
    if name.startswith("torch::autograd::"):
        name = name[len("torch::autograd::"):]
    return name


def _json_number(x: Any) -> Any:
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
    if isinstance(x, complex):
        return str(x)
    return x


def _plain_list(flat: torch.Tensor) -> list:
    """A small 1-d tensor as JSON-ready Python values (on the CPU)."""
    if flat.device.type != "cpu":
        flat = flat.cpu()
    if flat.is_complex():
        return [str(v) for v in flat.tolist()]
    if flat.dtype in (torch.float16, torch.bfloat16) or (flat.is_floating_point() and flat.element_size() < 2):
        flat = flat.float()
    values = flat.tolist()
    if flat.is_floating_point():
        for v in values:
            if not math.isfinite(v):
                return [_json_number(x) for x in values]
    return values


def values_of(t: torch.Tensor, full_limit: int = FULL_VALUES) -> Values:
    """A bounded preview: every value up to ``full_limit`` elements, else a sample and stats."""
    batch = ValueBatch()
    out: dict = {}
    batch.add(out, "values", t, full=t.numel() <= full_limit, sample=SAMPLE_VALUES if full_limit else 8)
    batch.flush()
    return out["values"]


def _flat_head(t: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` elements in row-major order, without copying the whole tensor."""
    if t.is_contiguous():
        return t.reshape(-1)[:count]
    index = torch.arange(min(count, t.numel()), device=t.device)
    return t[torch.unravel_index(index, t.shape)]


def _stats_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.device.type == "mps" else torch.float64


def _strided_sample(t: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` evenly spaced elements of ``t`` (a view when ``t`` is contiguous)."""
    numel = t.numel()
    step = max(1, numel // count)
    if t.is_contiguous():
        return t.reshape(-1)[::step][:count]
    index = torch.arange(0, step * count, step, device=t.device)
    return t[torch.unravel_index(index, t.shape)]


def _reduce_rows(rows: torch.Tensor) -> torch.Tensor:
    """min, max, mean of each row of a 2-d tensor, as one (rows x 3) tensor in float64."""
    acc = _stats_dtype(rows)
    lo, hi = rows.amin(1), rows.amax(1)
    if rows.is_floating_point():
        mean = rows.mean(1, dtype=torch.float32) if rows.element_size() < 4 else rows.mean(1)
    else:
        mean = rows.sum(1, dtype=acc) / rows.shape[1]
    return torch.stack((lo.to(acc), hi.to(acc), mean.to(acc)), 1)


def _one_stats(t: torch.Tensor) -> torch.Tensor:
    """Exact min, max, mean of one tensor, on its own device, without copying it."""
    acc = _stats_dtype(t)
    lo, hi = torch.aminmax(t)
    if t.is_floating_point():
        mean = t.mean(dtype=torch.float32) if t.element_size() < 4 else t.mean()
    else:
        mean = t.sum(dtype=acc) / t.numel()
    return torch.stack((lo.to(acc), hi.to(acc), mean.to(acc)))


class ValueBatch:
    """Previews of many tensors computed together, on their own device, in bounded chunks.

    One snapshot may preview thousands of tensors; computing each alone costs a few torch
    calls and a host copy per tensor, which on tiny tensors is more than the script's own
    work. Here small tensors of one shape, dtype and device are stacked (at most
    CHUNK_ELEMENTS at a time, so the copy stays small next to the script's memory) and
    reduced together, with one copy to the host per chunk; big tensors are reduced in place.
    Statistics are exact (over every element) except for tensors past EXACT_LIMIT elements
    and for CPU tensors once the batch has reduced CPU_EXACT_BUDGET elements: those are
    taken over APPROX_SAMPLE evenly spaced elements and say ``approx``.
    """

    def __init__(self, cpu_budget: int | None = None):
        # elements of CPU tensors still reduced exactly
        self.cpu_budget = CPU_EXACT_BUDGET if cpu_budget is None else cpu_budget
        self._full: list[tuple] = []
        self._summary: list[tuple] = []

    def add(self, target: dict, key: str, t: torch.Tensor, full: bool, sample: int = SAMPLE_VALUES) -> None:
        """Set ``target[key]`` to the tensor's Values at the next ``flush()``: every value when
        ``full``, else its first ``sample`` values and statistics."""
        t = t.detach()
        numel = t.numel()
        if t.layout != torch.strided or t.is_nested or t.is_meta:
            target[key] = Values(numel=numel)
        elif full or numel == 0:
            self._full.append((target, key, t))
        else:
            self._summary.append((target, key, t, sample))

    def flush(self) -> None:
        """Compute every pending preview and drop the references to the tensors."""
        full, summary = self._full, self._summary
        self._full, self._summary = [], []
        groups: dict[tuple, list] = {}
        for item in full:
            groups.setdefault((item[2].device, item[2].dtype), []).append(item)
        for items in groups.values():
            self._flush_full(items)
        groups = {}
        for target, key, t, count in summary:
            numel = t.numel()
            if t.is_complex() or t.dtype == torch.bool:
                self._flush_plain(target, key, t, count)
                continue
            rows, approx = t, False
            if numel > STACK_LIMIT:
                exact = numel <= EXACT_LIMIT and (t.device.type != "cpu" or numel <= self.cpu_budget)
                if exact:
                    if t.device.type == "cpu":
                        self.cpu_budget -= numel
                    self._flush_one(target, key, t, count)
                    continue
                rows, approx = _strided_sample(t, APPROX_SAMPLE), True
            groups.setdefault((t.device, t.dtype, rows.numel(), count, approx), []).append(
                (target, key, t, count, rows))
        for (_, _, width, _, approx), items in groups.items():
            per = max(1, CHUNK_ELEMENTS // max(1, width))
            for start in range(0, len(items), per):
                self._flush_stacked(items[start:start + per], approx)

    @staticmethod
    def _flush_full(items) -> None:
        try:
            values = _plain_list(torch.cat([t.reshape(-1) for _, _, t in items]))
        except Exception:  # unreadable tensors: each alone, so one does not spoil the rest
            for target, key, t in items:
                try:
                    target[key] = fast_new(Values, {"numel": t.numel(), "data": _plain_list(t.reshape(-1))})
                except Exception:
                    target[key] = Values(numel=t.numel())
            return
        pos = 0
        for target, key, t in items:
            n = t.numel()
            target[key] = fast_new(Values, {"numel": n, "data": values[pos:pos + n]})
            pos += n

    @staticmethod
    def _flush_plain(target, key, t, count) -> None:
        try:
            target[key] = Values(numel=t.numel(), sample=_plain_list(_flat_head(t, count)))
        except Exception:
            target[key] = Values(numel=t.numel())

    @staticmethod
    def _flush_one(target, key, t, count) -> None:
        try:
            sample = _plain_list(_flat_head(t, count))
            lo, hi, mean = _plain_list(_one_stats(t))
            target[key] = fast_new(Values, {"numel": t.numel(), "sample": sample, "min": lo, "max": hi,
                                            "mean": mean})
        except Exception:  # unreadable tensors
            target[key] = Values(numel=t.numel())

    @classmethod
    def _flush_stacked(cls, items, approx: bool) -> None:
        try:
            rows = torch.stack([r.reshape(-1) for *_, r in items])
            stats = _plain_list(_reduce_rows(rows).reshape(-1))
            count = items[0][3]
            if approx:  # the preview's first values come from the tensors, not the sample
                heads = torch.stack([_flat_head(t, count) for _, _, t, _, _ in items])
            else:
                heads = rows[:, :count]
            width = heads.shape[1]
            samples = _plain_list(heads.reshape(-1))
        except Exception:
            for target, key, t, count, _ in items:
                cls._flush_one(target, key, t, count)
            return
        for i, (target, key, t, _, _) in enumerate(items):
            values = {"numel": t.numel(), "sample": samples[i * width:(i + 1) * width],
                      "min": stats[3 * i], "max": stats[3 * i + 1], "mean": stats[3 * i + 2]}
            if approx:
                values["approx"] = True
            target[key] = fast_new(Values, values)


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _saved_value(value: Any) -> Any:
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return _json_number(value)
    if isinstance(value, (torch.Size, tuple, list)):
        return [_saved_value(v) for v in value]
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    return repr(value)


class Snapshotter:
    """Collects nodes, tensors and storages of one snapshot; tensor ids are shared across it."""

    def __init__(self, names: Callable[[torch.Tensor], str | None], module_paths: dict[int, str] | None = None,
                 inplace: dict[int, list] | None = None):
        self.names = names
        self.inplace = inplace or {}
        self.module_paths = module_paths or {}
        self.tensors: dict[int, dict] = {}  # key -> raw fields
        # tensor id -> live tensor, for the grads read after the call; ``release()`` keeps only the
        # tensors that can get one, so the snapshot never keeps an activation alive through backward.
        self.objects: dict[str, torch.Tensor] = {}
        self.by_key: dict[int, str] = {}
        self.by_layout: dict[tuple, str] = {}
        self.storages: dict[tuple, str] = {}
        self.storage_nbytes: dict[str, tuple[int, str]] = {}
        # Big graphs: once this many values are stored, further tensors keep a sample and stats.
        self.value_budget = VALUE_BUDGET
        self._batch = ValueBatch()
        self.walked: list = []  # node wrappers of the last walk, in preorder

    # -- tensors --------------------------------------------------------------------------
    def storage_id(self, t: torch.Tensor) -> str | None:
        try:
            st = t.untyped_storage()
            return self._storage_key(str(t.device), st.data_ptr(), st.nbytes())
        except Exception:
            return None

    def _storage_key(self, device: str, ptr: int, nbytes: int) -> str | None:
        if ptr == 0:
            return None
        key = (device, ptr, nbytes)
        sid = self.storages.get(key)
        if sid is None:
            sid = f"s{len(self.storages)}"
            self.storages[key] = sid
            self.storage_nbytes[sid] = (nbytes, device)
        return sid

    def tensor_id(self, t: torch.Tensor, saved: bool = False) -> str:
        key = t._cdata
        tid = self.by_key.get(key)
        if tid is not None:
            return tid
        device = str(t.device)
        try:
            st = t.untyped_storage()
            ptr, nbytes = st.data_ptr(), st.nbytes()
            offset, stride = t.storage_offset(), t.stride()
        except Exception:  # sparse, nested and other storage-less tensors
            ptr, nbytes, offset, stride = 0, 0, 0, ()
        layout = (device, ptr, offset, tuple(t.shape), stride, t.dtype)
        if saved and ptr != 0 and layout in self.by_layout:
            # A saved output unpacks as a new tensor object over the same data: same tensor.
            return self.by_layout[layout]
        tid = f"t{len(self.tensors)}"
        self.by_key[key] = tid
        if ptr != 0:
            self.by_layout.setdefault(layout, tid)
        self.objects[tid] = t
        grad_fn = grad_fn_of(t)
        is_leaf = t.is_leaf
        raw = dict(
            id=tid,
            name=self.names(t),
            shape=list(t.shape),
            dtype=dtype_name(t.dtype),
            device=device,
            requires_grad=t.requires_grad,
            is_leaf=is_leaf,
            retains_grad=False if is_leaf else t.retains_grad,
            stride=list(stride),
            storage_offset=offset,
            storage=self._storage_key(device, ptr, nbytes),
            version=t._version,
            values=None,
            is_view=t._is_view(),
            grad_fn_name=node_name(grad_fn) if grad_fn is not None else None,
            element_size=t.element_size(),
            nbytes=nbytes,
            _grad_fn=grad_fn,
        )
        self.tensors[key] = raw
        self._values(raw, "values", t)
        base = t._base
        if base is not None:
            raw["base"] = self.tensor_id(base)
        return tid

    def _values(self, target: dict, key: str, t: torch.Tensor) -> None:
        """Queue ``t``'s preview into ``target[key]`` (computed in bulk by ``flush``)."""
        numel = t.numel()
        if numel <= FULL_VALUES and numel <= self.value_budget:
            self.value_budget -= numel
            self._batch.add(target, key, t, full=True)
        else:
            self._batch.add(target, key, t, full=False, sample=8)

    def release(self, node_ids: dict[int, str]) -> None:
        """Compute the queued previews, then drop every reference the script would not hold:
        node wrappers and all tensors except those that can receive a ``.grad``."""
        self._batch.flush()
        self.walked = []
        for raw in self.tensors.values():
            fn = raw.pop("_grad_fn", None)
            if fn is not None:
                raw["grad_fn"] = node_ids.get(id(fn))
        self.objects = {
            tid: t for tid, t in self.objects.items()
            if (t.requires_grad and t.is_leaf) or (not t.is_leaf and t.retains_grad)
        }

    def finish_tensors(self, node_ids: dict[int, str] | None = None, read_grads: bool = True) -> list[TensorInfo]:
        self._batch.flush()
        raws = []
        for raw in self.tensors.values():
            raw = dict(raw)
            fn = raw.pop("_grad_fn", None)
            if node_ids is not None and fn is not None:
                raw["grad_fn"] = node_ids.get(id(fn))
            t = self.objects.get(raw["id"])
            if t is not None and read_grads and (t.is_leaf or t.retains_grad):
                g = t.grad
                if g is not None:
                    raw["_grad_shape"] = list(g.shape)
                    self._values(raw, "_grad_values", g)
                raw["version"] = t._version
            raws.append(raw)
        self._batch.flush()
        out = []
        for raw in raws:
            shape = raw.pop("_grad_shape", None)
            if shape is not None:
                raw["grad"] = GradInfo(shape=shape, values=raw.pop("_grad_values"))
            out.append(fast_new(TensorInfo, raw))
        return out

    def finish_storages(self, tensors: list[TensorInfo]) -> list[StorageInfo]:
        members: dict[str, list[str]] = {}
        for t in tensors:
            if t.storage is not None:
                members.setdefault(t.storage, []).append(t.id)
        return [
            StorageInfo(id=sid, nbytes=nb, device=dev, tensors=members.get(sid, []))
            for sid, (nb, dev) in self.storage_nbytes.items()
        ]

    # -- graphs ---------------------------------------------------------------------------
    def walk(self, roots: list) -> tuple[list[NodeInfo], dict[int, str], str]:
        """Snapshot every node reachable from ``roots``; returns nodes, id map and a structure hash."""
        order, ids = number_nodes(roots)
        # The wrappers stay alive until ``release()``, so the ``id()`` keys of ``ids`` stay valid.
        self.walked = order
        digest = hashlib.sha1()
        nodes = []
        for node in order:
            info = self._node_info(node, ids)
            nodes.append(info)
            digest.update(info.name.encode())
            for e in info.next:
                digest.update((f"|{e.node}:{e.input_nr}" if e else "|-").encode())
            digest.update(b";")
        return nodes, ids, digest.hexdigest()

    def _node_info(self, node, ids: dict[int, str]) -> NodeInfo:
        kind = node_kind(node)
        nxt = [fast_new(Edge, {"node": ids[id(fn)], "input_nr": nr}) if fn is not None else None
               for fn, nr in node.next_functions]
        saved: list[Saved] = []
        stale = None
        variable = None
        if kind == "accumulate_grad":
            variable = self.tensor_id(node.variable)
        else:
            for attr in saved_attr_names(node):
                name = attr[len("_saved_"):]
                try:
                    value = getattr(node, attr)
                except RuntimeError as exc:
                    msg = str(exc)
                    if "modified by an inplace operation" in msg:
                        stale = stale or _stale_from(name, msg)
                        saved.append(Saved(name=name, freed=False, value="stale"))
                    else:
                        saved.append(Saved(name=name, freed=True))
                    continue
                except Exception:
                    continue
                if isinstance(value, torch.Tensor):
                    saved.append(fast_new(Saved, {"name": name, "tensor": self.tensor_id(value, saved=True)}))
                elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
                    for i, v in enumerate(value):
                        saved.append(Saved(name=f"{name}[{i}]", tensor=self.tensor_id(v, saved=True)))
                else:
                    saved.append(fast_new(Saved, {"name": name, "value": _saved_value(value)}))
        meta = _metadata(node)
        if stale is not None:
            stale = self._stale_culprit(stale, meta.get("bps_storages", ()))
        line = meta.get("bps_line")
        module = self.module_paths.get(meta.get("bps_module")) if meta.get("bps_module") is not None else None
        return fast_new(NodeInfo, dict(
            id=ids[id(node)],
            name=node_name(node),
            kind=kind,
            next=nxt,
            saved=saved,
            variable=variable,
            line=line,
            module=module,
            stale=stale,
            device=meta.get("bps_device"),
            inplace=meta.get("bps_inplace"),
        ))


    def _stale_culprit(self, stale: Stale, storages) -> Stale:
        """Name the in-place op (and its line) that moved a saved tensor past its saved version."""
        for ptr in storages:
            for version, line, op in self.inplace.get(ptr, ()):
                if stale.saved_version is None or version > stale.saved_version:
                    return replace(stale, op=op, op_line=line)
        return stale


def _metadata(node) -> dict:
    try:
        return node.metadata
    except Exception:
        return {}


def _stale_from(name: str, message: str) -> Stale:
    """Parse 'is at version 1; expected version 0 instead' from the engine's message."""
    import re

    now = re.search(r"is at version (\d+)", message)
    then = re.search(r"expected version (\d+)", message)
    return Stale(
        saved=name,
        saved_version=int(then.group(1)) if then else None,
        version=int(now.group(1)) if now else None,
        message=message.split("Hint:")[0].strip(),
    )


def root_nodes(roots) -> list:
    """The graph nodes of backward roots: a tensor's grad_fn (its AccumulateGrad for a leaf), a
    GradientEdge's node, or a node itself. The capture, the stepper and the memory report all
    start from these, so a call's graph is the same graph everywhere."""
    out = []
    for r in roots:
        if isinstance(r, torch.autograd.graph.GradientEdge):
            node = r.node
        elif isinstance(r, torch.Tensor):
            node = r.grad_fn
            if node is None and r.requires_grad:
                node = torch.autograd.graph.get_gradient_edge(r).node
        else:
            node = r if hasattr(r, "next_functions") else None
        if node is not None:
            out.append(node)
    return out


def number_nodes(roots: list) -> tuple[list, dict[int, str]]:
    """Nodes in DFS preorder (explicit stack, no recursion) with ids "n0", "n1", ...

    The capture, the stepper and the memory report all number nodes this way, so their ids
    agree. The returned list keeps the node wrappers alive, so the ``id()`` keys stay valid.
    """
    ids: dict[int, str] = {}
    order: list = []
    stack = [r for r in reversed(roots) if r is not None]
    while stack:
        node = stack.pop()
        if id(node) in ids:
            continue
        ids[id(node)] = f"n{len(ids)}"
        order.append(node)
        for fn, _ in reversed(node.next_functions):
            if fn is not None and id(fn) not in ids:
                stack.append(fn)
    return order, ids


def inherit_origin(nodes: list[NodeInfo]) -> list[NodeInfo]:
    """Nodes made inside C++ ops (the TBackward0 of a Linear) take their consumer's line and module."""
    line: dict[str, int | None] = {n.id: n.line for n in nodes}
    module: dict[str, str | None] = {n.id: n.module for n in nodes}
    for n in nodes:  # walk order lists a node before its inputs
        for e in n.next:
            if e is None:
                continue
            if line.get(e.node) is None and line[n.id] is not None:
                line[e.node] = line[n.id]
                if module.get(e.node) is None:
                    module[e.node] = module[n.id]
    return [
        n if n.kind == "accumulate_grad" or (n.line == line[n.id] and n.module == module[n.id])
        else with_fields(n, line=line[n.id], module=module[n.id])
        for n in nodes
    ]


def label_nodes(nodes: list[NodeInfo], tensors: list[TensorInfo]) -> list[NodeInfo]:
    """Give each node the script name of the tensor whose grad_fn it is."""
    by_node: dict[str, TensorInfo] = {}
    for t in tensors:
        if t.grad_fn is not None and (t.name or t.grad_fn not in by_node):
            if t.grad_fn not in by_node or (t.name and not by_node[t.grad_fn].name):
                by_node[t.grad_fn] = t
    names = {t.id: t.name for t in tensors}
    nodes = inherit_origin(nodes)
    out = []
    for n in nodes:
        t = by_node.get(n.id)
        if t is not None:
            n = with_fields(n, tensor=t.id, label=t.name)
        elif n.variable is not None:
            n = with_fields(n, label=names.get(n.variable))
        out.append(n)
    return out
