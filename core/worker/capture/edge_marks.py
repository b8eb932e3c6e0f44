"""Broadcast reductions and dtype changes along a graph's edges (worker side, imports torch).

Each node knows the shape and dtype of its forward output (``_input_metadata``, what its
incoming gradient must look like). Along an edge from node N to input node M, the gradient N
computes has N's output shape and is summed down to M's shape where forward broadcast
(``[5] → Σ → []``), and cast where forward promoted a dtype (``float32 → float64``). Read once
per node during the walk: no per-op cost.
"""

from __future__ import annotations

# Ops whose inputs may be broadcast to the output shape (the engine then sums the gradient back).
BROADCASTING = frozenset((
    "AddBackward0", "SubBackward0", "MulBackward0", "DivBackward0", "PowBackward1", "WhereBackward0",
    "MaximumBackward0", "MinimumBackward0", "Atan2Backward0", "ExpandBackward0", "AddcmulBackward0",
    "AddcdivBackward0", "LerpBackward0", "LerpBackward1", "RsubBackward0", "HypotBackward0",
    "CopysignBackward0", "FmodBackward1", "RemainderBackward1", "XlogyBackward0", "MseLossBackward0",
))


def _meta(node, k: int = 0):
    try:
        meta = node._input_metadata
        return meta[k] if k < len(meta) else None
    except Exception:
        return None


def _ints(shape) -> list[int]:
    """A metadata shape as plain ints; a symbolic size (a jagged dim) has no one value: raise."""
    if not all(type(s) is int for s in shape):
        raise ValueError("a symbolic size")
    return list(shape)


def _dtype(d) -> str:
    return str(d).replace("torch.", "")


def edge_marks(node, name: str, next_functions=None) -> list[dict] | None:
    """One dict per marked input: ``{"input": i, "sum": [from, to]}`` and/or ``"dtype": [from, to]``.
    ``next_functions``: the node's, where the caller has read them already."""
    out_meta = _meta(node)
    if out_meta is None:
        return None
    out_shape, out_dtype = None, None
    marks = []
    for i, (fn, nr) in enumerate(node.next_functions if next_functions is None else next_functions):
        if fn is None:
            continue
        meta = _meta(fn, nr)
        if meta is None:
            continue
        mark = {}
        if name in BROADCASTING:
            try:
                if out_shape is None:
                    out_shape = _ints(out_meta.shape)
                shape = _ints(meta.shape)
            except Exception:  # a nested tensor's metadata has no one shape: no broadcast to show
                shape = out_shape = None
            if out_shape is not None and shape != out_shape and len(shape) <= len(out_shape):
                mark["sum"] = [out_shape, shape]
        if meta.dtype != out_meta.dtype:
            if out_dtype is None:
                out_dtype = _dtype(out_meta.dtype)
            mark["dtype"] = [out_dtype, _dtype(meta.dtype)]
        if mark:
            mark["input"] = i
            marks.append(mark)
    return marks or None
