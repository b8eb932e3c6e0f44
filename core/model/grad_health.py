"""Gradient health of a run: module × call norms, vanishing and exploding flags, clipping and steps.

Reads what the capture recorded (``CallInfo.grad_norms`` and ``Trace.grad_events``, described in
``docs/trace-format.md``); Qt-free, so the heatmap, the Calls list and ``main.py trace`` share it.

- *vanishing*: a module's norm in a call is under ``vanish_ratio`` (1e-3) × the largest module norm
  of that call; flagged once per module, at the first call where it happens.
- *exploding*: a module's norm rose at every one of ``grow_calls`` (3) consecutive calls (strictly,
  call to call) and the last is at least ``grow_factor`` (10) × the first; flagged at the first of
  those calls. A norm that became inf counts as a rise.
- *skipped steps*: a ``GradScaler.step`` that found inf/NaN in the (scaled) gradients ran no
  optimizer step, and its ``update()`` cut the loss scale (by ``backoff_factor``, 0.5).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property

from core.model.trace import Trace

VANISH_RATIO = 1e-3
GROW_CALLS = 3
GROW_FACTOR = 10.0


def module_of(name: str) -> str:
    """The module a parameter's norm is counted under: ``"fc1"`` for ``"fc1.weight"``; a plain
    tensor (``"w"``) is a row of its own."""
    return name.rsplit(".", 1)[0] if "." in name else name


def as_norm(x: float | None):
    """A norm as the trace writes it: a number, or "nan" / "inf" (JSON has neither)."""
    if x is None or math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else "inf"


def norm_ratio(a: float, b: float):
    """‖grad‖ / ‖param‖ (or ‖Δparam‖ / ‖param‖) as the trace writes it; None where ‖param‖ is 0 or not finite."""
    return as_norm(a / b) if b > 0 and math.isfinite(b) else None


def module_norms(names: list[str], norms: list[float]) -> dict[str, float]:
    """Per module, in the order its first parameter comes, the norm over its parameters: sqrt of
    the sum of their squared norms, summed in ``names``' order (so the same floats give the same
    bits, which lets the wire leave them out: ``core.protocol.norm_pack``)."""
    squares: dict[str, float] = {}
    for name, n in zip(names, norms):
        m = module_of(name)
        squares[m] = squares.get(m, 0.0) + n * n
    return {m: math.sqrt(s) for m, s in squares.items()}


def _float(v) -> float | None:
    """A recorded norm as a float: numbers as they are, "inf" / "nan" as floats, null as None."""
    if v is None:
        return None
    return float(v)


def _natural(path: str) -> list:
    """Sort key putting ``layers.2`` before ``layers.10``: the order modules are usually built in."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", path) if p]


@dataclass(frozen=True)
class NormMatrix:
    """Module × call gradient norms: ``values[i][j]`` is module ``modules[i]`` in call ``calls[j]``
    (None: the call's graph did not reach it)."""

    modules: list[str]
    calls: list[int]  # call indices, in order
    values: list[list[float | None]]

    def row(self, module: str) -> list[float | None]:
        return self.values[self.modules.index(module)]

    @cached_property
    def log_range(self) -> tuple[float, float] | None:
        """log10 of the smallest and largest finite, positive norm: the heatmap's colour scale."""
        logs = [math.log10(v) for r in self.values for v in r if v is not None and 0 < v < math.inf]
        return (min(logs), max(logs)) if logs else None

    def shade(self, value: float | None) -> float | None:
        """Where a norm falls on the log colour scale, 0 (smallest) to 1 (largest); inf is 1, 0 is 0,
        None / nan (no colour) is None."""
        span = self.log_range
        if value is None or math.isnan(value) or span is None:
            return None
        if value <= 0:
            return 0.0
        if math.isinf(value):
            return 1.0
        lo, hi = span
        return 0.5 if hi == lo else min(1.0, max(0.0, (math.log10(value) - lo) / (hi - lo)))

    def largest(self, column: int) -> float:
        """The largest finite module norm of a call (0 when it has none)."""
        finite = [r[column] for r in self.values if r[column] is not None and math.isfinite(r[column])]
        return max(finite, default=0.0)


@dataclass(frozen=True)
class Flag:
    kind: str  # "vanishing" or "exploding"
    module: str
    call: int  # the call index where it starts
    calls: int  # vanishing: in how many calls it holds; exploding: how many calls the rise spans
    first: float | None = None  # exploding: the norm where the rise starts; vanishing: the module's norm
    last: float | None = None  # exploding: where it ends; vanishing: the call's largest module norm

    @property
    def text(self) -> str:
        if self.kind == "vanishing":
            return (f"vanishing: {self.module} from call #{self.call}: norm {_fmt(self.first)}, "
                    f"{_fmt(self.first / self.last if self.last else None)} of the largest ({_fmt(self.last)}); "
                    f"in {self.calls} call{'s' if self.calls != 1 else ''}")
        return (f"exploding: {self.module} from call #{self.call}: norm {_fmt(self.first)} → {_fmt(self.last)} "
                f"over {self.calls} calls")


@dataclass(frozen=True)
class ScalerStep:
    """One ``GradScaler.step``: the loss scale it ran with, whether inf/NaN in the gradients skipped
    the optimizer's step, and the scale its ``update()`` left (None: no update recorded)."""

    call: int | None  # the call it follows (the scaled loss's backward)
    line: int | None
    optimizer: str
    scale: float
    skipped: bool
    scale_after: float | None

    @property
    def note(self) -> str:
        """``scale 65536``, or ``step skipped: inf/NaN in gradients, scale 65536 → 32768``."""
        change = f" → {_scale(self.scale_after)}" if self.scale_after not in (None, self.scale) else ""
        if self.skipped:
            return f"step skipped: inf/NaN in gradients, scale {_scale(self.scale)}{change}"
        return f"scale {_scale(self.scale)}{change}"


@dataclass(frozen=True)
class GradHealth:
    matrix: NormMatrix
    flags: list[Flag]
    events: dict[int | None, list[dict]] = field(default_factory=dict)  # call index -> events after it
    scaler_steps: list[ScalerStep] = field(default_factory=list)  # every GradScaler.step, in order

    @property
    def skipped(self) -> list[ScalerStep]:
        """The GradScaler steps that inf/NaN in the gradients skipped."""
        return [s for s in self.scaler_steps if s.skipped]


def norm_matrix(trace: Trace) -> NormMatrix:
    """Every call with recorded norms, one column each. Modules go from the input to the loss:
    backward reaches the last layers first, so each call's modules, in the order its parameters
    were reached, are read in reverse."""
    cols = [c for c in sorted(trace.calls, key=lambda c: c.index) if c.grad_norms]
    modules: dict[str, None] = {}
    for c in cols:
        reached = dict.fromkeys(entry["module"] for entry in c.grad_norms["params"].values())
        modules.update((m, None) for m in reversed(reached) if m not in modules)
    modules = list(modules)
    values = [[_float(c.grad_norms["modules"].get(m)) for c in cols] for m in modules]
    return NormMatrix(modules=modules, calls=[c.index for c in cols], values=values)


def vanishing(matrix: NormMatrix, ratio: float = VANISH_RATIO) -> list[Flag]:
    flags = []
    for i, module in enumerate(matrix.modules):
        hits = []
        for j, v in enumerate(matrix.values[i]):
            top = matrix.largest(j)
            if v is not None and top > 0 and v < ratio * top:
                hits.append((j, v, top))
        if hits:
            j, v, top = hits[0]
            flags.append(Flag("vanishing", module, matrix.calls[j], len(hits), v, top))
    return flags


def exploding(matrix: NormMatrix, calls: int = GROW_CALLS, factor: float = GROW_FACTOR) -> list[Flag]:
    flags = []
    for i, module in enumerate(matrix.modules):
        row = matrix.values[i]
        for start in range(len(row) - calls + 1):
            window = row[start:start + calls]
            if any(v is None or math.isnan(v) for v in window) or window[0] <= 0 or math.isinf(window[0]):
                continue
            if all(b > a for a, b in zip(window, window[1:])) and window[-1] >= factor * window[0]:
                flags.append(Flag("exploding", module, matrix.calls[start], calls, window[0], window[-1]))
                break
    return flags


def events_by_call(trace: Trace) -> dict[int | None, list[dict]]:
    """The clipping, step and zero_grad events, under the index of the call each follows."""
    out: dict[int | None, list[dict]] = {}
    for event in trace.grad_events:
        out.setdefault(event["after_call"], []).append(event)
    return out


def scaler_steps(trace: Trace) -> list[ScalerStep]:
    """Every recorded ``GradScaler.step``, in the order the script made them."""
    return [ScalerStep(call=e["after_call"], line=e["line"], optimizer=e["optimizer"], scale=float(e["scale"]),
                       skipped=e["skipped"], scale_after=_float(e["scale_after"]))
            for e in trace.grad_events if e["kind"] == "scaler.step"]


def grad_health(trace: Trace, vanish_ratio: float = VANISH_RATIO, grow_calls: int = GROW_CALLS,
                grow_factor: float = GROW_FACTOR) -> GradHealth:
    matrix = norm_matrix(trace)
    flags = vanishing(matrix, vanish_ratio) + exploding(matrix, grow_calls, grow_factor)
    flags.sort(key=lambda f: (f.call, f.kind, _natural(f.module)))
    return GradHealth(matrix=matrix, flags=flags, events=events_by_call(trace), scaler_steps=scaler_steps(trace))


def _fmt(v) -> str:
    if v is None:
        return "-"
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}"


def _scale(v: float | None) -> str:
    """A loss scale as written: whole numbers in full (65536, not 6.55e+04); they are powers of 2."""
    if v is None:
        return "-"
    return str(int(v)) if math.isfinite(v) and float(v).is_integer() and abs(v) < 1e15 else _fmt(v)


def event_text(event: dict) -> str:
    """One line per clipping / step event, e.g. ``clip_grad_norm_ (line 30): 12.3 → 1 (× 0.0813)``."""
    where = f" (line {event['line']})" if event.get("line") else ""
    kind = event["kind"]
    if kind == "clip_grad_norm_":
        return (f"clip_grad_norm_{where}: max {_fmt(event['max_norm'])}, norm {_fmt(event['total_norm'])} → "
                f"{_fmt(event['norm_after'])} (× {_fmt(event['clip_coef'])})")
    if kind == "clip_grad_value_":
        return (f"clip_grad_value_{where}: ±{_fmt(event['clip_value'])}, norm {_fmt(event['total_norm'])} → "
                f"{_fmt(event['norm_after'])}")
    if kind == "clip_grads_with_norm_":
        return (f"clip_grads_with_norm_{where}: max {_fmt(event['max_norm'])}, norm {_fmt(event['total_norm'])} → "
                f"{_fmt(event['norm_after'])} (× {_fmt(event['clip_coef'])})")
    if kind == "get_total_norm":
        return f"get_total_norm{where}: norm {_fmt(event['total_norm'])} over {event['tensors']} tensors"
    if kind == "scaler.step":
        step = ScalerStep(event["after_call"], event["line"], event["optimizer"], float(event["scale"]),
                          event["skipped"], _float(event["scale_after"]))
        return f"GradScaler.step({event['optimizer']}){where}: {step.note}"
    if kind == "optimizer.step":
        update = ", ".join(f"{m} {_fmt(v)}" for m, v in sorted(event["update"].items(), key=lambda kv: _natural(kv[0])))
        return f"{event['optimizer']}.step{where}: ‖Δ‖/‖param‖ {update}"
    return f"{kind}{where}"


def event_brief(event: dict) -> str:
    """A few words per event for the Calls list row of the call it follows: ``clipped 886 → 1``,
    ``SGD.step ‖Δ‖/‖p‖ ≤ 0.0123``, ``zero_grad``; "" for a GradScaler step (its row says it itself)."""
    kind = event["kind"]
    if kind in ("clip_grad_norm_", "clip_grads_with_norm_"):
        coef = _float(event["clip_coef"])
        if coef is not None and coef >= 1.0:
            return f"clip: norm {_fmt(event['total_norm'])} under max {_fmt(event['max_norm'])}"
        return f"clipped {_fmt(event['total_norm'])} → {_fmt(event['norm_after'])}"
    if kind == "clip_grad_value_":
        return f"clipped to ±{_fmt(event['clip_value'])}: norm {_fmt(event['total_norm'])} → {_fmt(event['norm_after'])}"
    if kind == "get_total_norm":
        return f"total norm {_fmt(event['total_norm'])}"
    if kind == "optimizer.step":
        sizes = [v for v in (_float(x) for x in event["update"].values()) if v is not None]
        finite = [v for v in sizes if math.isfinite(v)]
        if len(finite) < len(sizes):
            return f"{event['optimizer']}.step ‖Δ‖/‖p‖ nan"
        return f"{event['optimizer']}.step ‖Δ‖/‖p‖ ≤ {_fmt(max(finite))}" if finite else f"{event['optimizer']}.step"
    if kind == "scaler.step":
        return ""
    return kind


def report(trace: Trace, max_calls: int = 8, **thresholds) -> str:
    """The headless report: norms per module over the calls (the first and last few when there are
    more than ``max_calls``), the flags, and the events after each call shown."""
    health = grad_health(trace, **thresholds)
    m = health.matrix
    if not m.calls:
        return "gradient norms: none recorded"
    shown = list(range(len(m.calls)))
    if len(shown) > max_calls:
        shown = shown[: max_calls // 2] + shown[-(max_calls - max_calls // 2):]
    width = max([len("module")] + [len(x) for x in m.modules])
    head = f"{'module':<{width}}  " + "  ".join(f"{'#' + str(m.calls[j]):>9}" for j in shown)
    lines = [f"gradient norms: {len(m.modules)} modules × {len(m.calls)} calls", head]
    for i, module in enumerate(m.modules):
        lines.append(f"{module:<{width}}  " + "  ".join(f"{_fmt(m.values[i][j]):>9}" for j in shown))
    lines.append("flags: " + ("none" if not health.flags else str(len(health.flags))))
    lines += ["  " + f.text for f in health.flags]
    if health.scaler_steps:
        lines.append(f"GradScaler: {len(health.scaler_steps)} steps, {len(health.skipped)} skipped")
        lines += [f"  after #{s.call}" + (f" (line {s.line})" if s.line else "") + f": {s.note}" for s in health.skipped]
    for j in shown:
        for event in health.events.get(m.calls[j], []):
            if event["kind"] != "zero_grad":
                lines.append(f"after #{m.calls[j]}: {event_text(event)}")
    return "\n".join(lines)
