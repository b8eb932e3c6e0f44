"""The export sheet: title on top, the graph, a legend and an optional caption below.

The view's legend is an overlay widget that no scene render sees, so the sheet draws its
own, from the same entries and with the same ``paint_node`` samples. All geometry is in
scene units (one unit is one pixel at 100 % zoom); each output format scales it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFontMetricsF, QPainter, QPen
from PySide6.QtWidgets import QGraphicsItem, QStyleOptionGraphicsItem

from widgets.graph.painting import color, font
from widgets.graph.minimap import LEGEND_ENTRIES, paint_legend_entry
from widgets.theme import Theme

MARGIN = 20.0
TITLE_PX = 20
CAPTION_PX = 12
LEGEND_ROW = 22.0
SAMPLE_W, SAMPLE_H = 38.0, 17.0
LEGEND_GAP = 22.0  # between legend entries on one row
MIN_TEXT_W = 360.0  # the narrowest a sheet with a legend or caption gets
WIDE = 640.0  # legends and captions widen a narrow sheet up to this before they wrap
TITLE_WIDE = 900.0  # a title (a failed run's error) widens a narrow sheet up to this before it wraps
# Texts that read well on paper; the rest come from the on-screen legend.
PRINT_TEXT = {"frame": "module", "group": "collapsed module", "retained": "retains .grad"}


def legend_text(key: str) -> str:
    return PRINT_TEXT.get(key, LEGEND_ENTRIES[key][0])


@dataclass
class Sheet:
    """Where each part of an export goes; ``source`` is the scene rectangle shown."""

    source: QRectF
    width: float
    height: float
    graph: QRectF
    title: str = ""
    title_rect: QRectF = field(default_factory=QRectF)
    caption: str = ""
    caption_rect: QRectF = field(default_factory=QRectF)
    notice: str = ""  # the call raised: said under the title
    notice_rect: QRectF = field(default_factory=QRectF)
    legend: list[tuple[str, QRectF]] = field(default_factory=list)  # key, rect of sample + text
    legend_rect: QRectF = field(default_factory=QRectF)
    chrome: float = 1.0  # title, notice, legend and caption are drawn this many times their size


def layout_sheet(
    source: QRectF, theme: Theme, *, title: str | None, caption: str | None, legend: list[str], notice: str = "",
    width: float | None = None, chrome: float = 1.0,
) -> Sheet:
    """Place title, graph, legend and caption around a graph of ``source``'s size; with ``width``
    the sheet is at least that wide and the legend and caption wrap to it (a page's width);
    ``chrome`` sizes everything but the graph (below 1 on a page that enlarges the graph)."""
    k = chrome
    title = (title or "").strip()
    caption = (caption or "").strip()
    legend = [k for k in legend if k in LEGEND_ENTRIES]
    title_font = font(theme.font_family, TITLE_PX, True)
    legend_font = font(theme.font_family, theme.small_font_px + 1)
    caption_font = font(theme.font_family, CAPTION_PX)
    lfm = QFontMetricsF(legend_font)
    entry_w = [(SAMPLE_W + 8 + lfm.horizontalAdvance(legend_text(e))) * k for e in legend]
    one_line = QFontMetricsF(title_font).horizontalAdvance(title) * k if title else 0.0
    # A long title wraps rather than widen the sheet past TITLE_WIDE (or the graph); on a page, past its width.
    title_w = min(one_line, max(source.width(), TITLE_WIDE * k if width is None else width - 2 * MARGIN))
    inner = max(source.width(), title_w, MIN_TEXT_W * k if (legend or caption) else 0.0)
    # A legend row or a caption line may widen a narrow graph's sheet (up to WIDE) rather than wrap.
    if entry_w:
        inner = max(inner, min(sum(entry_w) + LEGEND_GAP * k * (len(entry_w) - 1), WIDE * k), max(entry_w))
    if caption:
        inner = max(inner, min((QFontMetricsF(caption_font).horizontalAdvance(caption) + 4) * k, WIDE * k))
    if width is not None:
        inner = max(source.width(), title_w, max(entry_w, default=0.0), width - 2 * MARGIN)
    y = MARGIN
    sheet = Sheet(QRectF(source), 0, 0, QRectF(), title, caption=caption, chrome=k)
    if title:
        line = QFontMetricsF(title_font).height()
        h = line * 1.3 * k
        if one_line > inner + 0.5:
            h = (_wrapped_height(title_font, title, inner / k) + 0.3 * line) * k
        sheet.title_rect = QRectF(MARGIN, y, inner, h)
        y += h + 4 * k
    if notice:
        sheet.notice = notice
        h = _wrapped_height(font(theme.font_family, theme.font_px, True), notice, inner / k) * k
        sheet.notice_rect = QRectF(MARGIN, y, inner, h)
        y += h + 6 * k
    sheet.graph = QRectF(MARGIN + (inner - source.width()) / 2, y, source.width(), source.height())
    y += source.height()
    if legend:
        rows: list[list[int]] = [[]]
        row_w = 0.0
        for i, w in enumerate(entry_w):
            if rows[-1] and row_w + LEGEND_GAP * k + w > inner:
                rows.append([])
                row_w = 0.0
            row_w += (LEGEND_GAP * k if rows[-1] else 0.0) + w
            rows[-1].append(i)
        y += 10 * k
        top = y
        for row in rows:
            width = sum(entry_w[i] for i in row) + LEGEND_GAP * k * (len(row) - 1)
            x = MARGIN + (inner - width) / 2
            for i in row:
                sheet.legend.append((legend[i], QRectF(x, y, entry_w[i], LEGEND_ROW * k)))
                x += entry_w[i] + LEGEND_GAP * k
            y += LEGEND_ROW * k
        sheet.legend_rect = QRectF(MARGIN, top, inner, y - top)
    if caption:
        y += 10 * k
        h = _wrapped_height(caption_font, caption, inner / k) * k
        sheet.caption_rect = QRectF(MARGIN, y, inner, h)
        y += h
    sheet.width = inner + 2 * MARGIN
    sheet.height = y + MARGIN
    return sheet


def _wrapped_height(f, text: str, width: float) -> float:
    r = QFontMetricsF(f).boundingRect(QRectF(0, 0, width, 1e6), int(Qt.TextWordWrap | Qt.AlignHCenter), text)
    return r.height() + 2


def paint_sheet(p: QPainter, sheet: Sheet, scene, theme: Theme, background: QColor | None) -> None:
    """Draw the sheet in sheet units on a painter already scaled to its device."""
    p.setRenderHints(QPainter.Antialiasing | QPainter.TextAntialiasing | QPainter.SmoothPixmapTransform)
    if background is not None:
        p.fillRect(QRectF(0, 0, sheet.width, sheet.height), background)
    if sheet.title:
        p.setFont(font(theme.font_family, TITLE_PX, True))
        p.setPen(color(theme.text))
        _draw_text(p, sheet.title_rect, sheet.chrome, int(Qt.TextWordWrap | Qt.AlignHCenter | Qt.AlignVCenter),
                   sheet.title)
    if sheet.notice:
        p.setFont(font(theme.font_family, theme.font_px, True))
        p.setPen(color(theme.error))
        _draw_text(p, sheet.notice_rect, sheet.chrome, int(Qt.TextWordWrap | Qt.AlignHCenter | Qt.AlignTop),
                   sheet.notice)
    render_scene(p, scene, sheet.graph, sheet.source)
    if sheet.legend:
        paint_legend(p, sheet, theme)
    if sheet.caption:
        p.setFont(font(theme.font_family, CAPTION_PX))
        p.setPen(color(theme.muted_text))
        _draw_text(p, sheet.caption_rect, sheet.chrome, int(Qt.TextWordWrap | Qt.AlignHCenter | Qt.AlignTop),
                   sheet.caption)


def _draw_text(p: QPainter, rect: QRectF, k: float, flags: int, text: str) -> None:
    """``drawText`` in ``rect``, the font (set on ``p``) and the text ``k`` times their size."""
    if k == 1.0:
        p.drawText(rect, flags, text)
        return
    p.save()
    p.translate(rect.topLeft())
    p.scale(k, k)
    p.drawText(QRectF(0, 0, rect.width() / k, rect.height() / k), flags, text)
    p.restore()


def render_scene(p: QPainter, scene, target: QRectF, source: QRectF) -> None:
    """``scene.render`` for a target the size of ``source``. Plain top-level items are painted
    in stacking order straight from here, which skips the scene's per-item bookkeeping (a fifth
    of the time on a 5,000-node graph); anything nested, clipped or translucent goes through
    ``QGraphicsScene.render``."""
    items = [i for i in scene.items(Qt.AscendingOrder) if i.isVisible()]
    if any(i.parentItem() is not None or i.childItems() or i.opacity() < 1.0 or i.flags() & _CLIPS for i in items):
        scene.render(p, target, source, Qt.IgnoreAspectRatio)
        return
    option = QStyleOptionGraphicsItem()
    p.save()
    p.translate(target.topLeft() - source.topLeft())
    p.setClipRect(source)
    for item in items:
        if not item.sceneBoundingRect().intersects(source):
            continue
        option.exposedRect = item.boundingRect()
        p.save()
        p.setTransform(item.sceneTransform(), True)
        item.paint(p, option, None)
        p.restore()
    p.restore()


_CLIPS = QGraphicsItem.ItemClipsToShape | QGraphicsItem.ItemClipsChildrenToShape


def paint_legend(p: QPainter, sheet: Sheet, theme: Theme) -> None:
    """One sample and its meaning per entry, drawn as the on-screen legend draws them."""
    t = theme
    p.save()
    p.setPen(QPen(color(t.group_box_border), 0.8))
    k = sheet.chrome
    top = sheet.legend_rect.top() - 5 * k
    p.drawLine(sheet.legend_rect.left(), top, sheet.legend_rect.right(), top)
    text_font = font(t.font_family, t.small_font_px + 1)
    for key, placed in sheet.legend:
        p.save()
        p.translate(placed.topLeft())
        p.scale(k, k)
        rect = QRectF(0, 0, placed.width() / k, placed.height() / k)
        sample = QRectF(rect.left() + 4, rect.center().y() - SAMPLE_H / 2, SAMPLE_W - 8, SAMPLE_H)
        paint_legend_entry(p, key, sample, t, frame_width=t.line_width * 0.9, saved_inset=4)
        p.setFont(text_font)
        p.setPen(color(t.text))
        text_rect = QRectF(rect.left() + SAMPLE_W + 8, rect.top(), rect.width() - SAMPLE_W - 8, rect.height())
        p.drawText(text_rect, int(Qt.AlignLeft | Qt.AlignVCenter), legend_text(key))
        p.restore()
    p.restore()
