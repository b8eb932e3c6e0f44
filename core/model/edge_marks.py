"""Words for the edge marks of ``core.worker.capture.edge_marks`` (plain data, no torch)."""

from __future__ import annotations


def mark_text(mark: dict) -> str:
    """'[5] → Σ → []', 'float32 → float64', or both."""
    parts = []
    if "sum" in mark:
        a, b = mark["sum"]
        parts.append(f"[{', '.join(map(str, a))}] → Σ → [{', '.join(map(str, b))}]")
    if "dtype" in mark:
        parts.append(" → ".join(mark["dtype"]))
    return " · ".join(parts)


def edge_mark_tip(mark: dict) -> str:
    """A tooltip that explains the mark."""
    out = []
    if "sum" in mark:
        out.append("Forward broadcast this input to the output's shape, so backward sums the gradient "
                   "over the broadcast dimensions back to the input's shape.")
    if "dtype" in mark:
        a, b = mark["dtype"]
        out.append(f"Forward promoted {b} to {a}; backward casts the gradient back to {b}.")
    return " ".join(out)
