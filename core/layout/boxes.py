"""What a layout is made of: the drawn boxes, edge routes and group rectangles, with the sizes
they are estimated from. Qt-free.

Sizes are estimated from character counts (7 px a character at an 11 px font). The builders of
the visible graph (``core.layout.visible``), the built-in engine (``core.layout.compound``) and
Graphviz (``core.layout.dot``) all produce these types. ``Spacing`` is the room left between
and inside boxes: roomy on screen, compact on a slide, where the same text on less room is
drawn larger (or, with values written along the edges, ``COMPACT_GAPS``: compact boxes with the
roomy gaps between layers). An engine name ending in ``+labels`` ("auto+labels",
"compact+labels") asks for room for the values written along the edges (``Spacing.labels``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from core.layout.layered import LAYER_GAP, NODE_GAP

CHAR_W = 7.0
SMALL_CHAR_W = 5.8
LINE_H = 15.0
PAD_X = 12.0
PAD_Y = 8.0
MIN_W = 64.0
SAVED_H = 17.0
SAVED_GAP = 8.0
GROUP_PAD = 12.0
GROUP_LABEL = 22.0
GROUP_BOTTOM = 12.0
MARGIN = 24.0
DIRECTIONS = ("TB", "LR", "forward")


@dataclass(frozen=True)
class Spacing:
    """The room a layout leaves, in scene units (pixels of an 11 px font at 100 %)."""

    layer_gap: float = LAYER_GAP  # between layer bands: edge curves and the texts on edges live here
    node_gap: float = NODE_GAP  # between two boxes of one layer
    pad_y: float = PAD_Y  # above and below a box's text
    # Values written along the edges. Left to right a label stands above or below its edge in the
    # gap between two columns: the gap holds a label beside a fan of edges out of one box (at
    # least ``LABEL_COLUMN_GAP``), and the boxes of a column keep ``LABEL_ROW_GAP`` apart, so that
    # the edges of a fan part far enough for a label between two of them. Top down the labels
    # stand beside their edges and need no more room.
    labels: bool = False


ROOMY = Spacing()  # on screen: room for edge texts, hover rings and clicks
# A slide: an edge text (one 18-unit line) still fits in a gap, a two-line label keeps 5 units
# above and below; a 15-node graph then fits a 1920 x 1080 slide with 20 px text.
COMPACT = Spacing(layer_gap=28.0, node_gap=20.0, pad_y=5.0)
# A slide with values written along the edges: the labels of a fan of edges out of one box need
# the roomy gap between layers to part, the boxes keep their compact spacing.
COMPACT_GAPS = Spacing(layer_gap=LAYER_GAP, node_gap=20.0, pad_y=5.0)
SPACINGS = {"compact": COMPACT, "compact-gaps": COMPACT_GAPS}  # by engine name; the others are roomy
LABEL_COLUMN_GAP = 180.0
LABEL_ROW_GAP = 40.0
LABELS = "+labels"  # the suffix of an engine name that asks for ``Spacing.labels``


def spacing_of(engine: str) -> Spacing:
    """The room an engine name asks for: "compact" or "compact-gaps" (a slide's) or roomy, with
    ``+labels`` room for the values written along the edges."""
    base, labels = engine.removesuffix(LABELS), engine.endswith(LABELS)
    room = SPACINGS.get(base, ROOMY)
    return replace(room, labels=True) if labels else room


@dataclass(frozen=True)
class NodeBox:
    """A drawn box; x, y is the top-left corner. ``layer`` is the row counted from the top."""

    id: str
    x: float
    y: float
    w: float
    h: float
    layer: int
    label: str
    kind: str  # a NodeInfo kind, or "group" for a collapsed group


@dataclass(frozen=True)
class EdgePath:
    """An edge from a node to one of its next_functions; points run from src to dst."""

    src: str
    dst: str
    input_nr: int
    points: list[tuple[float, float]]
    slot: int = 0  # index in the source's ``next`` list
    count: int = 1  # trace edges merged into this one (collapsed groups)


@dataclass(frozen=True)
class GroupBox:
    path: str
    x: float
    y: float
    w: float
    h: float
    collapsed: bool
    count: int  # trace nodes inside
    label: str = ""  # the path relative to the enclosing drawn group
    depth: int = 0  # nesting depth among drawn groups


@dataclass(frozen=True)
class SavedBox:
    """A tensor saved for backward, drawn beside its node."""

    node: str
    name: str
    tensor: str | None
    x: float
    y: float
    w: float
    h: float
    label: str
    state: str = "saved"  # "saved", "freed" or "stale"


@dataclass(frozen=True)
class Layout:
    nodes: dict[str, NodeBox]
    edges: list[EdgePath]
    groups: list[GroupBox]
    width: float
    height: float
    saved: list[SavedBox] = field(default_factory=list)
    members: dict[str, str] = field(default_factory=dict)  # trace node id -> drawn box id
    engine: str = "layered"
    crossings: int = 0
    direction: str = "TB"  # "TB", "LR" or "forward" (edge points then run from input to consumer)



def group_id(path: str) -> str:
    return "group:" + path


def text_size(label: str, kind: str, pad_y: float = PAD_Y) -> tuple[float, float]:
    lines = label.split("\n")
    w = max(MIN_W, max(len(s) for s in lines) * CHAR_W + 2 * PAD_X)
    h = len(lines) * LINE_H + 2 * pad_y
    if kind == "accumulate_grad":
        w += h * 0.5  # rounded ends
    return w, h

