"""The app on real captured graphs: worker result to first frame, and step latency.

Run: python bench/bench_app.py   (offscreen; about two minutes)
     python bench/bench_app.py --debug [--big-only] [--steps N] [--repeat N] [--profile FILE]

1. Captures resources/examples/50_big_residual_mlp.py (4,802 nodes) and
   51_huge_residual_mlp.py (50,000 nodes) through the worker, then in a GUI process that never
   imports torch, times from the worker's message (decoded JSON) to the first painted frame,
   and a full-window repaint at fit and at 100 % zoom.
2. Debug (F9) in the main window: time from Debug to the first pause (graph on screen) on the
   MLP example and the 4,802-node example, against the script's bare run time up to that call
   (``python script.py`` in a fresh interpreter, torch import included).
3. In that debug run of the 4,802-node example: time from pressing Step to the repainted frame
   that shows the new state (worker round trip included), median over many steps, and
   Continue-to-end time against a plain backward of the same graph.
"""

from __future__ import annotations

import atexit
import json
import os
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

MLP = ROOT / "resources" / "examples" / "13_mlp_classifier.py"
BIG = ROOT / "resources" / "examples" / "50_big_residual_mlp.py"
HUGE = ROOT / "resources" / "examples" / "51_huge_residual_mlp.py"


def capture_json(script: Path, out: Path) -> None:
    from core.client.handle import run_capture

    result = run_capture(str(script), timeout=600)
    out.write_text(json.dumps(result.trace.to_dict()), encoding="utf-8")


def first_frame(json_path: Path, repeats: int = 15) -> None:
    """In this (torch-free) process: decoded worker message -> Trace -> first painted frame."""
    from PySide6.QtWidgets import QApplication

    from core.model.trace_json import trace_from_dict
    from widgets.graph.view import GraphView

    app = QApplication.instance() or QApplication([])
    data = json.loads(json_path.read_text(encoding="utf-8"))
    view = GraphView()
    view.resize(1280, 800)
    view.show()
    app.processEvents()
    start = time.perf_counter()
    trace = trace_from_dict(data)
    call = trace.calls[0]
    decoded = time.perf_counter()
    view.set_call(call, sync=True)
    view.viewport().repaint()
    painted = time.perf_counter()
    times = []
    for _ in range(repeats):
        start_r = time.perf_counter()
        view.viewport().repaint()
        times.append(time.perf_counter() - start_r)
    view.fit()
    app.processEvents()
    fit_times = []
    for _ in range(repeats):
        start_r = time.perf_counter()
        view.viewport().repaint()
        fit_times.append(time.perf_counter() - start_r)
    groups = len(view.collapsed())
    target = 1.5 if call.node_count < 20_000 else 3.0
    total = painted - start
    print(f"{json_path.stem}: {call.node_count:,} nodes, {groups} groups collapsed on open")
    print(f"  trace from message {decoded - start:.3f} s + layout, scene, paint {painted - decoded:.3f} s "
          f"= first painted frame {total:.3f} s (target < {target} s) {'OK' if total < target else 'OVER'}")
    print(f"  repaint at opening zoom {statistics.median(times) * 1000:.1f} ms, at fit "
          f"{statistics.median(fit_times) * 1000:.1f} ms (median of {repeats}; target < 30 ms)")
    print(f"  torch imported in the GUI process: {'torch' in sys.modules}")


def bare_time_to_first_call(script: Path, repeats: int = 3) -> float:
    """Seconds from a fresh interpreter's start to the script's first ``.backward()`` (best of N)."""
    code = (
        "import time; t0 = time.perf_counter()\n"
        "import os, runpy, sys, torch\n"
        "def stop(*a, **k):\n"
        "    sys.stderr.write(f'BARE_T={time.perf_counter() - t0}\\n'); sys.stderr.flush(); os._exit(0)\n"
        "torch.Tensor.backward = stop\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    best = 1e9
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, check=True).stderr
        best = min(best, float(out.split("BARE_T=")[1].split()[0]))
    return best


def step_latency(steps: int = 60, *, scripts=(MLP, BIG), repeat: int = 1, profile: str | None = None) -> None:
    """Debug runs in the real window: first pause, then Step latency and Continue on the last script.

    ``repeat`` debug runs of the 4,802-node example (Restart between them) give medians;
    ``profile`` writes a cProfile of the GUI process over the timed steps to that file and prints
    its top lines."""
    from PySide6.QtWidgets import QApplication

    from app.session.session import SessionState
    from app.window.window import MainWindow

    app = QApplication.instance() or QApplication([])
    settings = Path(tempfile.mkdtemp(prefix="bench-app-"))
    atexit.register(shutil.rmtree, settings, ignore_errors=True)  # the folder goes when the bench ends, however
    os.environ["BACKPROP_STUDIO_SETTINGS"] = str(settings / "settings.ini")
    window = MainWindow(timeout=600)
    window.resize(1400, 860)
    window.show()
    session = window.session

    def wait(signal, timeout=600.0):
        box = {}
        signal.connect(lambda *a: box.setdefault("hit", True))
        deadline = time.perf_counter() + timeout
        while "hit" not in box and time.perf_counter() < deadline:
            app.processEvents()
            time.sleep(0.0005)
        return "hit" in box

    def ready_worker():
        while window.handle.client._spare is None or not window.handle.client._spare.ready.is_set():
            app.processEvents()
            time.sleep(0.01)

    def first_pause(script: Path, bare: float | None) -> None:
        ready_worker()
        window.open_script(str(script), run=False)
        start = time.perf_counter()
        window.act_debug.trigger()
        wait(session.sig_paused)
        window.graph.wait_ready()
        window.graph.viewport().repaint()
        first = time.perf_counter() - start
        ratio = f"; bare run up to that call {bare:.2f} s: {first / bare:.2f}x" if bare else ""
        print(f"Debug -> first pause, graph drawn: {script.stem} ({window.call.node_count:,} nodes) {first:.2f} s"
              f"{ratio}")

    for script in scripts:
        first_pause(script, bare_time_to_first_call(script))
        if script is not scripts[-1]:
            window.act_stop.trigger()
    latencies, continues, gui = [], [], []
    hops: dict[str, list[float]] = {}
    from core.client.process import WorkerProcess

    # Hop timings of each Step: the command carries its send time, the worker echoes its own stamps
    # with the pause, the client's reader thread stamps the decoded message (one clock: monotonic).
    deliver = WorkerProcess._deliver

    def fields_of(msg) -> dict:
        """A message's keys beyond its protocol fields (where the timing stamps travel)."""
        return msg.extra if hasattr(msg, "extra") else msg

    def stamped(self, msg):
        t_in = time.monotonic()
        if isinstance(msg, dict):
            from core.client.process import typed

            msg = typed(msg)
        fields_of(msg)["t_in"] = t_in
        deliver(self, msg)

    WorkerProcess._deliver = stamped
    control = window.handle.control
    pauses: list[dict] = []

    def timed_control(cmd, **args):
        if cmd in ("step", "continue"):
            args["extra"] = {"t": time.monotonic()}  # the worker echoes its stamps (core/worker/debug.py)
        return control(cmd, **args)

    window.handle.control = timed_control
    window.handle.sig_step_paused.connect(lambda e: pauses.append(e))
    inspector_ms: list[float] = []
    show_node = window.inspector.show_node

    def timed_show_node(*a, **k):
        t = time.perf_counter()
        show_node(*a, **k)
        inspector_ms.append((time.perf_counter() - t) * 1000)

    window.inspector.show_node = timed_show_node
    ends: list[dict] = []
    window.handle.sig_step_end.connect(lambda e: ends.append(e))
    cont_hops: dict[str, list[float]] = {}
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    for run in range(repeat):
        if run:
            window.act_stop.trigger()
            first_pause(scripts[-1], None)
        if profiler is not None:
            profiler.enable()
        for _ in range(steps):
            hit = {}
            conn = session.sig_paused.connect(lambda *_: hit.setdefault("t", True))
            # the pause message reaches the GUI: the session says "paused" before views draw it
            arrived = session.sig_state.connect(lambda s: s is SessionState.PAUSED and hit.setdefault("at", time.perf_counter()))
            pauses.clear()
            start = time.perf_counter()
            start_m = time.monotonic()
            window.act_step.trigger()
            while "t" not in hit:
                app.processEvents()
            window.graph.viewport().repaint()
            end = time.perf_counter()
            latencies.append(end - start)
            gui.append(end - hit.get("at", end))
            h = fields_of(pauses[-1]).get("hops") if pauses else None
            if h:
                at = time.monotonic() - (end - hit.get("at", end))
                marks = [("press -> command written", start_m, h["cmd"]),
                         ("pipe -> worker's command thread", h["cmd"], h["read"]),
                         ("command thread -> engine thread wakes", h["read"], h["woke"]),
                         ("node runs, hooks, next pre-hook", h["woke"], h["paused"]),
                         ("step records encoded and sent", h["paused"], h["sent"]),
                         ("pipe -> app's reader thread decoded", h["sent"], fields_of(pauses[-1])["t_in"]),
                         ("reader thread -> GUI thread, session says paused", fields_of(pauses[-1])["t_in"], at)]
                for name, a, b in marks:
                    hops.setdefault(name, []).append(b - a)
            session.sig_paused.disconnect(conn)
            session.sig_state.disconnect(arrived)
        if profiler is not None:
            profiler.disable()
        if profiler is not None and run == repeat - 1:
            cont_profiler = cProfile.Profile()
            cont_profiler.enable()
        start = time.perf_counter()
        start_m = time.monotonic()
        ends.clear()
        window.act_continue.trigger()
        wait(session.sig_step_end)  # the view draws the final state when the call ends
        window.graph.viewport().repaint()
        continues.append(time.perf_counter() - start)
        h = fields_of(ends[-1]).get("hops") if ends else None
        if h:
            for name, a, b in [("press -> worker's command thread", start_m, h["read"]),
                               ("worker: backward runs on, records made", h["read"], h["ran"]),
                               ("worker: last records and memory sent", h["ran"], h["sent"]),
                               ("end message -> decoded in the app", h["sent"], fields_of(ends[-1])["t_in"]),
                               ("app: steps read and final frame drawn", fields_of(ends[-1])["t_in"],
                                time.monotonic())]:
                cont_hops.setdefault(name, []).append(b - a)
        if profiler is not None and run == repeat - 1:
            cont_profiler.disable()
    nodes = window.call.node_count
    window.handle.close()
    latencies.sort()
    med = statistics.median(latencies) * 1000
    print(f"step latency (Step pressed -> worker runs one node -> repainted frame), {nodes:,} nodes, "
          f"{len(latencies)} steps in {repeat} run(s): median {med:.1f} ms, "
          f"p90 {latencies[int(0.9 * len(latencies))] * 1000:.1f} ms, "
          f"p95 {latencies[int(0.95 * len(latencies))] * 1000:.1f} ms (target < 20 ms median) "
          f"{'OK' if med < 20 else 'OVER'}")
    for name, values in hops.items():
        print(f"  hop {name}: median {statistics.median(values) * 1000:.2f} ms, "
              f"p90 {sorted(values)[int(0.9 * len(values))] * 1000:.2f} ms")
    WorkerProcess._deliver = deliver
    if inspector_ms:
        print(f"  the inspector describing the paused node (drawn after the frame, while the next Step "
              f"travels): median {statistics.median(inspector_ms):.1f} ms")
    gui.sort()
    print(f"  of which in the GUI (pause message in -> repainted frame): median {statistics.median(gui) * 1000:.1f} ms, "
          f"p95 {gui[int(0.95 * len(gui))] * 1000:.1f} ms")
    if profiler is not None:
        import pstats

        profiler.dump_stats(profile)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        print("Continue, last run:")
        pstats.Stats(cont_profiler).sort_stats("cumulative").print_stats(25)
    plain = subprocess.run([sys.executable, "-c", (
        "import time, runpy, torch, sys, io\n"
        "torch.set_num_threads(1)\n"
        "sys.stdout = io.StringIO()\n"
        f"g = runpy.run_path({str(BIG)!r})\n"
        "model, inputs = g['model'], g['inputs']\n"
        "best = 1e9\n"
        "for _ in range(3):\n"
        "    loss = model(inputs).pow(2).mean()\n"
        "    t = time.perf_counter(); loss.backward(); best = min(best, time.perf_counter() - t)\n"
        "sys.stdout = sys.__stdout__\n"
        "print(best)\n")], capture_output=True, text=True, check=True)
    backward_s = float(plain.stdout.strip().splitlines()[-1])
    for name, values in cont_hops.items():
        print(f"  continue hop {name}: median {statistics.median(values) * 1000:.0f} ms")
    continue_s = statistics.median(continues)
    print(f"continue to end (F5 pressed -> final state drawn): median {continue_s:.2f} s of {len(continues)} "
          f"({', '.join(f'{c:.2f}' for c in continues)}) for the remaining nodes, plain backward "
          f"{backward_s * 1000:.0f} ms: {continue_s / backward_s:.0f}x (target < 1 s)")


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first-frame", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--debug", action="store_true", help="only the debug-run figures (2 and 3)")
    parser.add_argument("--big-only", action="store_true", help="debug figures on the 4,802-node example only")
    parser.add_argument("--steps", type=int, default=60, help="Steps timed per debug run")
    parser.add_argument("--repeat", type=int, default=1, help="debug runs of the 4,802-node example")
    parser.add_argument("--profile", metavar="FILE", help="cProfile the GUI over the timed steps")
    args = parser.parse_args()
    if args.first_frame:
        first_frame(Path(args.first_frame))
        return 0
    debug = dict(steps=args.steps, scripts=(BIG,) if args.big_only else (MLP, BIG), repeat=args.repeat,
                 profile=args.profile)
    if args.debug:
        step_latency(**debug)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for script in (BIG, HUGE):
            out = Path(tmp) / f"{script.stem}.json"
            capture_json(script, out)
            # A fresh process per graph, without torch, like the app's GUI process.
            subprocess.run([sys.executable, __file__, "--first-frame", str(out)], check=True)
    step_latency(**debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
