"""Whole-command cost of capture on real models: ``main.py trace`` against ``python SCRIPT``.

Run: python bench/bench_models.py [--repeat N] [--only NAME]. Each figure is the median
wall time of whole commands (interpreter start, imports, the script, and for ``trace`` the
worker, the capture and the summary), bare and traced runs alternated in this one run so
both see the same machine load. Also times ``export`` to SVG of GPT-2 small against
torchviz ``make_dot`` + ``dot -Tsvg`` on the same script (when torchviz is importable: ``pip install
torchviz``, a benchmark-only tool, or /tmp/tvpkgs). GPT-2 and BERT need ``transformers`` (random init, offline).
Beside each wall-time ratio, the ratio of CPU seconds (the command and every process it
waited for), which a machine shared with other work disturbs much less. On such a machine
``--only export --repeat 5`` gives a steadier export figure than the default three runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "bench" / "scripts"
TORCHVIZ_DIR = Path("/tmp/tvpkgs")
CASES = [  # name, script, target ratio
    ("gpt2-small", SCRIPTS / "gpt2_small.py", 1.3),
    ("bert-base", SCRIPTS / "bert_base.py", 1.3),
    ("residual-mlp", SCRIPTS / "residual_mlp.py", 1.5),
    ("tiny-4802", ROOT / "resources" / "examples" / "50_big_residual_mlp.py", 2.0),
]

TORCHVIZ = """\
import runpy, sys, subprocess
sys.path.append({tv!r})
import torch
from torchviz import make_dot
ns = runpy.run_path({script!r}, run_name="__main__")
dot = make_dot(ns["loss"], params=dict(ns["model"].named_parameters()))
dot.save({out!r})
subprocess.run(["dot", "-Tsvg", {out!r}, "-o", {out!r} + ".svg"], check=True)
"""


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


CPU_SECONDS: dict[str, list[float]] = {}  # command label -> CPU seconds of each run (user + system)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], label: str = "") -> float:
    """Wall seconds of one whole command; its CPU seconds (with every process it waited for: the
    worker, ``dot``) go to CPU_SECONDS[label], a figure the load of a shared machine disturbs less."""
    t0, c0 = time.perf_counter(), _children_cpu()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    CPU_SECONDS.setdefault(label, []).append(_children_cpu() - c0)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return wall


def cpu(label: str) -> float:
    return statistics.median(CPU_SECONDS[label])


def _has_transformers() -> bool:
    return subprocess.run([sys.executable, "-c", "import transformers"], capture_output=True).returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", help="run one case (gpt2-small, bert-base, residual-mlp, tiny-4802, export)")
    args = parser.parse_args()
    py = sys.executable
    main_py = str(ROOT / "main.py")
    hf = _has_transformers()
    print(f"whole commands, median of {args.repeat}, alternated; OMP_NUM_THREADS={_env()['OMP_NUM_THREADS']}")
    print(f"{'script':<14}{'bare s':>9}{'trace s':>9}{'ratio':>8}{'target':>8}")
    failed = False
    for name, script, target in CASES:
        if args.only and args.only != name:
            continue
        if name in ("gpt2-small", "bert-base") and not hf:
            print(f"{name:<14} skipped: transformers is not installed")
            continue
        timed([py, str(script)])  # warm the file cache
        bare, traced = [], []
        for _ in range(args.repeat):
            bare.append(timed([py, str(script)], f"{name} bare"))
            traced.append(timed([py, main_py, "trace", str(script)], f"{name} trace"))
        b, t = statistics.median(bare), statistics.median(traced)
        ok = t / b <= target
        failed |= not ok
        cpu_ratio = cpu(f"{name} trace") / cpu(f"{name} bare")
        print(f"{name:<14}{b:>9.2f}{t:>9.2f}{t / b:>7.2f}x{target:>7.1f}x {'ok' if ok else 'OVER'}"
              f"   (CPU s: {cpu(f'{name} bare'):.2f} bare, {cpu(f'{name} trace'):.2f} trace, {cpu_ratio:.2f}x)")
    if (not args.only or args.only == "export") and hf:
        script = SCRIPTS / "gpt2_small.py"
        with tempfile.TemporaryDirectory() as tmp:
            tv_ok = subprocess.run([py, "-c", f"import sys; sys.path.append({str(TORCHVIZ_DIR)!r}); import torchviz"],
                                   capture_output=True).returncode == 0
            code = TORCHVIZ.format(tv=str(TORCHVIZ_DIR), script=str(script), out=f"{tmp}/tv.dot")
            ours, theirs = [], []
            for _ in range(args.repeat):  # alternated, like the trace runs
                ours.append(timed([py, main_py, "export", str(script), "-o", f"{tmp}/gpt2.svg"], "export"))
                if tv_ok:
                    theirs.append(timed([py, "-c", code], "torchviz"))
            mine = statistics.median(ours)
            line = f"export SVG of gpt2-small: {mine:.2f} s"
            if tv_ok:
                tv = statistics.median(theirs)
                line += (f"; torchviz make_dot + dot -Tsvg: {tv:.2f} s ({mine / tv:.2f}x); CPU s: {cpu('export'):.2f} "
                         f"against {cpu('torchviz'):.2f} ({cpu('export') / cpu('torchviz'):.2f}x)")
            else:
                line += "; torchviz not installed (pip install torchviz)"
            print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
