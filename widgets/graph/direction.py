"""Which way the graph view draws the graph: top down (the loss on top, arrows the way gradients
flow), left to right (the loss on the left) or in forward order (inputs on top, arrows from the
inputs to the loss). Exports offer the same three; on screen, Fit, Find, stepping, folds and
marks work the same in each, and the legend says which way the arrows point when it is not
top down.
"""

from __future__ import annotations

from core.layout.boxes import DIRECTIONS

DIRECTION_NAMES = {
    "TB": "&Top Down (Gradients Flow Down)",
    "LR": "&Left to Right",
    "forward": "&Forward Order (Inputs on Top)",
}


def set_direction(view, direction: str, *, sync: bool = False) -> None:
    """Lay the view's graph out in ``direction`` ("TB", "LR" or "forward"), keeping its folds,
    selection and step states, and frame it anew as it opens."""
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}: use one of {', '.join(DIRECTIONS)}")
    if direction == view.direction:
        return
    view.direction = direction
    if view.call() is not None:
        view.relayout(sync=sync, refit=True)  # the picture turns: show it as it opens, not the old frame
