"""The memory chart's time tools: zoom to one call's iteration, overlay every iteration from its
own start, and draw a reference run (a leak beside its fix) in the same views, on one scale.

A mixin of ``MemoryChart`` (kept apart so each module stays small); it uses the chart's series,
views, lines, legend, theme and units.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from widgets.memory.items import LINES, PHASES, Series

STARTING = PHASES.index("starting")
OPENING_MARGIN = 0.02  # the opening view begins this share of its span before the first call's run


class TimeToolsMixin:
    """Time tools of ``MemoryChart``."""

    def iterations(self) -> list[tuple[float, float]]:
        """(start, end) of each iteration: a forward pass up to the next one."""
        return self._series.iterations()

    def opening_range(self) -> tuple[float, float] | None:
        """(start, end) the chart opens on: from the end of the "starting" band (the worker starting
        and importing) to the run's end, or None when the run has no such band before something else."""
        s = self._series
        if not s.n or len(s.run_codes) < 2 or s.run_codes[0] != STARTING:
            return None
        start, end = s.run_t1[0], float(s.t[s.n - 1])
        if end <= start:
            return None
        return max(float(s.t[0]), start - OPENING_MARGIN * (end - start)), end

    def show_opening(self) -> tuple[float, float]:
        """Show the run from its first call (``opening_range``), or the whole run; returns the x range."""
        span = self.opening_range()
        if span is None:
            self.show_whole_run()
        else:
            self.view.setXRange(*span, padding=0)
            for view in (self.view, self.view2):
                view.enableAutoRange(y=True)
        self._anchor_peak()
        return tuple(self.view.viewRange()[0])

    def show_whole_run(self) -> None:
        """Show the whole run, starting band included, and follow new samples."""
        for view in (self.view, self.view2):
            view.enableAutoRange()
        self._anchor_peak()

    def fit_call(self, index: int) -> tuple[float, float] | None:
        """Zoom the time axis to the iteration of backward call ``index`` (its forward, backward and after)."""
        t = next((t for t, i in self._calls() if i == index), None)
        if t is None:
            return None
        spans = self.iterations()
        span = next(((a, b) for a, b in spans if a <= t <= b), None)
        if span is None:
            later = [c for c, _ in self._calls() if c > t]
            span = (t, later[0] if later else float(self._series.t[self._series.n - 1]))
        self.view.setXRange(*span, padding=0.02)
        for view in (self.view, self.view2):
            view.enableAutoRange(y=True)
        self._anchor_peak()
        return span

    def set_overlay(self, on: bool) -> None:
        """Draw each iteration's ``measure_key`` from its own start, all on one time axis (or go back)."""
        self._overlay = bool(on)
        for item in (*self._lines.values(), *self._ref_lines.values(), self.bands, self.markers, self.events):
            item.setVisible(not self._overlay)
        if self.gap is not None:
            self.gap.setVisible(not self._overlay)
        self.overlay_item.setVisible(self._overlay)
        self.plot.showAxis("right", not self._overlay)
        self.plot.setLabel("bottom", "time since the iteration began" if self._overlay else "time", units="s")
        self._label_axes()
        self.flush()
        self.view.enableAutoRange()

    def overlay_count(self) -> int:
        """How many iterations the overlay draws."""
        return len(self.iterations()) if self._overlay else 0

    def _draw_overlay(self) -> None:
        s, key = self._series, self.measure_key()
        unit = self._unit_of(key)[1]
        xs, ys = [], []
        for a, b in self.iterations():
            lo, hi = np.searchsorted(s.t[:s.n], (a, b), "left")
            hi = min(int(hi) + 1, s.n)
            xs += [s.t[lo:hi] - a, [np.nan]]
            ys += [s.cols[key][lo:hi] / unit, [np.nan]]
        if xs:
            self.overlay_item.setData(np.concatenate(xs), np.concatenate(ys))
        else:
            self.overlay_item.setData([], [])

    def set_reference(self, samples, label: str = "reference") -> None:
        """Draw another run (e.g. the leak beside its fix) in the same views: one y scale for both."""
        self.clear_reference()
        self._ref, self._ref_label = Series(), label
        self._ref.append(list(samples))
        self._add_ref_lines()
        self.flush()
        for view in (self.view, self.view2):
            view.enableAutoRange()

    def _add_ref_lines(self) -> None:
        if self._ref is None:
            return
        color = self._theme.muted_text if self._theme.name == "print" else self._theme.group_border
        for key, name, axis, role in LINES[self._mode]:
            pen = pg.mkPen(color, width=1.5, style=Qt.DashDotLine if role == "dashed" else Qt.SolidLine)
            item = pg.PlotDataItem(pen=pen, clipToView=True, autoDownsample=True, downsampleMethod="peak")
            (self.view2 if axis == "right" else self.view).addItem(item)
            self._ref_lines[key] = item
            self.legend.addItem(item, f"{self._ref_label}: {'RSS' if key == 'rss' else name.split()[0]}")

    def _drop_ref_lines(self) -> None:
        for item in self._ref_lines.values():
            item.getViewBox().removeItem(item)
            self.legend.removeItem(item)
        self._ref_lines = {}

    def clear_reference(self) -> None:
        """Stop drawing the reference run."""
        self._drop_ref_lines()
        self._ref, self._ref_label = None, ""
        self._choose_units()

    def reference_label(self) -> str:
        return self._ref_label
