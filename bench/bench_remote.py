"""Trace transfer from a worker behind a launcher: the 4,802- and 50,000-node examples.

Run: python bench/bench_remote.py. Each example is captured once, then its trace is sent by a
stand-in worker (bench/send_trace.py, the worker's own encoding code) behind a local launcher,
with and without compression, straight through a pipe and through ``pv -L 10m`` (a 10 MiB/s
link) where pv is installed. Times run from the sender starting to encode to the app holding
the decoded Trace; "wire" is what one would expect from the bytes alone at 10 MiB/s.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.client import run_capture, WorkerClient  # noqa: E402
from core.launchers import from_command  # noqa: E402

EXAMPLES = [("4,802 nodes", ROOT / "resources/examples/50_big_residual_mlp.py"),
            ("50,000 nodes", ROOT / "resources/examples/51_huge_residual_mlp.py")]
RATE = 10 * 1024 * 1024


def send_once(trace_file: Path, codec: str, throttle: bool) -> tuple[float, int, int]:
    sender = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'bench/send_trace.py'))} " \
             f"{shlex.quote(str(trace_file))} {codec}"
    if throttle:
        sender += " | pv -q -L 10m"
    launcher = from_command(f"sh -c {shlex.quote(sender)}", name="bench", compress=codec)
    done = threading.Event()
    box: dict = {"bytes": 0, "raw": 0}

    def on_event(e: dict) -> None:
        if e.get("type") == "started":
            box["t0"] = e["t"]
        elif e.get("type") == "transfer":
            box["bytes"], box["raw"] = e["received"], e["raw"]
        elif e.get("type") == "finished":
            box["t1"] = time.time()
            box["result"] = e["result"]
            done.set()

    client = WorkerClient(on_event, prestart=False, launcher=launcher)
    client.run(str(trace_file), timeout=600)
    done.wait(600)
    client.close()
    assert box["result"].trace.error is None, box["result"].trace.error
    return box["t1"] - box["t0"], box["bytes"], box["raw"]


def encode_decode(trace) -> tuple[float, float]:
    import json

    from core.trace import Trace, paused_gc

    t0 = time.perf_counter()
    with paused_gc():
        text = json.dumps(trace.to_dict(), separators=(",", ":"))
    t1 = time.perf_counter()
    with paused_gc():
        Trace.from_dict(json.loads(text))
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    pv = shutil.which("pv") is not None
    print(f"{'trace':<14}{'link':<14}{'codec':<7}{'bytes sent':>14}{'seconds':>10}{'wire at 10 MiB/s':>18}")
    for label, script in EXAMPLES:
        result = run_capture(str(script), timeout=900)
        trace_file = tmp / f"{script.stem}.json"
        result.trace.save(trace_file)
        raw = trace_file.stat().st_size
        enc, dec = encode_decode(result.trace)
        print(f"{label}: {raw:,} bytes of JSON; in one process the trace takes {enc:.2f} s to encode "
              f"(to_dict + dumps) and {dec:.2f} s to decode (loads + from_dict)")
        for throttle in ([False, True] if pv else [False]):
            for codec in ("none", "zlib"):
                seconds, sent, _ = send_once(trace_file, codec, throttle)
                sent = sent or raw
                link = "pv -L 10m" if throttle else "pipe"
                wire = f"{sent / RATE:.2f} s" if throttle else ""
                print(f"{label:<14}{link:<14}{codec:<7}{sent:>14,}{seconds:>9.2f}s{wire:>18}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
