"""GraphState: what a GraphView shows, in one public object (``view.state``).

The view's parts (navigation, relations, marks, step states) and the functions that fill its
scene (``widgets.graph.scene``, ``widgets.graph.teaching``, ``widgets.graph.direction``) read
and write the view's shown call, layout, folds, selection, step states and toggles here, so no
module reaches into another object's private attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.layout.boxes import Layout
from core.model.trace import CallInfo


@dataclass
class GraphState:
    """The state a GraphView draws from; the view's methods keep it and the scene in step."""

    call: CallInfo | None = None  # the call shown
    layout: Layout | None = None  # its layout, None while nothing is laid out
    collapsed: frozenset[str] = frozenset()  # the folded module groups
    selected: str | None = None  # the selection drawn (the session's, as told)
    related: object | None = None  # the relation shown (``widgets.graph.relations.Related``)
    accented: list = field(default_factory=list)  # items accented by the relation shown
    states: dict[str, str] = field(default_factory=dict)  # step states by trace node id
    state_kinds: dict[str, int] = field(default_factory=dict)  # how many nodes are in each state
    box_tally: dict[str, dict[str, int]] = field(default_factory=dict)  # step states per drawn box
    states_token: int = 0  # bumped when states are replaced wholesale
    edge_texts: dict[tuple[str, str], str] = field(default_factory=dict)  # texts by (src, dst)
    leaf_lines: dict[str, list[str]] = field(default_factory=dict)  # leaf chips' lines while stepping
    applied_texts: tuple | None = None  # what the edge items were last given (``scene.apply_edge_texts``)
    show_saved: bool = False  # saved tensors drawn
    show_shapes: bool = False  # tensor shapes on edges
    show_slots: bool = False  # next_functions entries on edges
    show_values: bool = False  # leaf values and root seeds
    detail: bool = True  # per-box items shown (False: the zoomed-out overview)
    fit_next: bool = False  # frame the next scene as it opens
    focus_after: str | None = None  # the box to bring into view once the next scene is built
    opening: bool = False  # the opening frame is shown and the user has not moved it
    pending: bool = False  # a layout runs on the worker thread
    sync: bool = False  # the last layout ran on the GUI thread (tests, exports)
