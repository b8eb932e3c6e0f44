"""Soak: many runs and random stepping sequences in one window; resources must stay flat.

    python bench/soak.py [--runs 100] [--sequences 200]

Runs the bundled examples one after another in one offscreen main window, then random
sequences of Step / Continue / Stop / Restart, printing every 10 runs (and every tenth of the
sequences) the GUI's RSS, threads and open fds, the live worker processes and the temp files
the app left. A leak shows as a column that keeps growing. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import psutil  # noqa: E402

EXAMPLES = ["01_multiply.py", "02_polynomial.py", "06_retain_grad.py", "08_inplace_error.py", "13_mlp_classifier.py"]


def snapshot(tmp: Path) -> dict:
    me = psutil.Process()
    workers = [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    return {"rss_mb": me.memory_info().rss / 2**20, "threads": me.num_threads(), "fds": me.num_fds(),
            "workers": len(workers), "temp_files": len(list(tmp.iterdir()))}


def show(label: str, snap: dict) -> None:
    print(f"{label:>14}  RSS {snap['rss_mb']:7.1f} MB  threads {snap['threads']:3d}  fds {snap['fds']:4d}  "
          f"workers {snap['workers']:2d}  temp files {snap['temp_files']:2d}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--sequences", type=int, default=200)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    settings = Path(tempfile.mkdtemp(prefix="soak-settings-"))  # apart: its files are not the app's temp files
    for folder in (tmp, settings):
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # both go when the soak ends, however
    tempfile.tempdir = str(tmp)  # the app's temp files land here, where they can be counted
    os.environ["BACKPROP_STUDIO_SETTINGS"] = str(settings / "settings.ini")

    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from app.window.window import MainWindow

    app = QApplication.instance() or QApplication([])
    window = MainWindow(timeout=120)
    window.resize(1200, 800)
    window.show()

    def wait_shown(action, limit: float = 120.0) -> bool:
        loop = QEventLoop()
        done = {"ok": False}

        def finish() -> None:
            done["ok"] = True
            loop.quit()

        window.sig_trace_shown.connect(finish)
        QTimer.singleShot(int(limit * 1000), loop.quit)
        action()
        if not done["ok"]:
            loop.exec()
        window.sig_trace_shown.disconnect(finish)
        return done["ok"]

    def pump(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.01)

    def settle(limit: float = 30.0) -> None:
        end = time.monotonic() + limit
        while time.monotonic() < end and (window.handle.running or window.stepper.active):
            pump(0.05)
        pump(0.3)

    rows = []
    show("start", snapshot(tmp))
    start = time.monotonic()
    for i in range(1, args.runs + 1):
        script = ROOT / "resources" / "examples" / EXAMPLES[i % len(EXAMPLES)]
        wait_shown(lambda: window.open_script(str(script)))
        settle()
        if i % 10 == 0:
            snap = snapshot(tmp)
            rows.append(snap)
            show(f"run {i}", snap)
    runs_s = time.monotonic() - start
    rng = random.Random(args.seed)
    wait_shown(lambda: window.open_script(str(ROOT / "resources" / "examples" / "13_mlp_classifier.py")))
    settle()
    actions = {"step": window.act_step, "continue": window.act_continue, "stop": window.act_stop,
               "restart": window.act_restart}
    start = time.monotonic()
    for i in range(1, args.sequences + 1):
        for _ in range(rng.randint(1, 6)):
            name = rng.choice(list(actions))
            action = actions[name]
            if action.isEnabled():
                action.trigger()
            pump(rng.choice((0.0, 0.05, 0.2)))
        if window.stepper.active:
            window.act_stop.trigger() if window.act_stop.isEnabled() else None
        settle()
        if i % max(1, args.sequences // 10) == 0:
            snap = snapshot(tmp)
            rows.append(snap)
            show(f"sequence {i}", snap)
    steps_s = time.monotonic() - start
    window.close()
    app.processEvents()
    end = snapshot(tmp)
    show("closed", end)
    first, last = rows[0], rows[-1]
    print(f"\n{args.runs} runs in {runs_s:.0f} s, {args.sequences} sequences in {steps_s:.0f} s")
    print(f"first → last sample: RSS {first['rss_mb']:.1f} → {last['rss_mb']:.1f} MB, "
          f"threads {first['threads']} → {last['threads']}, fds {first['fds']} → {last['fds']}, "
          f"workers {first['workers']} → {last['workers']}, temp files {first['temp_files']} → {last['temp_files']}")
    print(f"after closing the window: workers {end['workers']}, temp files {end['temp_files']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
