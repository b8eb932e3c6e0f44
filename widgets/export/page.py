"""Exports for slides and paper: the sheet fitted to a 16:9 or 4:3 slide or an A4 / Letter page.

Text is never shrunk below ``MIN_PAGE_TEXT`` on paper and ``MIN_SLIDE_TEXT`` on a slide
(pixels in a PNG, points in a PDF or SVG; on a slide, points of the SVG's page in a PNG too,
so that both show the same picture: 10 points are 20 pixels on a 1920 x 1080 slide):
when the graph does not fit at that size, module groups fold, deepest level first, until it
does; when even the top level does not fit (a long chain with no modules), the page shows
the part of the graph around the loss and its caption says so. A graph showing values is not
folded (``keep_values_open``): on a slide, where it would be cropped at ``MIN_SLIDE_TEXT``, it
is drawn whole at the largest scale that fits, down to ``MIN_PAGE_TEXT``, and cropped only
when it does not fit even so, in either direction and spacing. Any graph of at most
``OPEN_VALUES_NODES`` nodes that would still be cropped on a slide goes down to ``MIN_WHOLE_TEXT``
(9 px on a 1920 x 1080 slide): a teacher shows the whole lesson rather than a part of it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from PySide6.QtCore import QRectF

from core.layout.groups import group_info
from widgets.export.sheet import MARGIN, Sheet
from widgets.graph import edge_labels

log = logging.getLogger(__name__)

# name -> (PNG width, height in pixels; PDF / SVG width, height in points)
PAGES = {
    "16:9": ((1920, 1080), (960.0, 540.0)),
    "4:3": ((1600, 1200), (720.0, 540.0)),
    "A4": ((1240, 1754), (595.0, 842.0)),  # portrait, 150 dpi in PNG
    "Letter": ((1275, 1650), (612.0, 792.0)),
}
MIN_PAGE_TEXT = 9.0
MIN_SLIDE_TEXT = 10.0  # read from the back of a room
MIN_WHOLE_TEXT = 4.5  # a slide of a small graph, drawn whole rather than a part of it
SLIDES = ("16:9", "4:3")
MAX_PAGE_SCALE = 6.0  # PNG pixels per scene unit (other formats in proportion to the page's width)
FIT_ROUNDS = 6
OPEN_VALUES_NODES = 40
CHROME_TEXT = 20.0  # PNG pixels: a page that enlarges the graph draws its legend's smallest text no larger
RING = 7.0  # a node's state ring (current, failed) is drawn this far outside its box
CLEAR = 4.0  # scene units between the drawing and the legend's rule under it
MAX_FOLD_BOXES = 400  # fold levels with more boxes than this are not tried
SLIDE_ENGINES = ("compact", "compact-gaps")  # the built-in engine's slide spacings, the tightest first
CROPPED_NOTE = "The part of the graph around the loss; fold modules or pick a larger page for the rest."


@dataclass
class PagePlan:
    """How the sheet goes on the page: ``scale`` output units per scene unit, centred."""

    page: str
    size: tuple[float, float]  # page width, height in output units (pixels or points)
    sheet: Sheet
    scale: float
    text: float  # the smallest text on the page, in output units
    collapsed: frozenset[str]
    cropped: bool = False

    @property
    def offset(self) -> tuple[float, float]:
        return ((self.size[0] - self.sheet.width * self.scale) / 2, (self.size[1] - self.sheet.height * self.scale) / 2)


def page_size(page: str, fmt: str) -> tuple[float, float]:
    if page not in PAGES:
        raise ValueError(f"unknown page {page!r}: use one of {', '.join(PAGES)}")
    return PAGES[page][0] if fmt == "png" else PAGES[page][1]


def smallest_text(view, legend: bool = True) -> float:
    """The smallest text the view's scene draws, in scene units (pixels at 100 %)."""
    t = view.theme()
    sizes = [t.font_px]
    if any("\n" in item.box.label for item in view.node_items.values()):
        sizes.append(t.font_px - 1)
    if view.group_items or legend:
        sizes.append(t.small_font_px + 1)
    if view.saved_items or view.shows_shapes() or view.edge_texts() or view.marks.tags:  # marks, notes, chips
        sizes.append(t.small_font_px)
    return float(min(sizes))


def drawn_rect(view) -> QRectF:
    """The scene rectangle the graph is drawn in: its boxes (with room for a state ring), frames,
    edges, their texts and the notes beside them. Without the layout's margin and the room a
    node item keeps for its hover ring: on a page, the page's margin is the only one (and
    ``CLEAR`` below, above the legend's rule)."""
    rect = QRectF()
    for item in view.node_items.values():
        ring = RING if item.state or item.selected or item.highlighted else 1.0
        b = item.box
        rect = rect.united(QRectF(b.x - ring, b.y - ring, b.w + 2 * ring, b.h + 2 * ring))
    for item in [*view.group_items.values(), *view.edge_items, *view.saved_items, *view.marks.items()]:
        if item.isVisible():
            rect = rect.united(item.sceneBoundingRect())
    return rect.adjusted(0, 0, 0, CLEAR)


def plan_page(view, page: str, fmt: str, make_sheet, *, fold: bool = True, deepen: bool = False,
              legend: bool = True, caption: str | None = None, **sheet_options) -> PagePlan:
    """Fit the view's graph to ``page``, folding the view's module groups when ``fold`` and, with
    ``deepen``, opening deeper levels while they still fit (the view is left folded as planned).
    ``make_sheet(view, caption=..., source=..., **sheet_options)`` builds the sheet.

    On a slide the text is at least ``MIN_SLIDE_TEXT``; where that would show only the part
    around the loss (values written along a long graph's edges), the paper minimum is used
    instead: more of the graph, the whole of it where it fits so."""
    slide_spacing(view, page)
    options = dict(fold=fold, deepen=deepen, legend=legend, caption=caption, **sheet_options)
    start = view.collapsed()
    plan = _plan(view, page, fmt, make_sheet, MIN_SLIDE_TEXT if page in SLIDES else MIN_PAGE_TEXT, **options)
    if plan.cropped and page in SLIDES:
        if view.collapsed() != start:
            view.set_collapsed(start, sync=True)
        plan = _plan(view, page, fmt, make_sheet, MIN_PAGE_TEXT, **options)
        call = view.call()
        if plan.cropped and call is not None and len(call.nodes) <= OPEN_VALUES_NODES:
            # a small graph (a lesson, often with its values): whole and smaller beats a part of it
            if view.collapsed() != start:
                view.set_collapsed(start, sync=True)
            return _plan(view, page, fmt, make_sheet, MIN_WHOLE_TEXT, **options)
    return plan


def _values_open(view) -> bool:
    call = view.call()
    return view.state.show_values and call is not None and len(call.nodes) <= OPEN_VALUES_NODES


def _plan(view, page: str, fmt: str, make_sheet, least: float, *, fold: bool, deepen: bool, legend: bool,
          caption: str | None, **sheet_options) -> PagePlan:
    """``plan_page`` with text of at least ``least`` (points of the page)."""
    w, h = page_size(page, fmt)
    most = MAX_PAGE_SCALE * w / PAGES[page][0][0]
    least *= PAGES[page][0][0] / PAGES[page][1][0] if fmt == "png" and page in SLIDES else 1.0

    def attempt(crop=None, note: str | None = None) -> tuple[Sheet, float, float]:
        text = smallest_text(view, legend)
        cap = " ".join(x for x in (caption, note) if x) or None
        source = crop or drawn_rect(view)
        sheet = make_sheet(view, caption=cap, source=source, legend=legend, **sheet_options)
        s = min(w / sheet.width, h / sheet.height, most)
        if crop is None:  # the graph fills the page; the legend and caption wrap to the width left
            s = min(w / (sheet.source.width() + 2 * MARGIN), h / (sheet.source.height() + 2 * MARGIN), most)
            for _ in range(FIT_ROUNDS):
                # the legend's smallest text (a mark's sample) at CHROME_TEXT, within the fit's tolerance
                chrome = min(1.0, CHROME_TEXT * w / PAGES[page][0][0] / (0.995 * s * view.theme().small_font_px))
                wide = make_sheet(view, caption=cap, source=source, legend=legend, width=w / s, chrome=chrome,
                                  **sheet_options)
                fit = min(w / wide.width, h / wide.height, most)
                sheet, done, s = wide, fit >= s * 0.995, fit
                if done:
                    break
        return sheet, s, text

    sheet, s, text = attempt()
    fits = s * text >= least
    if fits and not deepen:
        return PagePlan(page, (w, h), sheet, s, s * text, view.collapsed())
    call = view.call()
    if (fold or deepen) and call is not None:
        info = group_info(call)
        levels, previous = [], None
        for depth in range(64):
            coll = info.fold_to_depth(depth)
            if coll == previous or not coll:
                break
            previous = coll
            boxes = len(call.nodes) - sum(info.count[g] for g in coll) + len(coll)
            if boxes <= MAX_FOLD_BOXES and (deepen or boxes < len(view.node_items)):
                levels.append(coll)
        if deepen and len(call.nodes) <= MAX_FOLD_BOXES:
            levels.append(frozenset())
        if fits:  # deeper levels only: the one shown already fits
            shown = len(view.node_items)
            levels = [c for c in levels if len(call.nodes) - sum(info.count[g] for g in c) + len(c) > shown]
            levels.insert(0, view.collapsed())
        for coll in reversed(levels):  # the most detail first
            view.set_collapsed(coll, sync=True)
            sheet, s, text = attempt()
            if s * text >= least:
                return PagePlan(page, (w, h), sheet, s, s * text, view.collapsed())
    # Not even the top level fits: the region around the loss, at the smallest legible size.
    s = min(most, least / text)
    full = sheet.source
    for _ in range(3):  # the caption's height depends on the width: settle in a few rounds
        src_w = min(full.width(), max(40.0, w / s - (sheet.width - sheet.source.width())))
        src_h = min(full.height(), max(40.0, h / s - (sheet.height - sheet.source.height())))
        cx, cy = _root_centre(view, full)
        x = min(max(cx - src_w / 2, full.left()), full.right() - src_w)
        y = min(max(cy - src_h / 2, full.top()), full.bottom() - src_h)
        sheet, s2, text = attempt(QRectF(x, y, src_w, src_h), CROPPED_NOTE)
        if s2 * text >= least - 1e-6:
            s = s2
            break
    log.info("%s page: showing the part of the graph around the loss", page)
    return PagePlan(page, (w, h), sheet, min(s, w / sheet.width, h / sheet.height), s * text, view.collapsed(), True)


def keep_values_open(view, options: dict) -> dict:
    """``plan_page`` options for the view: a graph of at most ``OPEN_VALUES_NODES`` nodes showing
    values is opened and never folded (a folded module hides its values)."""
    if _values_open(view):
        view.set_collapsed(frozenset(), sync=True)
        return dict(options, fold=False, deepen=False)
    return options


def slide_spacing(view, page: str) -> None:
    """On a slide, the built-in engine lays the graph out with its compact spacing (the same text
    on less room, so that it is drawn larger). Where values or shapes are written along the edges,
    only when their labels find spots as clear as on the roomy spacing (a label on a clear spot:
    on or beside its own edge, covering nothing); else compact boxes with the roomy gaps between
    layers, on the same terms; else the roomy spacing (always, past ``OPEN_VALUES_NODES`` nodes:
    each try lays out and labels the whole graph). The view is laid out as chosen, in its
    ``direction``."""
    if page not in SLIDES or view.engine not in ("auto", "layered", *SLIDE_ENGINES):
        return
    roomy = "auto" if view.engine in SLIDE_ENGINES else view.engine
    if not (view.state.show_values or view.shows_shapes() or view.edge_texts()):
        _lay_out(view, SLIDE_ENGINES[0])
        return
    _lay_out(view, roomy)
    call = view.call()
    if call is None or len(call.nodes) > OPEN_VALUES_NODES:
        return
    clear = label_faults(view)
    for engine in SLIDE_ENGINES:
        _lay_out(view, engine)
        if label_faults(view) <= clear:
            return
    _lay_out(view, roomy)


def _lay_out(view, engine: str) -> None:
    """The view laid out with ``engine`` in its direction, unless it already is."""
    layout = view.graph_layout()
    if view.engine != engine or layout is None or layout.direction != view.direction:
        view.engine = engine
        view.relayout(sync=True)


def label_faults(view) -> int:
    """How badly the view's edge labels break the placer's rules, summed (0: every label on a
    clear spot: nearer its own edge than any other, covering nothing)."""
    found = edge_labels._PLACERS.get(view.scene())  # (edges, the scene's LabelPlacer)
    return sum(found[1].faults.values()) if found is not None else 0


def plan_slide(view, page: str, fmt: str, make_sheet, **options) -> PagePlan:
    """``plan_page`` in the direction, top-down or left-to-right, that shows the most of the
    graph (uncropped, at the slide's text size where it can, fewest folds) and, of those, draws
    its text larger on the page: a tall graph goes across a wide slide."""
    best = None
    slide_text = MIN_SLIDE_TEXT * (PAGES[page][0][0] / PAGES[page][1][0] if fmt == "png" else 1.0)
    for direction in ("TB", "LR"):
        if view.direction != direction:
            view.direction = direction
            view.relayout(sync=True)
        plan = plan_page(view, page, fmt, make_sheet, **options)
        shown = (not plan.cropped, plan.text >= slide_text - 1e-6, len(view.node_items))
        if best is None or shown > best[3] or shown == best[3] and _larger(plan, best[1]):
            best = (direction, plan, view.collapsed(), shown)
    direction, plan, collapsed, _ = best
    if view.direction != direction or view.collapsed() != collapsed:
        view.direction = direction
        view.set_collapsed(collapsed, sync=True)
        plan = plan_page(view, page, fmt, make_sheet, **options)
    return plan


def _larger(plan: PagePlan, other: PagePlan) -> bool:
    """``plan`` draws the graph's text larger than ``other`` or, the same (both at the largest
    scale), covers more of the page."""
    if abs(plan.text - other.text) > 0.02 * other.text:
        return plan.text > other.text

    def area(p: PagePlan) -> float:
        return p.sheet.source.width() * p.sheet.source.height() * p.scale * p.scale

    return area(plan) > area(other) * 1.02


def _root_centre(view, full: QRectF) -> tuple[float, float]:
    """Where the loss is drawn (top, bottom or left, by the layout's direction)."""
    call, layout = view.call(), view.graph_layout()
    box = None
    if call is not None and layout is not None and call.roots:
        box = layout.nodes.get(layout.members.get(call.roots[0], ""))
    if box is None:
        return full.center().x(), full.top()
    return box.x + box.w / 2, box.y + box.h / 2
