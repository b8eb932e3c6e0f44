"""Forward replay on the graph view: the graph woven op by op, as the forward pass made it.

A bar under the graph (``ReplayBar``: a slider over the ops in creation order, Play/Pause, the
speed, "op 5 of 12: AddBackward0, line 7") drives ``ForwardReplayer``. Frame k draws the first k
ops and their leaves (``core.model.forward_order``); the rest stays in place but faded to a
ghost, with the edges that reach it, so the layout never jumps and the class sees where the
graph is going. The newest op gets a ring. The Source panel highlights op k's line and the
memory chart shows a line at the time op k was made (its own line: the chart's hover cursor
hides when the mouse leaves). ``FramePainter`` is shared with the frame export
(``widgets.export.forward_frames``). Esc or the bar's close button leaves the replay.
"""

from __future__ import annotations

import pyqtgraph as pg
import shiboken6
from PySide6.QtCore import QEvent, QObject, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QPen, QShortcut
from PySide6.QtWidgets import QComboBox, QFrame, QGraphicsPathItem, QHBoxLayout, QLabel, QSlider, QToolButton, QWidget

from core.model.forward_order import ForwardReplay, forward_replay, replay_caption
from widgets.graph.painting import color, node_outline

FADED = 0.2  # opacity of what the forward pass has not made yet
RING_Z = 1.5  # above nodes and edges, below the marks' tags
SPEEDS = (1, 2, 5, 10, 30, 100)  # ops per second
PLAY_SECONDS = 15.0  # the speed picked for a new replay plays it in about this long
MEMORY_MARGIN = 0.06  # share of the memory chart's width kept between the replay's line and an edge


def _needs(item, members: dict) -> tuple[str, ...] | None:
    """The boxes an item belongs to (shown once they all are), or None: not the replay's (frames)."""
    box = getattr(item, "node_id", None)
    if box is not None:
        return (box,)
    key = getattr(item, "key", None)
    if key is not None:  # an edge
        return tuple(key)
    saved = getattr(item, "saved", None)
    if saved is not None and hasattr(saved, "node"):
        return (members.get(saved.node, saved.node),)
    target = getattr(item, "target", None)
    if isinstance(target, str):
        return (members.get(target, target),)
    if isinstance(target, tuple):
        if len(target) == 3 and target[0] == "saved":
            return (members.get(target[1], target[1]),)
        return tuple(members.get(t, t) for t in target)
    targets = getattr(item, "targets", None)
    if targets:
        return tuple(members.get(t, t) for t in targets)
    return None


class FramePainter:
    """Draws replay frames on a view: fades every item whose nodes are not all shown and rings the
    newest op's box. Items are indexed by the boxes they need once per scene, so a frame touches
    only the items of the boxes it shows or hides (a 4,802-node graph: a few items, not 10,000)."""

    def __init__(self, view):
        self.view = view
        self.ring: QGraphicsPathItem | None = None
        self._scene: tuple | None = None  # what the index was built over
        self._index: dict[str, list] = {}  # box id -> the items that need it
        self._needs: dict[int, tuple[str, ...]] = {}  # id(item) -> the boxes it needs
        self._boxes: set[str] | None = None  # the boxes shown (None: everything)

    def paint(self, nodes: frozenset[str] | None, newest: str | None = None) -> None:
        """Show ``nodes`` (None: every item, no ring), the box of ``newest`` ringed."""
        view = self.view
        layout = view.graph_layout()
        members = layout.members if layout is not None else {}
        boxes = None if nodes is None else {members.get(n, n) for n in nodes}
        items = (*view.node_items.values(), *view.edge_items, *view.saved_items, *view.marks.items())
        scene = (view.scene(), layout, tuple(map(id, items)))
        if scene != self._scene:  # a new scene, or new marks: index it and draw every item
            self._scene, self._index, self._needs = scene, {}, {}
            for item in items:
                needs = _needs(item, members)
                if needs is not None:
                    self._needs[id(item)] = needs
                    for b in needs:
                        self._index.setdefault(b, []).append(item)
            touched = [i for i in items if id(i) in self._needs]
        elif boxes is None or self._boxes is None:
            touched = [i for i in items if id(i) in self._needs]
        else:
            touched = {id(i): i for b in boxes ^ self._boxes for i in self._index.get(b, ())}.values()
        for item in touched:
            opacity = 1.0 if boxes is None or all(b in boxes for b in self._needs[id(item)]) else FADED
            if item.opacity() != opacity:
                item.setOpacity(opacity)
        self._boxes = boxes
        self._ring_box(view.node_items.get(members.get(newest, newest)) if newest and boxes is not None else None)

    def _ring_box(self, target) -> None:
        ring = self.ring
        if ring is not None and (not shiboken6.isValid(ring) or ring.scene() is not self.view.scene()):
            ring = self.ring = None  # its scene was cleared (a new layout): it went with it
        if target is None:
            if ring is not None:
                ring.hide()
            return
        if ring is None:
            ring = self.ring = QGraphicsPathItem()
            ring.setZValue(RING_Z)
            self.view.scene().addItem(ring)
        rect = QRectF(0, 0, target.box.w, target.box.h).adjusted(-4, -4, 4, 4)
        ring.setPath(node_outline(rect, target.style.shape))
        ring.setPen(QPen(color(self.view.theme().current), 3.0))
        ring.setPos(target.pos())
        ring.show()

    def ring_rect(self) -> QRectF | None:
        """The ring's scene rectangle (None: no ring shown)."""
        ring = self.ring
        if ring is None or not shiboken6.isValid(ring) or not ring.isVisible():
            return None
        return ring.sceneBoundingRect()


def paint_frame(view, nodes: frozenset[str] | None, newest: str | None = None) -> FramePainter:
    """One frame on ``view`` (see ``FramePainter``); the painter, to draw the next frames with."""
    painter = FramePainter(view)
    painter.paint(nodes, newest)
    return painter


class ReplayBar(QFrame):
    """Slider, Play/Pause, speed and caption of a forward replay; sits under the graph."""

    sig_frame = Signal(int)
    """The user moved to frame k (1 .. number of ops)."""
    sig_close = Signal()
    """The user asked to leave the replay (the close button)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("replay_bar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAutoFillBackground(True)
        self.title = QLabel("<b>Forward replay</b>")
        self.play_button = QToolButton(self)
        self.play_button.setText("\u25b6 Play")
        self.play_button.setToolTip("Play the forward pass op by op (Space)")
        self.play_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.play_button.clicked.connect(self.toggle_play)
        self.slider = QSlider(Qt.Orientation.Horizontal, self)
        self.slider.setToolTip("The ops in the order the forward pass made them")
        self.slider.setPageStep(1)
        self.slider.valueChanged.connect(self._on_slider)
        self.caption = QLabel("")
        self.caption.setMinimumWidth(self.fontMetrics().horizontalAdvance("op 888 of 888: AddmmBackward0, line 888"))
        self.speed = QComboBox(self)
        for s in SPEEDS:
            self.speed.addItem(f"{s} op/s" if s == 1 else f"{s} ops/s", s)
        self.speed.setToolTip("Ops per second while playing")
        self.speed.currentIndexChanged.connect(self._speed_changed)
        self.close_button = QToolButton(self)
        self.close_button.setText("\u2715")
        self.close_button.setToolTip("Leave the replay (Esc)")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self.sig_close)
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 3, 4, 3)
        row.addWidget(self.title)
        row.addWidget(self.play_button)
        row.addWidget(self.slider, 1)
        row.addWidget(self.caption)
        row.addWidget(self.speed)
        row.addWidget(self.close_button)
        self.timer = QTimer(self)
        self.timer.timeout.connect(self._advance)
        self.replay = ForwardReplay(steps=())
        space = QShortcut(QKeySequence(Qt.Key.Key_Space), self, self.toggle_play)
        space.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)

    def set_replay(self, replay: ForwardReplay, frame: int = 1) -> None:
        """Replay these ops, from ``frame``; the speed plays them in about ``PLAY_SECONDS``."""
        self.pause()
        self.replay = replay
        n = len(replay)
        self.slider.blockSignals(True)
        self.slider.setRange(1 if n else 0, n)
        self.slider.setValue(min(max(frame, 1), n) if n else 0)
        self.slider.blockSignals(False)
        for w in (self.slider, self.play_button, self.speed):
            w.setEnabled(n > 1)
        fast = next((i for i, s in enumerate(SPEEDS) if n / s <= PLAY_SECONDS), len(SPEEDS) - 1)
        self.speed.setCurrentIndex(fast)
        self.caption.setText(replay_caption(replay, self.frame()))

    def frame(self) -> int:
        return self.slider.value()

    def set_frame(self, k: int) -> None:
        """Show frame k (clamped), as if the user moved the slider there."""
        self.slider.setValue(k)

    def is_playing(self) -> bool:
        return self.timer.isActive()

    def play(self) -> None:
        if len(self.replay) < 2:
            return
        if self.frame() >= len(self.replay):
            self.set_frame(1)  # at the end: from the start again
        self._speed_changed()
        self.timer.start()
        self.play_button.setText("\u23f8 Pause")

    def pause(self) -> None:
        self.timer.stop()
        self.play_button.setText("\u25b6 Play")

    def toggle_play(self) -> None:
        self.pause() if self.is_playing() else self.play()

    def _speed_changed(self, *_args) -> None:
        self.timer.setInterval(round(1000 / (self.speed.currentData() or 1)))

    def _advance(self) -> None:
        if self.frame() >= len(self.replay):
            self.pause()
            return
        self.set_frame(self.frame() + 1)
        if self.frame() >= len(self.replay):
            self.pause()

    def _on_slider(self, k: int) -> None:
        self.caption.setText(replay_caption(self.replay, k))
        self.sig_frame.emit(k)


class ForwardReplayer(QObject):
    """Replays the forward pass of the call a GraphView shows, with its bar under the graph; the
    Source panel (``highlight_lines``) and the memory chart (a pyqtgraph ``view``) follow."""

    sig_active = Signal(bool)
    """The replay started (True) or ended (False)."""
    sig_frame = Signal(int)
    """Frame k is shown (1-based)."""

    def __init__(self, view, source=None, chart=None):
        super().__init__(view)
        self.view, self.source, self.chart = view, source, chart
        self.bar = ReplayBar(view)
        self.bar.hide()
        self.bar.sig_frame.connect(self._show)
        self.bar.sig_close.connect(self.stop)
        self.replay = ForwardReplay(steps=())
        self._call = None
        self.painter = FramePainter(view)
        self.memory_line: pg.InfiniteLine | None = None
        self.active = False
        self._esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), view, self.stop)
        self._esc.setContext(Qt.ShortcutContext.WindowShortcut)
        self._esc.setEnabled(False)
        view.installEventFilter(self)
        view.sig_scene_ready.connect(self._on_scene)

    # -- starting and leaving -------------------------------------------------------------------
    def start(self, frame: int = 1) -> None:
        """Show the bar and frame ``frame`` of the call shown."""
        self.active = True
        self._esc.setEnabled(True)
        self._call = self.view.call()
        self.replay = forward_replay(self._call)
        self.bar.set_replay(self.replay, frame)
        self.bar.show()
        self._place_bar()
        self._show(self.bar.frame())
        self.bar.slider.setFocus()
        self.sig_active.emit(True)

    def stop(self) -> None:
        """Leave the replay: everything drawn again, the bar, ring and memory line gone."""
        if not self.active:
            return
        self.active = False
        self._esc.setEnabled(False)
        self.bar.pause()
        self.bar.hide()
        self.view.setViewportMargins(0, 0, 0, 0)
        self.painter.paint(None)
        if self.memory_line is not None:
            self.memory_line.hide()
        if self.source is not None:
            self.source.clear_highlight()
        self.sig_active.emit(False)

    def set_active(self, on: bool) -> None:
        """Start (from the first op) or leave the replay: View > Replay Forward."""
        if on and not self.active:
            self.start()
        elif not on:
            self.stop()

    # -- frames ---------------------------------------------------------------------------------
    def frame(self) -> int:
        return self.bar.frame()

    def set_frame(self, k: int) -> None:
        self.bar.set_frame(k)

    def shown_nodes(self) -> frozenset[str]:
        return self.replay.nodes_at(self.frame())

    def _show(self, k: int) -> None:
        if not self.active:
            return
        if not 1 <= k <= len(self.replay):
            self.painter.paint(None)
            return
        step = self.replay.step(k)
        self.painter.paint(self.replay.nodes_at(k), step.op)
        ring = self.painter.ring_rect()
        if ring is not None:
            self._keep_in_view(ring)
        if self.source is not None:
            if step.line:
                self.source.highlight_lines([step.line])
            else:
                self.source.clear_highlight()
        self._move_memory_line(step.created)
        self.sig_frame.emit(k)

    def _keep_in_view(self, rect: QRectF) -> None:
        seen = self.view.mapToScene(self.view.viewport().rect()).boundingRect()
        if not seen.contains(rect):
            self.view.centerOn(rect.center())

    def _move_memory_line(self, t: float | None) -> None:
        if self.chart is None:
            return
        if self.memory_line is None or not shiboken6.isValid(self.memory_line):
            self.memory_line = pg.InfiniteLine(angle=90, movable=False, label="op", labelOpts={"position": 0.95})
            self.memory_line.setZValue(35)
            self.chart.view.addItem(self.memory_line, ignoreBounds=True)
        if t is None:
            self.memory_line.hide()
            return
        current = color(self.chart.theme().current)
        self.memory_line.setPen(pg.mkPen(current, width=1.5))
        self.memory_line.show()  # before the text: a hidden label keeps its old one
        self.memory_line.setPos(t)
        self.memory_line.label.setColor(current)
        self.memory_line.label.setFormat(f"op {self.frame()}")
        lo, hi = self.chart.view.viewRange()[0]
        margin = (hi - lo) * MEMORY_MARGIN
        if not lo + margin <= t <= hi - margin:  # the same width, the time clear of the edges
            shift = t - margin - lo if t < lo + margin else t + margin - hi
            self.chart.view.setXRange(lo + shift, hi + shift, padding=0)

    def memory_time(self) -> float | None:
        """Where the memory chart's replay line is (None: not shown)."""
        line = self.memory_line
        return float(line.value()) if line is not None and line.isVisible() else None

    # -- the view -------------------------------------------------------------------------------
    def _on_scene(self, _call_id: str = "") -> None:
        if not self.active:
            return
        call = self.view.call()
        if call is not self._call:  # another call: replay it from its first op
            self._call = call
            self.replay = forward_replay(call)
            self.bar.set_replay(self.replay, 1)
        self._show(self.bar.frame())

    def _place_bar(self) -> None:
        if not self.bar.isVisible():
            return
        h = self.bar.sizeHint().height()
        self.view.setViewportMargins(0, 0, 0, h)
        r = self.view.contentsRect()
        self.bar.setGeometry(r.left(), r.bottom() + 1 - h, r.width(), h)
        self.bar.raise_()

    def eventFilter(self, obj, event) -> bool:
        if obj is self.view and event.type() == QEvent.Type.Resize:
            self._place_bar()
        return False
