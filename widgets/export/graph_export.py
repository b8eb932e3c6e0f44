"""Export a graph view as PNG, SVG, PDF, DOT or JSON, and a stepping session as frames and a GIF.

Exports draw the view's own scene (every node item, never the zoomed-out overview) on a
sheet with a title, a legend and a caption, so what is exported is what the view shows:
collapsed groups, saved tensors, shapes, step states, edge gradients and search highlights.
The selection ring is left out unless asked for. ``export_call`` does the same headless,
from a CallInfo, on an offscreen view.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QBuffer, QIODevice, QMarginsF, QRectF, QSize, QSizeF
from PySide6.QtGui import QColor, QFontMetricsF, QImage, QPageLayout, QPageSize, QPainter, QPdfWriter
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QApplication, QGraphicsItem
import shiboken6

from core.layout.export_dot import call_to_dot
from core.layout.groups import default_collapsed
from core.layout.boxes import Layout
from core.model.forward_errors import error_title, failed_op, op_title
from core.model.nan_check import hold_nan_check
from core.model.step_state import step_texts, step_view
from core.model.trace import CallInfo, Trace
from widgets.export.page import keep_values_open, plan_page, plan_slide
from widgets.export.sheet import Sheet, layout_sheet, paint_sheet
from widgets.graph.norm_colours import NormScaleItem, add_norm_scale
from widgets.graph.painting import color, font
from widgets.graph.teaching import set_show_slots, set_show_values
from widgets.graph.view import GraphView
from widgets.theme import get_theme

log = logging.getLogger(__name__)

FORMATS = ("png", "svg", "pdf", "dot", "json")
COLOR_BY = (None, "grad-norm")  # how edges and leaves may be coloured (None: by kind, as always)
MAX_PNG_SIDE = 32000  # pixels; bigger images are scaled down
MAX_PNG_PIXELS = 64_000_000
MAX_PDF_SIDE = 14400.0  # points: the largest page PDF readers accept (200 inches)
PT_PER_UNIT = 0.75  # one scene unit is one pixel at 96 dpi
NOTICE_CHARS = 150
AUTO_DIRECTION_NODES = 2000  # bigger graphs on a page stay top-down rather than being laid out twice
STEP_STATES = ("executed", "current", "frontier", "failed")  # legend order of step marks
_keep: dict[str, QApplication] = {}


class ExportError(RuntimeError):
    """An export that cannot be made; the message says why."""


def ensure_app() -> QApplication:
    """The running QApplication, or a new one (offscreen when there is no display)."""
    app = QApplication.instance()
    if app is None:
        if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        app = QApplication(["backprop-studio-export"])
        _keep["app"] = app  # the application must outlive every view made for exports
    elif not isinstance(app, QApplication):
        raise ExportError("exports need a QApplication (a QGuiApplication cannot hold a graph view)")
    return app


def format_of(path, fmt: str | None = None) -> str:
    fmt = (fmt or Path(path).suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise ExportError(f"{path}: unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    return fmt


# -- preparing the view ------------------------------------------------------------------------


@contextmanager
def prepared(view, theme: str | None = None, selection: bool = False):
    """The view in ``theme``, with every item shown and uncached (so vector output stays
    vector), the colour scale of Colour by Gradient Norm under the graph and, unless
    ``selection``, without the selection ring; all restored after."""
    old_theme = view.theme().name
    if theme and theme != old_theme:
        view.set_theme(theme)
    selected = [i for i in view.node_items.values() if i.selected] if not selection else []
    active = [e for e in view.edge_items if e.active] if not selection else []
    for item in selected:
        item.set_selected(False)
    for e in active:
        e.set_active(False)
    banner = view.banner  # the sheet writes the error itself, wrapped
    if banner is not None:
        banner.setVisible(False)
    with view.export_mode() as scene:
        has_scale = any(isinstance(item, NormScaleItem) for item in scene.items())
        scale = None if has_scale else add_norm_scale(view)  # an offscreen view has its own already
        caches = [(item, item.cacheMode()) for item in scene.items()]
        for item, _ in caches:
            item.setCacheMode(QGraphicsItem.NoCache)
        try:
            yield scene
        finally:
            for item, mode in caches:
                item.setCacheMode(mode)
            if scale is not None:
                scene.removeItem(scale)
            for item in selected:
                item.set_selected(True)
            for e in active:
                e.set_active(True)
            if banner is not None:
                banner.setVisible(True)
            if view.theme().name != old_theme:
                view.set_theme(old_theme)


def source_rect(view, region: str = "all") -> QRectF:
    """The scene rectangle to export: the whole graph (with edge texts that stick out) or what
    the viewport shows."""
    scene = view.scene()
    rect = QRectF(scene.sceneRect())
    if region == "visible":
        visible = view.mapToScene(view.viewport().rect()).boundingRect()
        return visible.intersected(rect) if visible.intersects(rect) else rect
    if region != "all":
        raise ExportError(f"unknown region {region!r}: use 'all' or 'visible'")
    layout = view.graph_layout()
    if layout is None:
        return rect
    rect = QRectF(0, 0, layout.width, layout.height)
    skip = (view.overview, view.banner)
    for item in scene.items():
        if item.isVisible() and item not in skip:
            rect = rect.united(item.sceneBoundingRect())
    return rect


def error_notice(view) -> str:
    """A line or two saying that the call raised (the banner's text, cut at a word after ~150 characters)."""
    call = view.call()
    if call is None or call.error is None or failed_op(call) is not None:
        return ""
    message = " ".join(call.error.message.split())
    if len(message) > NOTICE_CHARS:
        message = message[: message.rfind(" ", 0, NOTICE_CHARS)] + " \u2026"
    return f"This call raised {call.error.type}: {message}"


def failure_title(view, title: str | None) -> tuple[str | None, str]:
    """(title, notice) of a sheet showing the graph a forward pass failed on: the error is the title,
    in place of none or of the call's own default title (the export dialog's), else under the title
    given. Other graphs keep ``title`` and the notice of ``error_notice``."""
    call = view.call()
    op = failed_op(call)
    if op is None:
        return title, error_notice(view)
    said = op_title(op)
    if title is None or not title.strip() or title == call.title or title == said:
        return said, ""
    return title, said


def make_sheet(view, *, region="all", title=None, caption=None, legend=True, source=None, entries=None,
               width: float | None = None, chrome: float = 1.0) -> Sheet:
    keys = (view.legend.entries() if entries is None else list(entries)) if legend else []
    layout = view.graph_layout()
    if keys and layout is not None and not any(k.startswith("flow_") for k in keys):
        keys.append("flow_forward" if layout.direction == "forward" else "flow_backward")
    title, notice = failure_title(view, title)
    return layout_sheet(source or source_rect(view, region), view.theme(), title=title, caption=caption, legend=keys,
                        notice=notice, width=width, chrome=chrome)


def _background(background: str | None, theme_name: str) -> QColor | None:
    """None or "theme": the theme's background (white in print); "white", "transparent" or #rrggbb."""
    if background == "transparent":
        return None
    if background in (None, "theme"):
        return color(get_theme(theme_name).background)
    if background == "white":
        return QColor("#ffffff")
    c = color(background)
    if not c.isValid():
        raise ExportError(f"unknown background {background!r}: use white, transparent, theme or #rrggbb")
    return c


# -- the three drawn formats -------------------------------------------------------------------


def render_png(view, path, *, scale: float = 2.0, dpi: float | None = None, background: str | None = None,
               region: str = "all", title=None, caption=None, theme: str | None = None, legend: bool = True,
               selection: bool = False, sheet: Sheet | None = None, plan=None) -> Path:
    """A PNG of the sheet at ``scale`` pixels per scene unit (or ``dpi``; 96 dpi is scale 1), or
    laid on a page (``plan``, a ``widgets.export.page.PagePlan``)."""
    if dpi:
        scale = dpi / 96.0
    path = Path(path)
    with prepared(view, theme, selection) as scene:
        if plan is not None:
            sheet, scale = plan.sheet, plan.scale
        sheet = sheet or make_sheet(view, region=region, title=title, caption=caption, legend=legend)
        scale = _fit_png_scale(sheet, scale)
        size = (round(sheet.width * scale), round(sheet.height * scale)) if plan is None else plan.size
        image = QImage(max(1, int(size[0])), max(1, int(size[1])), QImage.Format_ARGB32_Premultiplied)
        if image.isNull():
            raise ExportError(f"{path}: the image ({sheet.width * scale:.0f} x {sheet.height * scale:.0f}) "
                              "is too big; lower the scale")
        image.fill(0)
        dots = round(96 * scale / 0.0254)
        image.setDotsPerMeterX(dots)
        image.setDotsPerMeterY(dots)
        p = QPainter(image)
        try:
            back = _background(background, view.theme().name)
            if plan is not None:
                if back is not None:
                    image.fill(back)
                p.translate(*plan.offset)
            p.scale(scale, scale)
            paint_sheet(p, sheet, scene, view.theme(), back)
        finally:
            p.end()
    if not image.save(str(path), "PNG"):
        raise ExportError(f"{path}: cannot write the PNG file")
    return path


def _fit_png_scale(sheet: Sheet, scale: float) -> float:
    w, h = sheet.width * scale, sheet.height * scale
    shrink = min(1.0, MAX_PNG_SIDE / max(w, h, 1), (MAX_PNG_PIXELS / max(w * h, 1)) ** 0.5)
    if shrink < 1.0:
        log.warning("graph too big for a %.0f x %.0f PNG: scale %.2f instead of %.2f", w, h, scale * shrink, scale)
    return scale * shrink


def render_svg(view, path, *, background: str | None = None, region: str = "all", title=None, caption=None,
               theme: str | None = None, legend: bool = True, selection: bool = False, plan=None) -> Path:
    """A vector SVG of the sheet; every label line is a ``<text>`` element. With ``plan`` the
    SVG is the page's size in points, the sheet scaled and centred on it."""
    path = Path(path)
    with prepared(view, theme, selection) as scene:
        sheet = plan.sheet if plan is not None else make_sheet(view, region=region, title=title, caption=caption,
                                                               legend=legend)
        buffer = QBuffer()  # one write at the end: much faster than QFile's many small ones
        buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        gen = QSvgGenerator()
        gen.setOutputDevice(buffer)
        w, h = (round(sheet.width), round(sheet.height)) if plan is None else (round(plan.size[0]), round(plan.size[1]))
        gen.setSize(QSize(w, h))
        gen.setViewBox(QRectF(0, 0, w, h))
        gen.setResolution(96 if plan is None else 72)  # a page's units are points
        gen.setTitle(sheet.title or "Backprop Studio graph")
        gen.setDescription(caption or "autograd graph exported by Backprop Studio")
        p = QPainter()
        if not p.begin(gen):
            raise ExportError(f"{path}: cannot write the SVG file")
        try:
            back = _background(background, view.theme().name)
            if plan is not None:
                if back is not None:
                    p.fillRect(QRectF(0, 0, w, h), back)
                p.translate(*plan.offset)
                p.scale(plan.scale, plan.scale)
            paint_sheet(p, sheet, scene, view.theme(), back)
        finally:
            p.end()
    try:
        path.write_bytes(buffer.data().data())
    except OSError as exc:
        raise ExportError(f"{path}: cannot write the SVG file: {exc}") from None
    return path


def render_pdf(view, path, *, background: str | None = None, region: str = "all", title=None, caption=None,
               theme: str | None = None, legend: bool = True, selection: bool = False, plan=None) -> Path:
    """A one-page vector PDF sized to the sheet (fonts embedded), or to the page of ``plan``."""
    path = Path(path)
    with prepared(view, theme, selection) as scene:
        sheet = plan.sheet if plan is not None else make_sheet(view, region=region, title=title, caption=caption,
                                                               legend=legend)
        k = min(PT_PER_UNIT, MAX_PDF_SIDE / max(sheet.width, sheet.height)) if plan is None else plan.scale
        page = (sheet.width * k, sheet.height * k) if plan is None else plan.size
        writer = QPdfWriter(str(path))
        writer.setTitle(sheet.title or "Backprop Studio graph")
        writer.setCreator("Backprop Studio")
        writer.setPageMargins(QMarginsF(0, 0, 0, 0), QPageLayout.Unit.Point)
        size = QPageSize(QSizeF(*page), QPageSize.Unit.Point, "graph", QPageSize.SizeMatchPolicy.ExactMatch)
        writer.setPageSize(size)
        p = QPainter()
        if not p.begin(writer):
            raise ExportError(f"{path}: cannot write the PDF file")
        try:
            dots = writer.resolution() / 72.0
            back = _background(background, view.theme().name)
            if plan is not None:
                p.scale(dots, dots)
                if back is not None:
                    p.fillRect(QRectF(0, 0, *page), back)
                p.translate(*plan.offset)
                p.scale(k, k)
            else:
                p.scale(dots * k, dots * k)
            paint_sheet(p, sheet, scene, view.theme(), back)
        finally:
            p.end()
    return path


def render(view, path, fmt: str | None = None, **options) -> Path:
    """Write ``view`` to ``path`` in ``fmt`` (from the suffix when None); DOT and JSON come
    from the view's call and state."""
    fmt = format_of(path, fmt)
    if fmt == "png":
        return render_png(view, path, **options)
    opts = {k: v for k, v in options.items() if k not in ("scale", "dpi")}
    if fmt == "svg":
        return render_svg(view, path, **opts)
    if fmt == "pdf":
        return render_pdf(view, path, **opts)
    call = view.call()
    if call is None:
        raise ExportError("there is no graph to export")
    if fmt == "dot":
        text = call_to_dot(call, title=options.get("title"), collapsed=view.collapsed(),
                           states=view.node_states(), edge_texts=view.edge_texts(),
                           theme=options.get("theme") or view.theme().name)
        Path(path).write_text(text, encoding="utf-8")
        return Path(path)
    return save_json(call, path)


def save_json(call: CallInfo, path, trace: Trace | None = None) -> Path:
    """The trace as JSON: ``trace`` when given, else a trace holding only ``call``."""
    trace = trace or Trace(calls=[call], call_count=1)
    trace.save(path)
    return Path(path)


# -- headless --------------------------------------------------------------------------------


@contextmanager
def offscreen_view(call: CallInfo, *, theme="print", collapsed=None, show_saved=False, show_shapes=False,
                   states=None, edge_texts=None, direction: str = "TB", values=False, slots=False,
                   color_by: str | None = None):
    """A GraphView that is never shown, holding ``call`` laid out with the given state; with
    ``collapsed`` None, folded as the view opens it (big graphs: the readable overview).
    ``color_by`` "grad-norm": edges and leaves coloured by their gradient norms, the colour
    scale under the graph."""
    if color_by not in COLOR_BY:
        raise ExportError(f"unknown colouring {color_by!r}: use {', '.join(c for c in COLOR_BY if c)}")
    ensure_app()
    view = GraphView(theme=theme)
    try:
        view.resize(1200, 900)
        view.direction = direction
        if show_saved:
            view.set_show_saved(True)
        if values or slots:  # before the layout, which leaves values room along the edges
            set_show_values(view, values)
            set_show_slots(view, slots)
        view.set_colour_by_norm(color_by == "grad-norm")
        view.set_call(call, sync=True, collapsed=None if collapsed is None else frozenset(collapsed))
        if show_shapes:
            view.set_show_shapes(True)
        if states:
            view.set_node_states(states)
        if edge_texts:
            view.set_edge_texts(edge_texts)
        add_norm_scale(view)  # in the scene from the start: a page's plan measures it
        yield view
    finally:
        shiboken6.delete(view)


def export_call(call: CallInfo, path, fmt: str | None = None, *, theme: str = "print", title=None, caption=None,
                states=None, edge_texts=None, collapsed=None, show_saved=False, show_shapes=False,
                scale: float = 2.0, background: str | None = None, trace: Trace | None = None,
                direction: str | None = None, page: str | None = None, fold: bool | None = None,
                values=False, slots=False, color_by: str | None = None) -> Path:
    """Export one call without a window. ``background`` None is the theme's (white in print);
    ``collapsed`` None collapses big graphs as the view does; ``direction`` "TB", "LR" or
    "forward", or None: top-down, or on a page whichever of top-down and left-to-right draws
    the graph larger; ``page`` fits a slide or paper page ("16:9", "4:3", "A4", "Letter", see
    ``widgets.export.page``), folding rather than shrinking text; ``color_by`` "grad-norm" colours
    edges and leaves by their gradient norms. The drawn formats of a run that failed
    (``trace.error``) are titled by its error unless ``title`` is given. A trace checked for
    NaN/Inf (``trace.nan_check``) has its first non-finite op and gradient marked."""
    fmt = format_of(path, fmt)
    if fmt == "json":
        return save_json(call, path, trace)
    if title is None and trace is not None and trace.error is not None and trace.error.kind != "cancelled" \
            and fmt != "dot":
        title = error_title(trace.error)
    if fmt == "dot":
        if collapsed is None:
            collapsed = default_collapsed(call)
        Path(path).write_text(call_to_dot(call, title=title, collapsed=frozenset(collapsed), states=states,
                                          edge_texts=edge_texts, theme=theme), encoding="utf-8")
        return Path(path)
    if trace is not None:
        hold_nan_check(trace)  # the call's non-finite marks, as the window draws them
    with offscreen_view(call, theme=theme, collapsed=collapsed, show_saved=show_saved, show_shapes=show_shapes,
                        states=states, edge_texts=edge_texts, direction=direction or "TB", values=values,
                        slots=slots, color_by=color_by) as view:
        opts = dict(title=title, caption=caption, background=background)
        if page is not None:
            fold = collapsed is None if fold is None else fold
            plan = plan_page if direction is not None or len(call.nodes) > AUTO_DIRECTION_NODES else plan_slide
            options = dict(fold=fold, deepen=collapsed is None, caption=caption, title=title)
            if collapsed is None:
                options = keep_values_open(view, options)
            opts["plan"] = plan(view, page, fmt, make_sheet, **options)
        if fmt == "png":
            return render_png(view, path, scale=scale, **opts)
        return (render_svg if fmt == "svg" else render_pdf)(view, path, **opts)


# -- stepping ------------------------------------------------------------------------------------


def export_frames(call: CallInfo, steps: list[dict], directory, *, theme: str = "print", title=None,
                  collapsed=None, show_shapes=False, show_saved=False, scale: float = 1.5,
                  progress=None) -> list[Path]:
    """``frame_000.png`` … one per step, each the graph after that step; all the same size.

    ``progress(done, total)`` is called after each frame; returning False stops early."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if not steps:
        return []
    views = [step_view(call, steps, upto=k + 1) for k in range(len(steps))]
    with offscreen_view(call, theme=theme, collapsed=collapsed, show_shapes=show_shapes, show_saved=show_saved) as v:
        # Fixed geometry: the last frame has every edge text; the legend lists every state shown.
        v.set_node_states(views[-1].states)
        v.set_edge_texts(step_texts(call, views[-1]))
        source = source_rect(v)
        used = {s for sv in views for s in sv.states.values()}
        entries = [e for e in v.legend.entries() if e not in STEP_STATES]
        entries += [s for s in STEP_STATES if s in used]
        paths = []
        for k, sv in enumerate(views):
            v.set_node_states(sv.states)
            v.set_edge_texts(step_texts(call, sv))
            caption = f"Step {k + 1} of {len(steps)}: {_step_name(call, steps[k])}"
            sheet = make_sheet(v, title=title, caption=caption, source=source, entries=entries)
            paths.append(render_png(v, directory / f"frame_{k:03d}.png", scale=scale, sheet=sheet,
                                    background=None))
            if progress is not None and progress(k + 1, len(views)) is False:
                break
        return paths


def _step_name(call: CallInfo, record: dict) -> str:
    node = call.node(record.get("node") or "")
    name = record.get("name") or (node.name if node else "")
    label = node.label if node is not None and node.kind != "accumulate_grad" else None
    return f"{name} ({label})" if label else name


def export_gif(frames, path, duration_ms: int = 700, *, steps: list[dict] | None = None, **frame_options) -> Path:
    """An animated GIF from frame PNGs, or from a call and its ``steps`` (frames made first)."""
    from PIL import Image  # Pillow loads only when a GIF is written: nothing else needs it

    if isinstance(frames, CallInfo):
        with tempfile.TemporaryDirectory(prefix="bps-frames-") as tmp:
            paths = export_frames(frames, steps or [], tmp, **frame_options)
            return export_gif(paths, path, duration_ms)
    paths = [Path(f) for f in frames]
    if not paths:
        raise ExportError("no frames to put in a GIF: the stepping session has no steps")
    images = []
    for f in paths:
        with Image.open(f) as im:
            images.append(im.convert("RGB").quantize(colors=255, method=Image.Quantize.MEDIANCUT))
    images[0].save(path, save_all=True, append_images=images[1:], duration=duration_ms, loop=0, disposal=1,
                   optimize=False)
    return Path(path)


# -- checks -------------------------------------------------------------------------------------


def check_geometry(layout: Layout, theme: str = "print") -> list[str]:
    """Problems a reader would see: overlapping boxes, labels that do not fit their box (they
    would be cut short), edges without a route."""
    ensure_app()
    t = get_theme(theme)
    problems = []
    boxes = [(b.x, b.y, b.x + b.w, b.y + b.h, b.id) for b in layout.nodes.values()]
    boxes += [(s.x, s.y, s.x + s.w, s.y + s.h, f"saved {s.node}.{s.name}") for s in layout.saved]
    boxes.sort()
    for i, (x0, y0, x1, y1, a) in enumerate(boxes):
        for u0, v0, u1, v1, b in boxes[i + 1:]:
            if u0 >= x1:
                break
            if v0 < y1 and y0 < v1 and min(x1, u1) - u0 > 0.5 and min(y1, v1) - max(y0, v0) > 0.5:
                problems.append(f"boxes {a} and {b} overlap")
    for b in layout.nodes.values():
        lines = b.label.split("\n")
        leaf = b.kind == "accumulate_grad"
        pad = 8 + (b.h / 4 if leaf else 0)
        inner = b.w - 2 * pad
        heights = [t.font_px + 4] + [t.font_px + 3] * (len(lines) - 1)
        if sum(heights) > b.h - 4:
            problems.append(f"label of {b.id} ({len(lines)} lines) is taller than its box")
        for i, line in enumerate(lines):
            f = font(t.font_family, t.font_px if i == 0 else t.font_px - 1, i == 0 and b.kind in (
                "accumulate_grad", "group"))
            width = QFontMetricsF(f).horizontalAdvance(line)
            if width > inner + 0.5:
                problems.append(f"label line {line!r} of {b.id} is {width:.0f} px wide; its box has {inner:.0f}")
    for e in layout.edges:
        if len(e.points) < 2:
            problems.append(f"edge {e.src} -> {e.dst} has no route")
    return problems


def strip_call(trace: Trace, call: CallInfo) -> Trace:
    """A copy of ``trace`` holding only ``call`` (JSON export of one call)."""
    return replace(trace, calls=[call])
