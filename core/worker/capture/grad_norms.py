"""Gradient norms per call, gradient clipping and optimizer updates (worker side, imports torch).

Each captured backward call records, for every named leaf its graph reaches (a module's
``fc1.weight``, a script's ``w``), ‖grad‖₂ of what the call left in ``.grad``, ‖param‖₂, their
ratio and, when ``.grad`` already held a gradient, ‖added‖₂ of what this call added; and per
module (the name's path before its last dot) the norm over its parameters. The norms are one
fused ``torch._foreach_norm`` per call over all leaves (and one read back), so a 1,600-parameter
model costs a few milliseconds a call. ``CallInfo.grad_norms`` holds them, summaries included.

``clip_grad_norm_`` / ``clip_grad_value_`` / ``clip_grads_with_norm_`` / ``get_total_norm`` calls,
``optimizer.step`` (with ‖Δparam‖ / ‖param‖ per module), ``zero_grad`` and ``GradScaler.step``
(the loss scale it ran with, whether inf/NaN in the gradients skipped it, the scale its
``update()`` left) become ``Trace.grad_events``, each naming the call it follows: they happen
after that call was stored and streamed, so they travel with the trace.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from typing import Callable

import torch

from core.model.grad_health import as_norm, module_norms, module_of, norm_ratio
from core.worker.capture.names import untraced

log = logging.getLogger(__name__)

CLIP_EPS = 1e-6  # torch's clip_grad_norm_: max_norm / (total + 1e-6)


def _norms(tensors: list, ord=2.0) -> list[float]:
    """Each tensor's norm as a float: one fused op and one read back where the list allows."""
    if not tensors:
        return []
    tensors = [t.detach() for t in tensors]  # a create_graph call's grads have a graph of their own
    try:
        return torch.stack(torch._foreach_norm(tensors, ord)).tolist()
    except Exception:  # sparse grads, mixed devices or dtypes
        return [float(torch.linalg.vector_norm(t.to_dense() if t.is_sparse else t, ord)) for t in tensors]


class GradNorms:
    """The norm records of one capture. ``before``/``after`` bracket each backward call;
    ``install`` wraps the clipping functions and hooks the optimizers for the run."""

    def __init__(self, name_of: Callable[[torch.Tensor], str | None], line_of: Callable[[], int | None]):
        self.name_of = name_of
        self.line_of = line_of
        self.events: list[dict] = []  # Trace.grad_events
        self.last_call: int | None = None  # the call the next event follows
        self._pending: dict[int, tuple] = {}  # call index -> (names, leaves, grads held before it)
        self._known: dict[int, str] = {}  # tensor _cdata -> name, for the optimizer's parameters
        self._steps: dict[int, list] = {}  # id(optimizer) -> (names, params, values before the step)
        self._scaled: dict[int, list[dict]] = {}  # id(GradScaler) -> its step events waiting for update()
        self._sizes: dict[int, tuple[int, float]] = {}  # parameter _cdata -> (its version, ‖param‖) after a step
        self._undo: list[Callable[[], None]] = []

    # -- backward calls --------------------------------------------------------------------------
    def before(self, index: int, order) -> None:
        """Note the named leaves the call's walked nodes reach, and a copy of any ``.grad`` they
        hold already (the call accumulates into it)."""
        try:
            self._pending[index] = self._leaves(order)
        except Exception:  # a record must never break the script's backward
            log.debug("noting the leaves of call %s failed", index, exc_info=True)

    def _leaves(self, order) -> tuple:
        names, leaves, held = [], [], []
        seen = set()
        for node in order:
            if type(node).__name__ != "AccumulateGrad":
                continue
            leaf = node.variable
            if not isinstance(leaf, torch.Tensor) or id(leaf) in seen:
                continue
            seen.add(id(leaf))
            name = self.name_of(leaf)
            if not name:
                continue
            names.append(name)
            leaves.append(leaf)
            g = leaf.grad
            held.append(None if g is None else g.detach().clone())
            self._known[leaf._cdata] = name
        return names, leaves, held

    def after(self, index: int, api: str) -> dict | None:
        """The call's norms (``CallInfo.grad_norms``), or None when it reached no named leaf or
        left no ``.grad`` (``autograd.grad``)."""
        pending = self._pending.pop(index, None)
        self.last_call = index
        if api == "autograd.grad" or pending is None:
            return None
        try:
            return self._norms_of(*pending)
        except Exception:
            log.debug("the norms of call %s failed", index, exc_info=True)
            return None

    def _norms_of(self, names, leaves, held) -> dict | None:
        rows = [(n, p, p.grad, h) for n, p, h in zip(names, leaves, held) if p.grad is not None]
        if not rows:
            return None
        grads = [g for _, _, g, _ in rows]
        grad_n = _norms(grads)
        param_n = self._param_norms([p for _, p, _, _ in rows])
        summed = [(i, g, h) for i, (_, _, g, h) in enumerate(rows) if h is not None and h.shape == g.shape]
        added = dict(zip([i for i, _, _ in summed], _norms([g.detach() - h for _, g, h in summed]))) if summed else {}
        params = {}
        for i, (name, _, _, _) in enumerate(rows):
            entry = {"module": module_of(name), "grad": as_norm(grad_n[i]), "param": as_norm(param_n[i]),
                     "ratio": norm_ratio(grad_n[i], param_n[i])}
            if i in added:
                entry["added"] = as_norm(added[i])
            params[name] = entry
        order = [name for name, _, _, _ in rows]
        return {"params": params, "modules": {m: as_norm(n) for m, n in module_norms(order, grad_n).items()}}

    def _param_norms(self, params: list) -> list[float]:
        """‖param‖ of each, read again only where the parameter changed since the last optimizer
        step measured it (a training loop's backward reads each norm that step left: one pass
        over the parameters fewer per call)."""
        known = self._sizes
        out: list = [None] * len(params)
        missing = []
        for i, p in enumerate(params):
            seen = known.get(p._cdata)
            if seen is not None and seen[0] == p._version:
                out[i] = seen[1]
            else:
                missing.append(i)
        for i, n in zip(missing, _norms([params[i].detach() for i in missing])):
            out[i] = n
        return out

    # -- clipping and optimizers ----------------------------------------------------------------
    def install(self) -> None:
        import torch.nn.utils as utils
        import torch.nn.utils.clip_grad as clip_grad
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        # clip_grad_norm_ calls the private _get_total_norm / _clip_grads_with_norm_ that the public
        # get_total_norm / clip_grads_with_norm_ name, so wrapping the public names records it once.
        wraps = (("clip_grad_norm_", self._wrap_norm), ("clip_grad_value_", self._wrap_value),
                 ("clip_grads_with_norm_", self._wrap_with_norm), ("get_total_norm", self._wrap_total))
        for owner in (utils, clip_grad):
            for attr, wrap in wraps:
                original = getattr(owner, attr, None)
                if original is not None:
                    setattr(owner, attr, wrap(original))
                    self._undo.append(functools.partial(setattr, owner, attr, original))
        for owner in (torch.optim.Optimizer, torch.nn.Module):
            original = owner.zero_grad
            setattr(owner, "zero_grad", self._wrap_zero(original))
            self._undo.append(functools.partial(setattr, owner, "zero_grad", original))
        self._undo.append(register_optimizer_step_pre_hook(self._step_pre).remove)
        self._undo.append(register_optimizer_step_post_hook(self._step_post).remove)
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None:  # torch.cuda.amp.GradScaler subclasses it without overriding these
            for attr, wrap in (("step", self._wrap_scaler_step), ("update", self._wrap_scaler_update)):
                original = scaler.__dict__[attr]
                setattr(scaler, attr, wrap(original))
                self._undo.append(functools.partial(setattr, scaler, attr, original))

    def remove(self) -> None:
        for fn in reversed(self._undo):
            try:
                fn()
            except Exception:
                log.debug("restoring a patched function failed", exc_info=True)
        self._undo.clear()

    def _event(self, kind: str, **fields) -> None:
        try:
            line = self.line_of()
        except Exception:
            line = None
        self.events.append({"kind": kind, "after_call": self.last_call, "line": line, **fields})

    def _wrap_norm(self, original):
        @functools.wraps(original)
        def clip_grad_norm_(parameters, max_norm, norm_type=2.0, *args, **kwargs):
            params = _tensors(parameters)
            total = original(params, max_norm, norm_type, *args, **kwargs)
            with _recording("clip_grad_norm_"):
                coef = float(torch.clamp(max_norm / (total + CLIP_EPS), max=1.0))
                grads = _grads(params)
                self._event("clip_grad_norm_", max_norm=float(max_norm), norm_type=float(norm_type),
                            total_norm=as_norm(float(total)), clip_coef=as_norm(coef),
                            norm_after=as_norm(_total_norm(grads, float(norm_type))), params=len(grads))
            return total

        return clip_grad_norm_

    def _wrap_value(self, original):
        @functools.wraps(original)
        def clip_grad_value_(parameters, clip_value, *args, **kwargs):
            params = _tensors(parameters)
            with torch._C.DisableTorchFunction(), untraced():
                before = _total_norm(_grads(params), 2.0)
            result = original(params, clip_value, *args, **kwargs)
            with _recording("clip_grad_value_"):
                grads = _grads(params)
                self._event("clip_grad_value_", clip_value=float(clip_value), total_norm=as_norm(before),
                            norm_after=as_norm(_total_norm(grads, 2.0)), params=len(grads))
            return result

        return clip_grad_value_

    def _wrap_with_norm(self, original):
        @functools.wraps(original)
        def clip_grads_with_norm_(parameters, max_norm, total_norm, *args, **kwargs):
            params = _tensors(parameters)
            result = original(params, max_norm, total_norm, *args, **kwargs)
            with _recording("clip_grads_with_norm_"):
                total = torch.as_tensor(total_norm)
                coef = float(torch.clamp(max_norm / (total + CLIP_EPS), max=1.0))
                grads = _grads(params)
                self._event("clip_grads_with_norm_", max_norm=float(max_norm), total_norm=as_norm(float(total)),
                            clip_coef=as_norm(coef), norm_after=as_norm(_total_norm(grads, 2.0)), params=len(grads))
            return result

        return clip_grads_with_norm_

    def _wrap_total(self, original):
        @functools.wraps(original)
        def get_total_norm(tensors, norm_type=2.0, *args, **kwargs):
            tensors = _tensors(tensors)
            total = original(tensors, norm_type, *args, **kwargs)
            with _recording("get_total_norm"):
                self._event("get_total_norm", norm_type=float(norm_type), total_norm=as_norm(float(total)),
                            tensors=len(tensors))
            return total

        return get_total_norm

    def _wrap_scaler_step(self, original):
        @functools.wraps(original)
        def step(scaler, optimizer, *args, **kwargs):
            if not scaler.is_enabled():
                return original(scaler, optimizer, *args, **kwargs)
            # Noted before the step runs, so that the optimizer.step it makes follows it in the list.
            event = None
            with _recording("a GradScaler step"):
                self._event("scaler.step", optimizer=type(optimizer).__name__, scale=as_norm(scaler.get_scale()),
                            skipped=False, scale_after=None)
                event = self.events[-1]
            try:
                result = original(scaler, optimizer, *args, **kwargs)
            except BaseException:
                if event is not None:
                    self.events.remove(event)
                raise
            if event is not None:
                with _recording("a GradScaler step's inf check"):
                    found = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
                    event["skipped"] = bool(sum(float(v) for v in found.values()) > 0)
                    self._scaled.setdefault(id(scaler), []).append(event)
            return result

        return step

    def _wrap_scaler_update(self, original):
        @functools.wraps(original)
        def update(scaler, *args, **kwargs):
            result = original(scaler, *args, **kwargs)
            waiting = self._scaled.pop(id(scaler), [])
            with _recording("a GradScaler's new scale"):
                scale = as_norm(scaler.get_scale())
                for event in waiting:
                    event["scale_after"] = scale
            return result

        return update

    def _wrap_zero(self, original):
        @functools.wraps(original)
        def zero_grad(*args, **kwargs):
            result = original(*args, **kwargs)
            self._event("zero_grad")
            return result

        return zero_grad

    def _step_pre(self, opt, args, kwargs) -> None:
        with _recording("the parameters before a step"):
            named = [(self._known[p._cdata], p) for g in opt.param_groups for p in g["params"]
                     if p._cdata in self._known]
            self._steps[id(opt)] = ([n for n, _ in named], [p for _, p in named],
                                    torch._foreach_mul([p.detach() for _, p in named], 1.0) if named else [])

    def _step_post(self, opt, args, kwargs) -> None:
        names, params, old = self._steps.pop(id(opt), ([], [], []))
        with _recording("an optimizer step"):
            now = [p.detach() for p in params]
            if old:
                torch._foreach_sub_(old, now)  # the copies become -Δ, with no new memory
            delta, size = _norms(old), _norms(now)
            self._sizes.update((p._cdata, (p._version, n)) for p, n in zip(params, size))
            d_mod, p_mod = module_norms(names, delta), module_norms(names, size)
            update = {m: norm_ratio(d_mod[m], p_mod[m]) for m in d_mod}
            self._event("optimizer.step", optimizer=type(opt).__name__, update=update)


@contextlib.contextmanager
def _recording(what: str):
    """Around the reads of a record: outside the capture (no torch function mode, no name tracer),
    and never raising, since a record must never break the script."""
    try:
        with torch._C.DisableTorchFunction(), untraced():
            yield
    except Exception:
        log.debug("recording %s failed", what, exc_info=True)


def _tensors(x) -> list:
    """Clipping's ``parameters`` argument (a tensor, or an iterable of them) as a list."""
    return [x] if isinstance(x, torch.Tensor) else list(x)


def _grads(params: list) -> list:
    return [p.grad for p in params if p.grad is not None]


def _total_norm(grads: list, norm_type: float) -> float:
    """The norm over all ``grads`` together, as torch's clipping computes it."""
    if not grads:
        return 0.0
    norms = torch._foreach_norm([g.detach() for g in grads], norm_type)
    return float(torch.linalg.vector_norm(torch.stack([n.to(grads[0].device) for n in norms]), norm_type))


def script_line(names) -> Callable[[], int | None]:
    """The current script line: the innermost frame in the user's file."""
    return lambda: names.user_line(sys._getframe(1))
