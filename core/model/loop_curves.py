"""The curves of a training loop: the loss and the small leaves per backward call, norms of the big ones.

Reads what the capture recorded (``CallInfo.scalars``, ``CallInfo.grad_norms``, described in
``docs/trace-format.md``); Qt-free, so the Curves panel and ``main.py export --curves`` share it.
x is the call index. Series, in the order the panel lists them:

- ``loss``: the root's value, for calls that started from one one-element tensor;
- ``w`` / ``w[1]``: each element of a small named leaf (one series per element), and ``w.grad`` /
  ``w.grad[1]``: its ``.grad`` after the call;
- ``‖fc1.weight‖`` and ``‖fc1.weight.grad‖``: for leaves too big for their elements, the L2 norm of
  the parameter and of its grad from ``grad_norms``.

The loss and the leaves' values are shown by default; grads and norms are there to tick.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from core.model.trace import Trace

GROUPS = ("loss", "value", "grad", "norm")  # one plot each, top to bottom
GROUP_TITLES = {"loss": "loss", "value": "values", "grad": "gradients", "norm": "norms"}
LOG_GROUPS = frozenset(("loss", "norm"))  # the plots a log y axis fits


@dataclass(frozen=True)
class Series:
    key: str  # what the list and the legend show: "loss", "w[1]", "w.grad", "‖fc1.weight‖"
    group: str  # one of GROUPS: the plot it is drawn in
    leaf: str | None  # the leaf it follows (None: the loss)
    xs: list[int]  # call indices, increasing
    ys: list[float]  # its value at each (nan, inf and -inf as floats)
    shown: bool  # ticked by default

    def at(self, x: float) -> tuple[int, float] | None:
        """The point nearest call ``x``: (call index, value), None when the series is empty."""
        if not self.xs:
            return None
        i = min(range(len(self.xs)), key=lambda k: abs(self.xs[k] - x))
        return self.xs[i], self.ys[i]


@dataclass(frozen=True)
class LoopCurves:
    series: list[Series]
    calls: list[int]  # every call index with something recorded

    def get(self, key: str) -> Series | None:
        return next((s for s in self.series if s.key == key), None)

    def in_group(self, group: str) -> list[Series]:
        return [s for s in self.series if s.group == group]


def _float(v) -> float:
    """A recorded number as a float: "nan" / "inf" / "-inf" included."""
    return float(v)


def _natural(name: str) -> list:
    """``layers.2`` before ``layers.10``."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p]


def _element_keys(name: str, count: int, grad: bool) -> list[str]:
    base = f"{name}.grad" if grad else name
    return [base] if count == 1 else [f"{base}[{i}]" for i in range(count)]


def loop_curves(trace: Trace) -> LoopCurves:
    calls = sorted(trace.calls, key=lambda c: c.index)
    loss_x, loss_y = [], []
    points: dict[str, tuple[list, list]] = {}  # series key -> (xs, ys)
    small: dict[str, int] = {}  # leaf name -> elements (the most seen)
    for c in calls:
        s = c.scalars
        if not s:
            continue
        if s.get("loss") is not None:
            loss_x.append(c.index)
            loss_y.append(_float(s["loss"]))
        for grad, part in ((False, s.get("values") or {}), (True, s.get("grads") or {})):
            for name, elements in part.items():
                small[name] = max(small.get(name, 0), len(elements))
                for key, v in zip(_element_keys(name, len(elements), grad), elements):
                    xs, ys = points.setdefault(key, ([], []))
                    xs.append(c.index)
                    ys.append(_float(v))
    big: dict[str, None] = {}
    for c in calls:
        params = (c.grad_norms or {}).get("params") or {}
        for name, entry in params.items():
            if name in small:
                continue
            big.setdefault(name, None)
            for key, field in ((f"‖{name}‖", "param"), (f"‖{name}.grad‖", "grad")):
                if entry.get(field) is not None:
                    xs, ys = points.setdefault(key, ([], []))
                    xs.append(c.index)
                    ys.append(_float(entry[field]))
    series = []
    if loss_x:
        series.append(Series("loss", "loss", None, loss_x, loss_y, True))
    for grad in (False, True):
        for name in sorted(small, key=_natural):
            for key in _element_keys(name, small[name], grad):
                if key in points:
                    xs, ys = points[key]
                    series.append(Series(key, "grad" if grad else "value", name, xs, ys, not grad))
    for name in sorted(big, key=_natural):
        for key in (f"‖{name}‖", f"‖{name}.grad‖"):
            if key in points:
                series.append(Series(key, "norm", name, *points[key], False))
    recorded = sorted({x for s in series for x in s.xs})
    return LoopCurves(series=series, calls=recorded)


def value_text(v: float) -> str:
    """A point as the readout writes it: 4 significant digits, or nan / inf."""
    return str(v) if not math.isfinite(v) else f"{v:.4g}"
