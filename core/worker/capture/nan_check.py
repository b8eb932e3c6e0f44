"""The first non-finite value of a run, located (worker side, imports torch).

With the NaN/Inf check on (``main.py trace SCRIPT --nan-check``), a TorchFunctionMode pushed
beneath the capture's own mode looks at every forward op's floating-point outputs, and a
post-hook on every node of each captured call looks at the gradients that node computes. The
first op whose output holds a NaN or an infinity is recorded with its line, module, text and
its inputs' ranges; the first node whose gradient does, with its call, node id, line and the
input the gradient is for. Off, nothing of this module runs: no mode is pushed, no hook is
registered (``Capture.nan_check`` is None).

The check is one reduction per output: a sum is finite exactly when every element is, unless
finite values overflow it, so only a non-finite sum is counted element by element. On a GPU
each check reads the sum back, a synchronisation per op: the mode's cost there is measured in
``bench/bench_nan_check.py``.
"""

from __future__ import annotations

import math
import sys
import threading

import torch
from torch.overrides import TorchFunctionMode

from core.worker.capture.creation import _call_at, _call_sites
from core.worker.capture.names import OP_FRAME, untraced
from core.worker.capture.node_graph import shape_of
from core.worker.capture.script_errors import FailedOp
from core.worker.capture.snapshot import dtype_name

FOUND_MARK = "bps_nan"  # metadata key on the node an op's first non-finite output was made by
# Operators as the app names their ops elsewhere (DivBackward0 for ``a / b``).
_OPERATORS = {"__truediv__": "div", "__rtruediv__": "div", "__itruediv__": "div_", "__floordiv__": "floor_divide",
              "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul_", "__add__": "add", "__radd__": "add",
              "__iadd__": "add_", "__sub__": "sub", "__rsub__": "rsub", "__isub__": "sub_", "__pow__": "pow",
              "__rpow__": "pow", "__ipow__": "pow_", "__matmul__": "matmul", "__rmatmul__": "matmul",
              "__neg__": "neg", "__abs__": "abs", "__setitem__": "setitem", "__getitem__": "getitem"}
_HANDLE_CODE = torch.overrides.handle_torch_function.__code__
# Ops whose output is memory not yet written (a NaN there is whatever the allocator left): not checked.
UNINITIALISED = frozenset(("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                           "empty_permuted"))


def _finite(t) -> bool:
    """Whether every element of ``t`` is finite (always True for non-float tensors and non-tensors)."""
    if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
        return True
    try:
        if t.numel() == 0 or t.is_meta or t.is_sparse:
            return True
        total = t.detach().sum().item()  # detached: the check makes no graph node
        if isinstance(total, complex):
            if math.isfinite(total.real) and math.isfinite(total.imag):
                return True
        elif math.isfinite(total):
            return True
        return bool(torch.isfinite(t).all())  # finite values whose sum overflowed, or a real NaN
    except Exception:  # a tensor subclass, a nested tensor: not checked
        return True


def _json_float(x: float):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def counts(t: torch.Tensor) -> dict:
    """Shape, element count, and how many elements are NaN, +inf and -inf."""
    flat = t.detach().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return {"shape": shape_of(t), "numel": int(t.numel()), "nan": int(torch.isnan(flat).sum()),
            "posinf": int(torch.isposinf(flat).sum()), "neginf": int(torch.isneginf(flat).sum())}


def value_range(t: torch.Tensor) -> tuple:
    """(min, max) of a real tensor's values, NaN and infinities as text; (None, None) otherwise."""
    try:
        if t.numel() == 0 or t.is_complex() or t.dtype == torch.bool:
            return None, None
        flat = t.detach().reshape(-1)
        if not flat.is_floating_point():
            flat = flat.double()
        return _json_float(float(flat.min())), _json_float(float(flat.max()))
    except Exception:
        return None, None


def op_name(func) -> str:
    name = str(getattr(func, "__name__", "") or type(func).__name__)
    return _OPERATORS.get(name, name)


class _NanMode(TorchFunctionMode):
    """Checks every forward op's outputs until the first non-finite one is found."""

    def __init__(self, check: "NanCheck"):
        super().__init__()
        self.check = check

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        # The script's ops come through the capture's mode, which calls each from an OP_FRAME frame
        # (a Python-level torch function, through handle_torch_function); the ops that mode runs
        # itself to tag nodes, and a compiled region's, come from elsewhere and are not checked.
        caller = sys._getframe(1)
        site = caller.f_back if caller.f_code is _HANDLE_CODE else caller  # as the capture's mode finds it
        origin = site.f_back if site is not caller else site  # what called the op (or the torch function)
        check = self.check
        if origin.f_code.co_name != OP_FRAME:
            return func(*args, **(kwargs or {}))
        # Called as the capture's mode calls it, from a frame claiming the caller's file and line,
        # so a warning the op raises names the line it names without the check, not this function's.
        out = (_call_sites.get((site.f_code, site.f_lineno)) or _call_at(site))(func, args, kwargs or {})
        if check.forward is not None or not check.capture.tagging or getattr(func, "__name__", "") in UNINITIALISED:
            return out
        with torch._C.DisableTorchFunction():
            if isinstance(out, torch.Tensor):
                bad = None if _finite(out) else 0
            elif out is None and args and getattr(func, "__name__", "") == "__setitem__":
                bad = None if _finite(args[0]) else 0  # x[i] = value: x holds what was written
                out = args[0]
            elif isinstance(out, (tuple, list)):
                bad = next((i for i, o in enumerate(out) if not _finite(o)), None)
            else:
                bad = None
        if bad is not None:
            with untraced(), torch._C.DisableTorchFunction():
                check.found_forward(func, args, kwargs or {}, out if isinstance(out, torch.Tensor) else out[bad],
                                    bad, origin)
        return out


class NanCheck:
    """The check of one run: ``enter`` pushes the mode, ``watch``/``unwatch`` hook each call's nodes,
    ``record()`` is the trace's ``nan_check`` field."""

    def __init__(self):
        self.forward: dict | None = None
        self.backward: dict | None = None
        self.capture = None
        self._modules: list = []
        self._mode: _NanMode | None = None
        self._handles: dict[int, list] = {}  # call index -> its nodes' hook handles
        self._lock = threading.Lock()  # the engine may run nodes on device threads
        # Called with (record, output, frame) once the first non-finite output is found (a debug run's
        # Run to First NaN/Inf pauses there: core.worker.forward_pause).
        self.on_found = None

    # -- forward --------------------------------------------------------------------------------
    def enter(self, capture, module_stack: list) -> None:
        """Push the mode; ``module_stack``: the capture's stack of running modules (ids, innermost last).
        Entered before the capture's own mode, so that one still sees the script's frames first."""
        self.capture = capture
        self._modules = module_stack
        self._mode = _NanMode(self)
        self._mode.__enter__()

    def exit(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None

    def found_forward(self, func, args, kwargs, out: torch.Tensor, output: int, frame) -> None:
        names = self.capture.names
        module = self._modules[-1] if self._modules else None
        names.refresh(names.user_frames(frame))
        try:
            op = FailedOp(func=func, args=tuple(args), kwargs=dict(kwargs), line=names.user_line(frame))
            inputs = []
            for position, t in op.tensors():
                low, high = value_range(t)
                inputs.append({"position": position, "name": names.name_of(t), "shape": shape_of(t),
                               "dtype": dtype_name(t.dtype), "min": low, "max": high})
            record = {"op": op_name(func), "text": op.text(names.name_of), "line": op.line,
                      "module": names.module_paths.get(module) if module is not None else None,
                      "output": output, **counts(out), "inputs": inputs, "call": None, "node": None}
        finally:
            names.release()
        try:
            fn = out.grad_fn if out.requires_grad else None
            if fn is not None:
                fn.metadata[FOUND_MARK] = True  # the call whose graph holds it names its node
        except Exception:  # a view made under no_grad and changed in place since: it has no readable node
            pass
        self.forward = record
        if self.on_found is not None:
            self.on_found(record, out, frame)

    # -- backward -------------------------------------------------------------------------------
    def watch(self, index: int, order: list, ids: dict) -> None:
        """Hook every node of call ``index`` (``order``: its nodes; ``ids``: id(node) -> node id)."""
        forward = self.forward
        if forward is not None and forward["node"] is None:
            for node in order:
                if FOUND_MARK in _metadata(node) and id(node) in ids:
                    forward["call"], forward["node"] = f"c{index}", ids[id(node)]
                    break
        if self.backward is not None:
            return
        handles = []
        for node in order:
            nid = ids.get(id(node))
            if nid is None or not node.next_functions:
                continue  # AccumulateGrad computes no gradient: what reaches it is checked at its source
            try:
                handles.append(node.register_hook(_node_hook(self, index, nid, node, ids)))
            except Exception:  # nodes that take no hooks (some custom Functions)
                continue
        self._handles[index] = handles

    def unwatch(self, index: int) -> None:
        for h in self._handles.pop(index, ()):
            h.remove()

    def found_backward(self, index: int, nid: str, name: str, md: dict, position: int, grad, targets) -> None:
        with self._lock:
            if self.backward is not None:
                return
            module = md.get("bps_module")
            self.backward = {"call": f"c{index}", "node": nid, "name": name, "line": md.get("bps_line"),
                             "module": self.capture.names.module_paths.get(module) if module is not None else None,
                             "input": position, "to": targets[position] if position < len(targets) else None,
                             **counts(grad)}

    def record(self) -> dict:
        """The trace's ``nan_check`` field: the first non-finite op and node (None where all were finite)."""
        return {"forward": self.forward, "backward": self.backward}


def _node_hook(check: NanCheck, index: int, nid: str, node, ids: dict):
    """A post-hook for one node. It holds the node's name, metadata and the ids of its edges'
    targets, not the node itself: a node that held its own hook would never be freed."""
    name = node.name().rsplit("::", 1)[-1]
    md = _metadata(node)
    targets = [None if fn is None else ids.get(id(fn)) for fn, _ in node.next_functions]

    def hook(grad_inputs, grad_outputs):
        if check.backward is not None:
            return
        with torch._C.DisableTorchFunction():
            for position, g in enumerate(grad_inputs):
                if not _finite(g):
                    with untraced():
                        check.found_backward(index, nid, name, md, position, g, targets)
                    return

    return hook


def _metadata(node) -> dict:
    try:
        return node.metadata
    except Exception:
        return {}
