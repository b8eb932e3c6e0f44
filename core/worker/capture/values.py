"""Bounded previews of tensor values: every value of small tensors, else a sample and statistics.

Used by the snapshot (tensors of a graph), the stepper (gradients on edges) and the capture
(seeds, ``autograd.grad`` results). Previews are computed in bulk on the tensor's own
device (``ValueBatch``); statistics are exact unless a bound forbids it, and then say ``approx``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

import torch

try:  # torch's own helpers for its dispatch-mode stacks (private; a worker may run an older torch)
    from torch.utils._python_dispatch import _disable_current_modes
except ImportError:
    _disable_current_modes = None
try:
    from torch._ops import _len_torch_dispatch_stack_pre_dispatch
except ImportError:
    def _len_torch_dispatch_stack_pre_dispatch() -> int:
        return 0

from core.model.trace import Values, fast_new

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
# elements: from here up to STACK_LIMIT, each tensor of a group is reduced where it lies and only
# the results are stacked. At this width a stack costs as much CPU as the per-tensor calls it saves,
# and it writes a 16 MB copy of the script's weights (a residual MLP's 800 256 x 256 weights and
# their grads: 400 MB copied) that evicts the script's own data from the caches.
IN_PLACE_WIDTH = 1 << 15
CHUNK_ELEMENTS = 1 << 22  # elements copied at once when stacking (16 MB of float32)


def script_modes_active() -> bool:
    """Whether a TorchDispatchMode is active (the script's own, or one of torch.compile's)."""
    return bool(torch._C._len_torch_dispatch_stack() or _len_torch_dispatch_stack_pre_dispatch())


@contextmanager
def own_ops():
    """The capture's own tensor ops (previews, detaches) run with the dispatch modes set aside, so
    a script's TorchDispatchMode neither sees them (its op counts stay its own) nor has to handle
    them (a mode unwraps a saved scalar into a Python number, which ``detach`` then refuses)."""
    if _disable_current_modes is None or not script_modes_active():
        yield
        return
    with _disable_current_modes():
        yield


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
    with own_ops():
        batch = ValueBatch()
        out: dict = {}
        batch.add(out, "values", t, full=_numel(t) <= full_limit, sample=SAMPLE_VALUES if full_limit else 8)
        batch.flush()
    return out["values"]


def _numel(t: torch.Tensor) -> int:
    """``t.numel()`` as an int (0 where a tensor subclass cannot say)."""
    try:
        return int(t.numel())
    except Exception:
        return 0


def _unravel(index: torch.Tensor, shape) -> tuple[torch.Tensor, ...]:
    """``torch.unravel_index`` for non-negative indices. The torch function imports sympy on its
    first call (half a second in every worker that previews a transposed weight)."""
    coords = []
    for size in reversed(shape):
        coords.append(index % size)
        index = index // size
    return tuple(reversed(coords))


def _flat_head(t: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` elements in row-major order, without copying the whole tensor."""
    if t.is_contiguous():
        return t.reshape(-1)[:count]
    index = torch.arange(min(count, t.numel()), device=t.device)
    return t[_unravel(index, t.shape)]


def _stats_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.device.type == "mps" else torch.float64


def _strided_sample(t: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` evenly spaced elements of ``t`` (a view when ``t`` is contiguous)."""
    numel = t.numel()
    step = max(1, numel // count)
    if t.is_contiguous():
        return t.reshape(-1)[::step][:count]
    index = torch.arange(0, step * count, step, device=t.device)
    return t[_unravel(index, t.shape)]


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
        try:
            if script_modes_active():
                with own_ops():
                    t = t.detach()
            else:
                t = t.detach()
            numel = int(t.numel())
            plain = t.layout == torch.strided and not t.is_nested and not t.is_meta
        except Exception:  # a tensor subclass that refuses these: its size alone, where it has one
            target[key] = Values(numel=_numel(t))
            return
        if not plain:
            target[key] = Values(numel=numel)
        elif full or numel == 0:
            self._full.append((target, key, t))
        else:
            self._summary.append((target, key, t, sample))

    def flush(self) -> None:
        """Compute every pending preview and drop the references to the tensors."""
        full, summary = self._full, self._summary
        self._full, self._summary = [], []
        if not full and not summary:
            return
        with own_ops():
            self._flush(full, summary)

    def _flush(self, full, summary) -> None:
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
            if width >= IN_PLACE_WIDTH and not approx:
                self._flush_in_place(items)
                continue
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
    def _flush_in_place(cls, items) -> None:
        """Tensors of one shape reduced one by one without a copy, with one host copy for all."""
        cls._flush_rows(items, lambda: (torch.stack([_one_stats(t) for _, _, t, _, _ in items]),
                                        torch.stack([_flat_head(t, items[0][3]) for _, _, t, _, _ in items])))

    @classmethod
    def _flush_stacked(cls, items, approx: bool) -> None:
        def reduce():
            rows = torch.stack([r.reshape(-1) for *_, r in items])
            if approx:  # the preview's first values come from the tensors, not the sample
                heads = torch.stack([_flat_head(t, items[0][3]) for _, _, t, _, _ in items])
            else:
                heads = rows[:, :items[0][3]]
            return _reduce_rows(rows), heads

        cls._flush_rows(items, reduce, approx)

    @classmethod
    def _flush_rows(cls, items, reduce, approx: bool = False) -> None:
        """Values of same-shape tensors from ``reduce()``: their (min, max, mean) rows and their
        first values' rows, each read to the host at once; one by one where that fails."""
        try:
            stats, heads = reduce()
            width = heads.shape[1]
            stats, samples = _plain_list(stats.reshape(-1)), _plain_list(heads.reshape(-1))
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
