"""Step one real backward call node by node (runs in the worker process, imports torch).

Design: the real autograd engine runs on the thread that called backward (the script's thread),
and every node of the graph gets a pre-hook that reports the node and blocks until a controller
on another thread releases it, plus a post hook that records what the node produced. Because
the engine itself runs, the order is the engine's own, the user's tensor and node hooks still
fire, ``retain_graph``/``create_graph`` behave as usual and saved tensors are freed exactly when
the engine frees them. Calling nodes directly instead (a manual executor) bypasses hooks, so
``retain_grad()`` stays None, never frees saved tensors, and must re-implement the engine's
shape reduction, dtype casts and custom-Function rules.

On torch 2.13 ``register_prehook``/``register_hook`` work on AccumulateGrad nodes as on any
other node (the post hook runs after ``.grad`` is updated, and does not stop AccumulateGrad
from stealing the incoming gradient), so leaves are steps too. A node whose ``apply`` fails
(a stale saved tensor, a graph already freed) has already passed its pre-hook: its step
carries the error. On CPU every hook runs on the thread that called backward, so blocking
there pauses the whole engine and nothing else needs locking.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterable

import torch

from core.protocol.messages import StepperState
from core.worker.capture.values import STACK_LIMIT, ValueBatch, _flat_head, _plain_list
from core.worker.capture.node_graph import node_kind, node_name, number_nodes, root_nodes, version_of
from core.worker.capture.values import FULL_VALUES, values_of

log = logging.getLogger(__name__)

_RESTING = frozenset((StepperState.PAUSED, StepperState.FINISHED, StepperState.STOPPED, StepperState.FAILED))
# Values kept in full across all step records of one call; later tensors keep a sample and stats,
# so stepping a 5,000-node graph does not hold every gradient as Python floats.
VALUE_BUDGET = 200_000
# While backward runs on without pausing (Continue, Step to), gradients on edges keep their first
# values and size only; leaf grads keep every value. Stats over 5,000 nodes' gradients cost
# more than the backward itself.
LIGHT_VALUES = 8
# While running on, previews are read in batches: each gradient's values are copied (a small
# tensor) when its node runs and turned into Python values together at the next pause, the
# worker's next send or the end. A batch holds at most this many copied elements.
DEFER_ELEMENTS = 1 << 22
DEFER_HEADS = 8192  # edge previews waiting for their first values


_gettrace, _settrace = sys.gettrace, sys.settrace


def _untraced(hook: Callable) -> Callable:
    """``hook`` run without the thread's trace function, which is put back when it returns.

    The capture's name tracer (``core.worker.capture.names``) is called for every Python frame
    of the script's thread, and backward runs there: each node's two hooks make some thirty
    calls of their own, and the tracer added a third to the CPU time of a Continue (4,802
    nodes: 0.43 s against 0.32 s untraced). The user's own hooks run between ours, traced as
    before."""

    def run(*args):
        tracer = _gettrace()
        if tracer is not None:
            _settrace(None)
        try:
            return hook(*args)
        except BaseException:
            del args  # a stop's traceback keeps this frame: it must not keep the gradients
            raise
        finally:
            if tracer is not None:
                _settrace(tracer)

    return run


class StepperStopped(BaseException):
    """Raised in the script's thread by ``BackwardStepper.stop()``.

    A BaseException, like KeyboardInterrupt, so a script's ``except Exception`` around
    ``backward()`` does not swallow the user's Stop.
    """


class BackwardStepper:
    """Runs one real backward call with a pause before every node.

    ``run()`` is called on the script's thread in place of ``real()``; ``step``, ``run_to``,
    ``resume``, ``pause``, ``stop`` and ``wait_paused`` are called from other threads.
    ``names`` gives a tensor's script name (keys of ``leaf_grads``; without a name the key is the
    id of the node that owns the tensor). ``watch`` lists tensors whose retained grads to report
    (non-leaves with ``retain_grad()``; the roots are always watched). ``on_step`` gets each
    completed step record, ``on_pause`` each pending record; both run on the script's thread.
    While backward runs on, a record's gradient previews are filled in batches: at the next
    pause, at the end, or when ``settle()`` is called (on the script's thread) before sending
    records that ``on_step`` got.
    """

    def __init__(
        self,
        roots: list,
        real: Callable[[], Any],
        names: Callable[[torch.Tensor], str | None] | None = None,
        on_step: Callable[[dict], None] | None = None,
        on_pause: Callable[[dict], None] | None = None,
        watch: Iterable[torch.Tensor] = (),
        value_budget: int = VALUE_BUDGET,
        stop_when: Callable[[tuple], bool] | None = None,
    ):
        self.roots = list(roots)
        self.real = real
        self.names = names or (lambda t: None)
        self.on_step = on_step
        self.on_pause = on_pause
        self.watch = [t for t in watch if isinstance(t, torch.Tensor)]
        self.value_budget = value_budget
        # While running on: pause before the first node whose incoming gradients this is true of
        # (a debug run's Run to First NaN/Inf).
        self.stop_when = stop_when
        self.steps: list[dict] = []
        self.state = StepperState.IDLE
        self.error: BaseException | None = None
        self._cond = threading.Condition()
        self.woke = 0.0  # time.monotonic() when a pause last ended (the hop timings of a step)
        self._budget = 0  # nodes allowed to run without pausing
        self._free = False
        self._target: str | None = None
        self._stop = False
        self._pending: dict | None = None
        self._open: list[dict] = []  # started, not finished; more than one only under reentrant backward
        self._retained: dict[str, list[torch.Tensor]] = {}
        # id(tensor) -> (weakref, version, preview): a node's grad_inputs usually reach the next
        # node unchanged as its grad_outputs, so each gradient is previewed once.
        self._previews: dict[int, tuple] = {}
        # Previews waiting for their values (running on): a ValueBatch over copies of the tensors.
        self._batch = ValueBatch()
        self._deferred: list[tuple[dict, str | None, dict]] = []
        self._deferred_elements = 0
        self._heads: list[tuple[dict, torch.Tensor]] = []  # edge previews waiting for their first values

    # -- controller side (other threads) -----------------------------------------------------
    def step(self, count: int = 1) -> None:
        """Let ``count`` more nodes execute, then pause before the next one."""
        with self._cond:
            self._budget += max(0, count)
            self._release()

    def run_to(self, node_id: str) -> None:
        """Run until ``node_id`` is the next node to execute, or to the end if it never runs."""
        with self._cond:
            if self.state is StepperState.PAUSED and self._pending and self._pending["node"] == node_id:
                return
            self._target = node_id
            self._release()

    def resume(self) -> None:
        """Continue to the end without pausing."""
        with self._cond:
            self._free = True
            self._release()

    def pause(self) -> None:
        """Pause before the next node (after ``resume`` or ``run_to``)."""
        with self._cond:
            self._free = False
            self._target = None
            self._budget = 0

    def stop(self) -> None:
        """Abort: the next pre-hook raises StepperStopped, backward unwinds, ``run()`` re-raises it."""
        with self._cond:
            self._stop = True
            self._release()

    def wait_paused(self, timeout: float | None = None) -> dict | None:
        """Block until paused before a node (returns its pending record) or done (returns None).

        Also returns None on timeout; ``state`` tells which.
        """
        with self._cond:
            self._cond.wait_for(lambda: self.state in _RESTING, timeout)
            return dict(self._pending) if self.state is StepperState.PAUSED and self._pending else None

    @property
    def pending(self) -> dict | None:
        """The record of the node about to run while paused."""
        with self._cond:
            return dict(self._pending) if self._pending else None

    def _release(self) -> None:
        if self.state is StepperState.PAUSED:
            self.state = StepperState.RUNNING
        self._cond.notify_all()

    # -- script side --------------------------------------------------------------------------
    def run(self) -> Any:
        """Install the hooks, run ``real()`` and return its result; re-raises its error."""
        with self._cond:
            if self.state is not StepperState.IDLE:
                raise RuntimeError("a BackwardStepper runs one backward call")
            self.state = StepperState.RUNNING
        nodes, node_ids = number_nodes(root_nodes(self.roots))
        self._find_retained(node_ids)
        final = StepperState.FAILED
        try:
            handles = []
            try:
                for node in nodes:
                    nid = node_ids[id(node)]
                    handles.append(node.register_prehook(self._pre_hook(nid, node)))
                    handles.append(node.register_hook(self._post_hook(nid, node)))
                result = self.real()
            finally:
                # Hooks live on the nodes, and AccumulateGrad nodes outlive this graph: a blocking
                # hook left behind would pause (hang) the next backward that reaches the same leaf.
                for h in handles:
                    h.remove()
        except StepperStopped as exc:
            final = StepperState.STOPPED
            self.error = exc
            _drain_ready_queue()
            raise
        except BaseException as exc:
            self.error = exc
            self._fail_open(exc)
            _drain_ready_queue()
            raise
        else:
            final = StepperState.FINISHED
            if self._open:
                log.warning("%d node(s) started but never finished", len(self._open))
                self._open.clear()
            return result
        finally:
            self.settle()
            # Holding no torch object afterwards: a kept stepper must not keep the graph alive.
            del nodes, node_ids
            self.roots, self.real, self.watch = [], None, []
            self._retained.clear()
            self._previews.clear()
            with self._cond:
                self.state = final
                self._pending = None
                self._cond.notify_all()

    def _find_retained(self, node_ids: dict[int, str]) -> None:
        seen = set()
        for t in [*self.roots, *self.watch]:
            if not isinstance(t, torch.Tensor) or id(t) in seen or t.is_leaf or not t.retains_grad:
                continue
            seen.add(id(t))
            nid = node_ids.get(id(t.grad_fn))
            if nid is not None:
                self._retained.setdefault(nid, []).append(t)

    def _pre_hook(self, nid: str, node) -> Callable:
        name = node_name(node)

        def hook(grad_outputs):
            if self.stop_when is not None and self._free and self.stop_when(grad_outputs):
                with self._cond:
                    self._free, self.stop_when = False, None
            light = self._running_on()
            record = {"index": len(self.steps), "node": nid, "name": name,
                      "grad_outputs": [self._values(g, light) for g in grad_outputs]}
            del grad_outputs  # a stop's traceback keeps this frame: it must not keep the gradients
            self._gate(nid, record)
            self._open.append(record)

        return _untraced(hook)

    def _gate(self, nid: str, record: dict) -> None:
        """Return when this node may run; raise StepperStopped when stopped."""
        with self._cond:
            if self._stop:
                raise StepperStopped(f"stopped before {nid}")
            if self._free:
                return
            if self._target is not None:
                if self._target != nid:
                    return
                self._target = None
            elif self._budget > 0:
                self._budget -= 1
                return
            self.settle()
            self._pending = record
            self.state = StepperState.PAUSED
            self._cond.notify_all()
        if self.on_pause is not None:
            self._callback(self.on_pause, dict(record))
        with self._cond:
            while self.state is StepperState.PAUSED and not self._stop:
                self._cond.wait()
            self.woke = time.monotonic()
            self._pending = None
            if self._stop:
                raise StepperStopped(f"stopped before {nid}")
            if not self._free and self._target is None and self._budget > 0:
                self._budget -= 1  # this node is the first of the granted steps
            self.state = StepperState.RUNNING

    def _post_hook(self, nid: str, node) -> Callable:
        accumulate = node_kind(node) == "accumulate_grad"

        def hook(grad_inputs, grad_outputs):
            record = self._take_open(nid)
            light = self._running_on()
            record["grad_inputs"] = [self._values(g, light) for g in grad_inputs]
            leaf_grads = {}
            if accumulate:
                var = node.variable
                if var.grad is not None:
                    self._leaf_values(leaf_grads, self._key(var, nid), var.grad, light)
            for t in self._retained.get(nid, ()):
                if t.grad is not None:
                    self._leaf_values(leaf_grads, self._key(t, nid), t.grad, light)
            record["leaf_grads"] = leaf_grads
            record["error"] = None
            self._finish(record)

        return _untraced(hook)

    def _take_open(self, nid: str) -> dict:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["node"] == nid:
                return self._open.pop(i)
        return {"index": len(self.steps), "node": nid, "name": "", "grad_outputs": []}

    def _fail_open(self, exc: BaseException) -> None:
        """The nodes whose apply raised: their steps carry the error."""
        error = {"type": type(exc).__name__, "message": str(exc)}
        while self._open:
            record = self._open.pop()
            record.update(grad_inputs=[], leaf_grads={}, error=error)
            self._finish(record)

    def _finish(self, record: dict) -> None:
        record["index"] = len(self.steps)
        self.steps.append(record)
        if self.on_step is not None:
            self._callback(self.on_step, record)

    def _callback(self, fn: Callable[[dict], None], record: dict) -> None:
        # An exception escaping a hook would cancel the user's backward: log it instead.
        try:
            fn(record)
        except Exception:
            log.exception("stepping callback %r failed", fn)

    def _key(self, t: torch.Tensor, nid: str) -> str:
        try:
            name = self.names(t)
        except Exception:
            name = None
        return name or nid

    def _running_on(self) -> bool:
        """Backward goes on without pausing at the next node (Continue or Step to)."""
        return self._free or self._target is not None

    @property
    def running_on(self) -> bool:
        """True while backward runs on without pausing (Continue, Step to): finished steps can
        wait to be sent in bigger batches, no view is waiting for a single one."""
        return self._running_on()

    def _full(self, n: int) -> bool:
        """Whether a preview keeps every value (spends the call's value budget)."""
        if n <= FULL_VALUES and n <= self.value_budget:
            self.value_budget -= n
            return True
        return False

    def _leaf_values(self, out: dict, key: str, g: torch.Tensor, light: bool) -> None:
        """``out[key]``: the preview of a leaf's (or retained) grad, every value within budget."""
        if light and _deferrable(g):
            light = self._defer(out, key, g, full=self._full(g.numel()))
        if not light:
            out[key] = self._values(g)

    def _defer(self, out: dict, key: str, g: torch.Tensor, full: bool) -> bool:
        """Queue the preview of ``g`` as ``out[key]`` for the next ``settle()``; False when it
        must be read now."""
        try:
            copy = g.detach().clone()
        except Exception:
            return False
        holder: dict = {}
        self._batch.add(holder, "v", copy, full=full, sample=LIGHT_VALUES)
        self._deferred.append((out, key, holder))
        self._deferred_elements += copy.numel()
        if self._deferred_elements > DEFER_ELEMENTS:
            self.settle()
        return True

    def settle(self) -> None:
        """Fill every queued preview (script thread: the hooks' thread)."""
        heads, self._heads = self._heads, []
        deferred, self._deferred, self._deferred_elements = self._deferred, [], 0
        groups: dict[tuple, list] = {}
        for preview, head in heads:
            groups.setdefault((head.device, head.dtype), []).append((preview, head))
        for items in groups.values():
            try:
                values = _plain_list(torch.cat([head for _, head in items]))
            except Exception:
                log.exception("reading gradient previews failed")
                continue
            pos = 0
            for preview, head in items:
                preview["sample"] = values[pos:pos + LIGHT_VALUES]
                pos += LIGHT_VALUES
        if not deferred:
            return
        try:
            self._batch.flush()
        except Exception:
            log.exception("reading gradient previews failed")
            self._batch = ValueBatch()
        for out, key, holder in deferred:
            values = holder.get("v")
            out[key] = dict(vars(values)) if values is not None else {"numel": 0}

    def _values(self, g, light: bool = False) -> dict | None:
        """A JSON-ready preview of a gradient; records may share one preview dict (read-only).

        ``light``: the first values and the size only (see LIGHT_VALUES), read at ``settle()``."""
        if not isinstance(g, torch.Tensor):
            return None
        version = version_of(g)  # an inference tensor has no version counter
        hit = self._previews.get(id(g))
        if hit is not None and hit[0]() is g and hit[1] == version and (light or not hit[3]):
            return hit[2]
        n = g.numel()
        light = light and n > LIGHT_VALUES
        if light:
            preview = {"numel": n}
            try:
                # a copy of the first values (reshape copies a strided gradient whole: cheaper
                # than indexing for gradient sizes; huge ones go through _flat_head)
                flat = g.detach()
                flat = flat.reshape(-1)[:LIGHT_VALUES] if n <= STACK_LIMIT else _flat_head(flat, LIGHT_VALUES)
                self._heads.append((preview, flat.clone()))
                if len(self._heads) >= DEFER_HEADS:
                    self.settle()
            except Exception:
                pass
        elif self._full(n):
            preview = dict(vars(values_of(g)))
        else:
            preview = dict(vars(values_of(g, full_limit=0)))
        try:
            self._previews[id(g)] = (weakref.ref(g), version, preview, light)
        except TypeError:
            pass
        return preview


def _deferrable(g: torch.Tensor) -> bool:
    return g.numel() <= STACK_LIMIT and g.layout == torch.strided and not g.is_nested and not g.is_meta


def _drain_ready_queue() -> None:
    """Discard the tasks an aborted backward left in this thread's ready queue.

    After an error or a stop, nodes that were ready but never ran stay queued with their input
    gradients (which our hooks gave Python wrappers) until this thread's next backward, or its
    exit, where freeing them needs the GIL and raced with interpreter shutdown ("terminate
    called without an active exception"). A backward whose root has the lowest priority
    (sequence number 0) pops, and so discards, every leftover task before its own.
    """
    try:
        with torch.enable_grad():
            leaf = torch.zeros((), requires_grad=True)
            root = leaf * 1.0
        set_nr = getattr(root.grad_fn, "_set_sequence_nr", None)
        if set_nr is None:
            return
        set_nr(0)
        torch.autograd.grad(root, leaf)
    except Exception:
        log.exception("draining the autograd ready queue failed")


def step_all(roots: list, real: Callable[[], Any], **kwargs) -> tuple[Any, list[dict]]:
    """Run ``real()`` to the end through a stepper, on this thread; returns (result, steps).

    On failure the error is re-raised; pass ``on_step=list.append`` to keep the steps then.
    """
    stepper = BackwardStepper(roots, real, **kwargs)
    stepper.resume()
    result = stepper.run()
    return result, stepper.steps


def engine_order(roots: list, real: Callable[[], Any], order: list[str] | None = None) -> list[str]:
    """Node ids (numbered as ``number_nodes``) in the order the engine starts them, via plain hooks.

    Appends to ``order`` when given, so the partial order survives a failing ``real()``.
    """
    order = [] if order is None else order
    nodes, ids = number_nodes(root_nodes(roots))
    handles = []
    try:
        for node in nodes:
            nid = ids[id(node)]
            handles.append(node.register_prehook(lambda grads, nid=nid: order.append(nid)))
        real()
    finally:
        for h in handles:
            h.remove()
    return order
