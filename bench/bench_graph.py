"""Benchmark the graph view: layout, scene build, first frame, repaint and memory.

Run: ``.venv/bin/python bench/bench_graph.py`` (offscreen; about a minute without torchviz).
Graphs are synthetic residual MLPs shaped like resources/examples/50_big_residual_mlp.py:
6 nodes per block, modules ``layers.N`` and ``layers.N.fc``. When torchviz is importable and
Graphviz ``dot`` is installed, torchviz's make_dot + render of the same-size torch graph is
timed for comparison.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PySide6.QtWidgets import QApplication  # noqa: E402

from core.layout.compound import layout_call  # noqa: E402
from core.layout.groups import default_collapsed  # noqa: E402
from tests.fixtures_graphs import residual_mlp_call  # noqa: E402
from widgets.graph.view import GraphView  # noqa: E402


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def line(name: str, value: float, unit: str = "s", target: float | None = None) -> None:
    if target is None:
        print(f"{name}: {value:.3f} {unit}")
    else:
        verdict = "OK" if value < target else "OVER"
        print(f"{name}: {value:.3f} {unit} (target < {target} {unit}, {value / target:.2f} of target) {verdict}")


def repaint_times(app, view: GraphView, repeats: int) -> list[float]:
    """Scroll by a whole viewport (where the scene allows) and time one full repaint each time."""
    bar = view.verticalScrollBar()
    step = view.viewport().height()
    times = []
    for i in range(repeats):
        if bar.maximum() > 0:
            value = bar.value() + step if (i // 8) % 2 == 0 else bar.value() - step
            bar.setValue(max(0, min(bar.maximum(), value)))
        app.processEvents()
        view.viewport().update()
        start = time.perf_counter()
        view.viewport().repaint()
        times.append(time.perf_counter() - start)
    return times


def bench_case(app, name: str, blocks: int, collapsed, targets: dict, repeats: int, runs: int) -> None:
    call = residual_mlp_call(blocks)
    edges = sum(1 for n in call.nodes for e in n.next if e is not None)
    print(f"\n== {name}: {len(call.nodes):,} nodes, {edges:,} edges; layout and first frame: median of {runs} runs")
    layout_s, first_s = [], []
    for _ in range(runs):
        fresh = residual_mlp_call(blocks)  # a new CallInfo: nothing cached
        start = time.perf_counter()
        chosen = default_collapsed(fresh) if collapsed is None else collapsed
        lay = layout_call(fresh, collapsed=chosen)
        layout_s.append(time.perf_counter() - start)
    line(
        f"{name} layout ({len(lay.nodes):,} boxes, {len(chosen):,} groups collapsed)",
        statistics.median(layout_s),
        target=targets.get("layout"),
    )
    for _ in range(runs):
        fresh = residual_mlp_call(blocks)
        view = GraphView()
        view.resize(1280, 800)
        view.show()
        app.processEvents()
        start = time.perf_counter()
        view.set_call(fresh, sync=True, collapsed=collapsed)
        view.viewport().repaint()
        first_s.append(time.perf_counter() - start)
        view.close()
        view.deleteLater()
        app.processEvents()
    line(
        f"{name} first painted frame (layout + scene + paint, from the CallInfo)",
        statistics.median(first_s),
        target=targets.get("first"),
    )

    view = GraphView()
    view.resize(1280, 800)
    view.show()
    app.processEvents()
    view.set_call(call, sync=True, collapsed=collapsed)
    result = (view.collapsed(), view.graph_layout())
    view._generation += 1  # hand the same layout to the view again: scene build alone
    start = time.perf_counter()
    view._on_done(view._generation, result)
    built = time.perf_counter() - start
    line(f"{name} scene build ({len(view.node_items):,} node items, {len(view.edge_items):,} edge items)", built)
    view.fit()
    app.processEvents()
    times = repaint_times(app, view, repeats)
    line(
        f"{name} full repaint at fit zoom ({view.transform().m11() * 100:.2g} %), median of {repeats}",
        statistics.median(times) * 1000,
        "ms",
        targets.get("repaint"),
    )
    view.set_zoom(100)
    view.verticalScrollBar().setValue(0)
    app.processEvents()
    times = repaint_times(app, view, repeats)
    line(
        f"{name} full-window pan repaint at 100 % zoom, median of {repeats}",
        statistics.median(times) * 1000,
        "ms",
        targets.get("repaint"),
    )
    view.close()
    view.deleteLater()
    app.processEvents()


def bench_torchviz(blocks: int) -> None:
    try:
        import torchviz  # noqa: F401
    except ImportError:
        print("\ntorchviz is not importable: comparison skipped")
        return
    if shutil.which("dot") is None:
        print("\nGraphviz dot is not installed: torchviz comparison skipped")
        return
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)

        def forward(self, h):
            return h + torch.relu(self.fc(h))

    model = nn.Sequential(*[Block() for _ in range(blocks)])
    loss = model(torch.randn(8, 64)).pow(2).mean()
    start = time.perf_counter()
    dot = torchviz.make_dot(loss, params=dict(model.named_parameters()))
    made = time.perf_counter()
    dot.pipe(format="svg")
    done = time.perf_counter()
    print(f"\n== torchviz on the same-size torch graph ({6 * blocks + 2:,} nodes)")
    line("torchviz make_dot", made - start)
    line("torchviz render (dot -Tsvg)", done - made)
    line("torchviz total", done - start)


CASES = {
    "5k": ("5k expanded", 833, frozenset(), {"layout": 0.5, "first": 1.5, "repaint": 30}),
    "5k-default": ("5k default (groups collapsed)", 833, None, {"layout": 0.5, "first": 1.5, "repaint": 30}),
    "50k": ("50k default (collapsed by module)", 8333, None, {"layout": 0.5, "first": 3.0, "repaint": 30}),
    "50k-open": (
        "50k one level open (8,333 collapsed blocks)",
        8333,
        frozenset(f"layers.{i}" for i in range(8333)),
        {"first": 3.0, "repaint": 30},
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25, help="repaints per zoom level")
    parser.add_argument("--runs", type=int, default=3, help="runs of layout and first frame")
    parser.add_argument("--case", choices=sorted(CASES), help="run one case in this process")
    parser.add_argument("--torchviz-blocks", type=int, default=833, help="0 skips the torchviz comparison")
    args = parser.parse_args()
    if args.case:  # one graph per process, so each peak memory is that graph's
        app = QApplication.instance() or QApplication([])
        name, blocks, collapsed, targets = CASES[args.case]
        bench_case(app, name, blocks, collapsed, targets, args.repeats, args.runs)
        print(f"{name} GUI process peak memory (max RSS, torch not imported): {peak_mb():.0f} MiB")
        return
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, QT_QPA_PLATFORM={os.environ['QT_QPA_PLATFORM']}",
        flush=True,
    )
    for case in CASES:
        cmd = [sys.executable, __file__, "--case", case, "--repeats", str(args.repeats), "--runs", str(args.runs)]
        subprocess.run(cmd, check=True)
        sys.stdout.flush()
    if args.torchviz_blocks:
        bench_torchviz(args.torchviz_blocks)


if __name__ == "__main__":
    main()
