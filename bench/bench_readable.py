"""Benchmark the readable opening and folding on big graphs.

Run: ``.venv/bin/python bench/bench_readable.py`` (offscreen, about a minute).
Graphs are synthetic residual MLPs with the module tree of resources/examples/50_ and
51_*.py (``blocks.N`` and ``blocks.N.fc``, 6 nodes per block): 4,802 and 50,000 nodes.

- first frame: ``set_call`` to the first painted frame, with the opening fold (the
  "blocks × N" stack at a readable zoom) beside the fold the view used to open with (one box
  per block at 4,802 nodes, the whole "blocks" group at 50,000), and the smallest text on
  screen in each (at the zoom the view picks now; before, the 802 boxes opened at 100 % on
  the loss or, fitted, at about 1 %);
- expand / collapse: opening the stack, one block in it, and folding them again.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PySide6.QtWidgets import QApplication  # noqa: E402

from core.layout_groups import _info_cache  # noqa: E402
from tests.fixtures_graphs import residual_mlp_call  # noqa: E402
from widgets.graph_view import GraphView  # noqa: E402


def first_frame(app, call, collapsed) -> tuple[float, float, int, int]:
    """(seconds to the first painted frame, smallest text px, zoom %, boxes)."""
    _info_cache.clear()
    view = GraphView()
    view.resize(1200, 800)
    view.show()
    app.processEvents()
    start = time.perf_counter()
    view.set_call(call, sync=True, collapsed=collapsed)
    view.viewport().repaint()
    took = time.perf_counter() - start
    out = (took, view.smallest_text_px(), view.zoom_percent(), len(view.node_items))
    view.close()
    view.deleteLater()
    app.processEvents()
    return out


def view_chunks(call) -> list[str]:
    from core.layout import group_info

    return group_info(call).children["blocks"]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    app = QApplication.instance() or QApplication([])
    for blocks in (800, 8333):
        call = residual_mlp_call(blocks, "blocks")
        n = len(call.nodes)
        previous = frozenset(f"blocks.{i}" for i in range(blocks)) if blocks < 2000 else frozenset({"blocks"})
        before = [first_frame(app, call, previous) for _ in range(3)]
        after = [first_frame(app, call, None) for _ in range(3)]
        tb, pb, zb, bb = min(before)
        ta, pa, za, ba = min(after)
        print(f"{n:,} nodes, earlier opening: {tb:.3f} s to the first frame, {bb:,} boxes at {zb} %, "
              f"smallest text {pb:.1f} px")
        print(f"{n:,} nodes, readable opening: {ta:.3f} s to the first frame, {ba:,} boxes at {za} %, "
              f"smallest text {pa:.1f} px; {tb / ta:.1f} times faster")
    call = residual_mlp_call(8333, "blocks")
    view = GraphView()
    view.resize(1200, 800)
    view.show()
    view.set_call(call, sync=True)
    chunk = next(c for c in view_chunks(call) if int(c.split(".")[-1].split("\u2013")[0]) <= 4000
                 <= int(c.split("\u2013")[-1]))
    rounds = {"open the stack (131 runs of 63 or 64 blocks)": [], "open one run (64 folded blocks)": [],
              "open one block": [], "fold the block": [], "fold the run": [], "fold the stack": []}
    steps = ["blocks", chunk, "blocks.4000", "blocks.4000", chunk, "blocks"]
    for _ in range(3):
        for values, path in zip(rounds.values(), steps):
            values.append(timed(lambda: (view.toggle_group(path, sync=True), view.viewport().repaint())))
    for name, values in rounds.items():
        v = statistics.median(values)
        verdict = "OK" if v < 0.1 else "OVER"
        print(f"50,000 nodes, {name}: {v * 1000:.0f} ms (target < 100 ms) {verdict}")


if __name__ == "__main__":
    main()
