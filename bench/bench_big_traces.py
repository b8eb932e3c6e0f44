"""Opening big and odd traces in the window, measured on the GUI side (the loader apart).

Run: QT_QPA_PLATFORM=offscreen python bench/bench_big_traces.py. For each trace (a 100k and
200k-node chain, one node with 100k inputs, module paths 3,000 deep, 1 MB names) prints the
time from ``show_trace`` until the graph is laid out, drawn and the window painted, the
nodes drawn and the process RSS; then the Problems panel with one-line errors of 100 KB to
50 MB. Each should stay within a few seconds.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("BACKPROP_STUDIO_SETTINGS", str(Path(tempfile.mkdtemp(prefix="bps-bench-")) / "s.ini"))

import psutil  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from core.model.trace import ErrorInfo, Trace  # noqa: E402
from tests.big_calls import big_names, chain, deep_modules, fan_in, trace_of  # noqa: E402

CASES = {
    "chain 100k": lambda: chain(100_000),
    "chain 200k": lambda: chain(200_000),
    "fan-in 100k": lambda: fan_in(100_000),
    "modules 3,000 deep": lambda: deep_modules(3_000),
    "1 MB names": lambda: big_names(10**6),
}


def open_in_window(app, window, trace: Trace) -> float:
    shown = []
    window.sig_trace_shown.connect(lambda: shown.append(1))
    start = time.perf_counter()
    window.show_trace(trace)
    while not shown or window.graph.is_pending():
        app.processEvents()
        time.sleep(0.005)
    window.grab()
    took = time.perf_counter() - start
    window.sig_trace_shown.disconnect()
    return took


def main() -> None:
    app = QApplication.instance() or QApplication([])
    from app.window.window import MainWindow
    from widgets.panels.problems import ProblemsPanel

    window = MainWindow(timeout=60)
    window.resize(1400, 860)
    window.show()
    app.processEvents()
    for name, make in CASES.items():
        took = open_in_window(app, window, trace_of(make()))
        rss = psutil.Process().memory_info().rss / 2**20
        print(f"{name:20s} {took:6.2f} s  {len(window.graph.node_items):5d} boxes  RSS {rss:,.0f} MB", flush=True)
    window.handle.close()
    panel = ProblemsPanel()
    panel.resize(1000, 400)
    panel.show()
    for size in (10**5, 10**6, 5 * 10**7):
        message = "x" * size
        start = time.perf_counter()
        panel.set_trace(Trace(calls=[], error=ErrorInfo("RuntimeError", message, 1, f"RuntimeError: {message}\n")))
        app.processEvents()
        panel.grab()
        print(f"Problems, {size:,}-character error: {time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main()
