"""Benchmark the readable opening and folding on big graphs.

Run: ``.venv/bin/python bench/bench_readable.py`` (offscreen, about a minute).
Graphs are synthetic residual MLPs with the module tree of resources/examples/50_ and
51_*.py (``blocks.N`` and ``blocks.N.fc``, 6 nodes per block): 4,802 and 50,000 nodes.

- first frame: ``set_call`` to the first painted frame, with the opening fold (the
  "blocks × N" stack at a readable zoom) beside the fold the view used to open with (one box
  per block at 4,802 nodes, the whole "blocks" group at 50,000), and the smallest text on
  screen in each (at the zoom the view picks now; before, the 802 boxes opened at 100 % on
  the loss or, fitted, at about 1 %);
- expand / collapse: opening the stack, one run of blocks in it, one block, and folding them
  again, the first time on a fresh call and then again; cold (the fold computes everything it
  needs) and after the head start the layout thread takes once a layout is shown; then the
  stack as the app folds it, on the layout thread, with a pause between folds.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PySide6.QtWidgets import QApplication  # noqa: E402

from core.layout.groups import _info_cache  # noqa: E402
from tests.fixtures_graphs import residual_mlp_call  # noqa: E402
from widgets.graph.view import GraphView  # noqa: E402


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
    from core.layout.groups import group_info

    return group_info(call).children["blocks"]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cpu_timed(fn) -> tuple[float, float]:
    """(CPU seconds, wall seconds): on a machine others load, CPU time is the steadier figure."""
    start, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - start, time.perf_counter() - wall


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
    folds(app)
    app_folds(app)


STEPS = {"open the stack (131 runs of 63 or 64 blocks)": "blocks", "open one run (64 folded blocks)": "run",
         "open one block": "blocks.4000", "fold the block": "blocks.4000", "fold the run": "run",
         "fold the stack": "blocks"}


def fold_rounds(app, head_start: bool, out: dict[str, list[tuple[float, float]]], size=(800, 500)) -> None:
    """Each step's latency (toggle to painted frame) on a fresh 50,000-node call, twice: the first
    time the call folds, then again. The view is small enough that the call opens at its top
    level ("blocks" folded), so the first fold is the first to reach inside the stack.
    ``head_start``: what the layout thread prepares once a layout is shown (``prepare_folds``)
    runs, untimed, before each fold, as it does while the user looks at the graph."""
    from core.layout import visible as layout

    prepare = getattr(layout, "prepare_folds", None) if head_start else None
    _info_cache.clear()
    gc.unfreeze()
    call = residual_mlp_call(8333, "blocks")
    view = GraphView()
    view.resize(*size)
    view.show()
    app.processEvents()
    view.set_call(call, sync=True)
    # A full collection of a heap holding several 50,000-node calls takes seconds wherever it
    # lands; building a fresh call per round makes one likely inside a timed fold. Not the fold's
    # cost: the heap so far is collected and set aside, untimed.
    gc.collect()
    gc.freeze()
    chunk = next(c for c in view_chunks(call) if int(c.split(".")[-1].split("\u2013")[0]) <= 4000
                 <= int(c.split("\u2013")[-1]))
    for when in ("first", "again"):
        for name, path in STEPS.items():
            if prepare is not None:
                prepare(call, view.collapsed())
            path = chunk if path == "run" else path
            out.setdefault(f"{when}: {name}", []).append(
                cpu_timed(lambda: (view.toggle_group(path, sync=True), view.viewport().repaint())))
    view.close()
    view.deleteLater()
    app.processEvents()


def folds(app, calls: int = 3) -> None:
    cold: dict[str, list[tuple[float, float]]] = {}
    warm: dict[str, list[tuple[float, float]]] = {}
    for _ in range(calls):  # alternated, so that a change in the machine's load hits both alike
        fold_rounds(app, False, cold)
        fold_rounds(app, True, warm)
    gc.unfreeze()
    ms = lambda values, k: statistics.median(v[k] for v in values) * 1000  # noqa: E731
    for key in cold:
        verdict = "OK" if ms(warm[key], 0) < 100 else "OVER"
        print(f"50,000 nodes, {key}: cold {ms(cold[key], 0):.0f} ms CPU ({ms(cold[key], 1):.0f} ms wall), "
              f"after the layout thread's head start {ms(warm[key], 0):.0f} ms CPU ({ms(warm[key], 1):.0f} ms "
              f"wall; worst {max(v[1] for v in warm[key]) * 1000:.0f} ms); target < 100 ms {verdict}")


def app_folds(app, calls: int = 3, pause: float = 0.4) -> None:
    """Opening and folding the stack as the app does it: layouts on the layout thread, the scene
    built when they arrive, ``pause`` seconds between folds (the layout thread prepares the next
    fold meanwhile); wall time from the click to the painted frame."""
    out: dict[str, list[float]] = {}

    def idle() -> None:
        end = time.perf_counter() + pause
        while time.perf_counter() < end:
            app.processEvents()
            time.sleep(0.01)

    for _ in range(calls):
        _info_cache.clear()
        gc.unfreeze()
        call = residual_mlp_call(8333, "blocks")
        view = GraphView()
        view.resize(800, 500)
        view.show()
        app.processEvents()
        view.set_call(call)
        view.wait_ready(120000)
        idle()
        gc.collect()  # as in fold_rounds: no full collection inside a timed fold
        gc.freeze()
        for when in ("first", "again"):
            for name in ("open the stack", "fold the stack"):
                out.setdefault(f"{when}: {name}", []).append(
                    timed(lambda: (view.toggle_group("blocks"), view.wait_ready(), view.viewport().repaint())))
                idle()
        view.close()
        view.deleteLater()
        app.processEvents()
    gc.unfreeze()
    for key, values in out.items():
        print(f"50,000 nodes, in the app's way, {key}: {statistics.median(values) * 1000:.0f} ms wall "
              f"(worst {max(values) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
