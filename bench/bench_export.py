"""Benchmark exports of the ~5,000-node example beside torchviz on the same graph.

Run: ``.venv/bin/python bench/bench_export.py`` (offscreen; a few minutes when torchviz and
Graphviz are there, since ``dot`` lays out 4,800 nodes slowly). The script
``resources/examples/50_big_residual_mlp.py`` is captured in-process with
``core.worker.capture.recorder.capture_script`` and exported fully expanded (every node drawn, as torchviz
draws them) and as the app opens it (module groups collapsed). torchviz is optional: when it
is not importable, ``/tmp/tvpkgs`` (``pip install --target /tmp/tvpkgs torchviz graphviz``)
is tried, and the comparison is reported as skipped otherwise.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.worker.capture.recorder import capture_script  # noqa: E402
from core.layout.export_dot import call_to_dot  # noqa: E402
from widgets.export import graph_export as export

SCRIPT = ROOT / "resources" / "examples" / "50_big_residual_mlp.py"
SVG_TARGET_S = 2.0
TORCHVIZ_DIR = Path("/tmp/tvpkgs")


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def size(path: Path) -> str:
    n = path.stat().st_size
    return f"{n / 1e6:.1f} MB" if n > 1e6 else f"{n / 1e3:.0f} kB"


def bench_ours(call, trace, out: Path, expanded: bool, repeat: int) -> dict[str, float]:
    label = "expanded" if expanded else "collapsed"
    collapsed = frozenset() if expanded else None
    results = {}
    start = time.perf_counter()
    with export.offscreen_view(call, collapsed=collapsed) as view:
        build = time.perf_counter() - start
        layout = view.graph_layout()
        print(f"[{label}] view (layout + scene): {build:.3f} s  ({len(layout.nodes):,} boxes, "
              f"{len(layout.edges):,} edges, {layout.width:.0f} x {layout.height:.0f} px)")
        for fmt, fn in (("png", export.render_png), ("svg", export.render_svg), ("pdf", export.render_pdf)):
            path = out / f"{label}.{fmt}"
            t, _ = timed(lambda: fn(view, path, title="50_big_residual_mlp"), repeat if fmt == "svg" else 1)
            results[fmt] = t
            verdict = "ok" if t < SVG_TARGET_S else "MISSED"
            target = f"  (target < {SVG_TARGET_S:g} s: {verdict})" if fmt == "svg" else ""
            print(f"[{label}] {fmt.upper()}: {t:.3f} s, {size(path)}{target}")
        folded = view.collapsed()
    dot_path, json_path = out / f"{label}.dot", out / f"{label}.json"
    results["dot"], _ = timed(lambda: dot_path.write_text(call_to_dot(call, collapsed=folded)))
    print(f"[{label}] DOT: {results['dot']:.3f} s, {size(dot_path)}")
    results["json"], _ = timed(lambda: trace.save(json_path))
    print(f"[{label}] JSON: {results['json']:.3f} s, {size(json_path)}")
    e2e = out / f"{label}-e2e.svg"
    results["svg_end_to_end"], _ = timed(lambda: export.export_call(call, e2e, collapsed=collapsed))
    print(f"[{label}] SVG end to end (export_call: layout, scene, render, write): {results['svg_end_to_end']:.3f} s")
    return results


def import_torchviz():
    try:
        import torchviz
    except ImportError:
        if not TORCHVIZ_DIR.is_dir():
            return None
        sys.path.append(str(TORCHVIZ_DIR))
        try:
            import torchviz
        except ImportError:
            return None
    return torchviz


def bench_torchviz(out: Path, timeout: float) -> dict[str, float] | None:
    torchviz = import_torchviz()
    if torchviz is None:
        print("torchviz: skipped (not importable; pip install --target /tmp/tvpkgs torchviz graphviz)")
        return None
    if shutil.which("dot") is None:
        print("torchviz: skipped (Graphviz dot is not installed)")
        return None
    ns = runpy.run_path(str(SCRIPT), run_name="__bench__")
    loss, model = ns["loss"], ns["model"]
    t_make, graph = timed(lambda: torchviz.make_dot(loss, params=dict(model.named_parameters())))
    source = graph.source
    (out / "torchviz.dot").write_text(source)
    nodes = sum(1 for line in source.splitlines() if "[label=" in line)
    print(f"torchviz make_dot: {t_make:.3f} s ({nodes:,} nodes)")
    start = time.perf_counter()
    try:
        done = subprocess.run(["dot", "-Tsvg", "-o", str(out / "torchviz.svg")], input=source, text=True,
                              capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"torchviz dot -Tsvg: did not finish in {timeout:g} s")
        return {"make_dot": t_make, "dot": float("inf")}
    t_dot = time.perf_counter() - start
    status = "" if done.returncode == 0 else f" (failed: {done.stderr.strip()[:200]})"
    print(f"torchviz dot -Tsvg: {t_dot:.3f} s{status}" + (f", {size(out / 'torchviz.svg')}" if not status else ""))
    return {"make_dot": t_make, "dot": t_dot}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="SVG runs (the median is reported)")
    parser.add_argument("--dot-timeout", type=float, default=600.0, help="limit for torchviz's dot -Tsvg (s)")
    parser.add_argument("--keep", metavar="DIR", help="write the exports here instead of a temporary folder")
    args = parser.parse_args()
    export.ensure_app()
    t, trace = timed(lambda: capture_script(str(SCRIPT)))
    call = max(trace.calls, key=lambda c: len(c.nodes))
    print(f"capture: {t:.2f} s, call #{call.index}: {len(call.nodes):,} nodes")
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        out = Path(args.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        ours = bench_ours(call, trace, out, expanded=True, repeat=args.repeat)
        bench_ours(call, trace, out, expanded=False, repeat=args.repeat)
        theirs = bench_torchviz(out, args.dot_timeout)
    if theirs is None:
        print("ratio vs torchviz: skipped")
        return 0
    total = theirs["make_dot"] + theirs["dot"]
    print(f"ratio, torchviz (make_dot + dot -Tsvg, {total:.2f} s) / ours (SVG end to end, "
          f"{ours['svg_end_to_end']:.2f} s): {total / ours['svg_end_to_end']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
