"""The fold and frame a graph opens at, so that its first view reads. Qt-free.

Model Explorer opens a model at its top level and lets the user expand; here the opening goes
as deep into the module tree as still fits the view with text at least 9 px high, whole
levels at a time, and stops at the top level when not even that fits.
"""

from __future__ import annotations

from core.layout.boxes import LINE_H, MIN_W, PAD_Y, Layout
from core.layout.compound import layout_call
from core.layout.groups import group_info
from core.model.trace import CallInfo

READABLE_SCALE = 0.9  # node sub-labels are 10 px: at this scale the smallest text is 9 px on screen
SMALL_GRAPH = 150  # graphs up to this many nodes open unfolded (every op is the lesson)
MAX_OPEN_BOXES = 400


def opening_layout(
    call: CallInfo,
    area: tuple[float, float],
    *,
    show_saved: bool = False,
    engine: str = "auto",
    scale: float = READABLE_SCALE,
    small: int = SMALL_GRAPH,
    direction: str = "TB",
) -> tuple[frozenset[str], Layout]:
    """The fold a graph opens at: the deepest level of the module tree whose layout fits ``area``
    (width, height in pixels) at ``scale``, opening whole levels at a time, as Model Explorer does.
    When not even the top level fits, the top level (a view opens it on the loss)."""
    if len(call.nodes) <= small:
        return frozenset(), layout_call(call, show_saved=show_saved, engine=engine, direction=direction)
    info = group_info(call)
    w, h = area
    # A level with more boxes than the area holds (a box and the gap around it take at least
    # 4 x 64 x 31 px at scale 1) cannot fit: no need to lay it out.
    room = max(8, int(w * h / (4 * MIN_W * (LINE_H + 2 * PAD_Y) * scale * scale)))
    best: tuple[frozenset[str], Layout] | None = None
    level = frozenset(info.drawn_children(None))
    while True:
        boxes = len(call.nodes) - sum(info.count[g] for g in level) + len(level)
        if best is not None and boxes > min(MAX_OPEN_BOXES, room):
            break
        lay = layout_call(call, collapsed=level, show_saved=show_saved, engine=engine, direction=direction)
        fits = lay.width * scale <= w and lay.height * scale <= h
        if best is None or fits:
            best = (level, lay)
        if not fits or not level:
            break
        # Opening a group shows at least its own nodes and one box per child: a cheap bound
        # that spares checking thousands of subgroups when the next level is too big anyway.
        bound = boxes + sum(info.module_count.get(g, 0) + len(info.children.get(g, ())) - 1 for g in level)
        if bound > min(MAX_OPEN_BOXES, room):
            break
        level = frozenset(c for g in level for c in info.drawn_children(g))
    return best
