"""Trace transfer from a worker behind a launcher: the 4,802- and 50,000-node examples.

Run: python bench/bench_remote.py [--repeat N] [--traces DIR] [--whole-run | --loop]. Each example is captured once
(or read from DIR/<example>.json), then:

- in one process, the CPU time to encode the trace, compress it and decode it, as the JSON of
  the trace format (what travelled before) and in the columnar encoding (core.protocol.columns);
- end to end, its trace sent by a stand-in worker (bench/send_trace.py, the worker's own
  Channel) behind a local launcher, straight through a pipe and through a 10 MiB/s link
  (bench/slow_link.py: ``pv -L`` lends a slow sender credit for its idle time, so it never held
  these transfers back), in each encoding and codec, and in columns uncompressed
  (``raw``, as ``--compress none`` and the local worker send them). Times run from the sender
  starting to encode to the app holding the decoded Trace (median of N runs); "wire" is what
  the compressed bytes alone take at 10 MiB/s, and "x wire" the ratio of the two. "link, pinned"
  holds the sender and the link to one CPU and the app to another, as on two machines with a core
  each (where taskset is installed): both ends no longer take turns on the same cores;
- one more transfer through the link per codec, timed along the way: when the sender had its first
  batch of columns and its last column line, when the app had read the last and when it held the trace
  (what is left to the app once the worker is done).

With ``--whole-run``: whole runs of the 50,000-node example instead (capture, encoding, transfer
and reading, as the app waits for them), in the local worker, in a real worker behind a local
launcher, and behind it through the 10 MiB/s link, taking turns: what the link adds to a run.
With ``--loop``: whole runs of a 20-step training loop of the 4,802-node example behind a
launcher, through a pipe and through a 1 MiB/s link: what a loop's calls cost on a slow link.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.protocol import wire
from core.client.handle import WorkerClient, run_capture  # noqa: E402
from core.client.launchers import from_command  # noqa: E402
from core.model.trace import Trace, paused_gc  # noqa: E402
from core.model.trace_json import load_trace, trace_from_dict  # noqa: E402
from core.protocol.column_reader import ColumnReader  # noqa: E402
from core.protocol.columns import encode_lines  # noqa: E402
from bench.send_trace import as_the_worker_holds_it  # noqa: E402

EXAMPLES = [("4,802 nodes", ROOT / "resources/examples/50_big_residual_mlp.py"),
            ("50,000 nodes", ROOT / "resources/examples/51_huge_residual_mlp.py")]
RATE = 10 * 1024 * 1024


def can_pin() -> bool:
    """Two CPUs and ``taskset``: the sender and the app can each be held to a core of its own."""
    return (hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2
            and shutil.which("taskset") is not None)


def send_once(trace_file: Path, codec: str, throttle: bool, encoding: str = "columns",
              script: Path = EXAMPLES[0][1], pinned: bool = False, extra: str = "",
              marks: dict | None = None) -> tuple[float, int, int]:
    """One transfer; ``script`` is what the app asks to run (its text travels; the stand-in sends the trace).
    ``pinned``: the sender (and the link) on the first CPU, this process on the second, as on two
    machines with one core each, instead of both ends sharing every core. ``extra``: more
    arguments for the stand-in (see bench/send_trace.py); ``marks`` gets the time it started."""
    cpus = sorted(os.sched_getaffinity(0)) if pinned else []
    on = f"taskset -c {cpus[0]} " if pinned else ""
    sender = f"{on}{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'bench/send_trace.py'))} " \
             f"{shlex.quote(str(trace_file))} {codec} {encoding} {extra}"
    if throttle:
        sender += f" | {on}{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'bench/slow_link.py'))} {RATE}"
    launcher = from_command(f"sh -c {shlex.quote(sender)}", name="bench", compress="none" if codec == "raw" else codec)
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

    if pinned:
        os.sched_setaffinity(0, {cpus[1]})  # threads started from here on (the client's readers) inherit it
    try:
        client = WorkerClient(on_event, prestart=False, launcher=launcher)
        client.run(str(script), timeout=600)
        done.wait(600)
        client.close()
    finally:
        if pinned:
            os.sched_setaffinity(0, cpus)
    assert box["result"].trace.error is None, box["result"].trace.error
    # A big frame freezes the heap when it ends (core.protocol.wire); the app unfreezes and collects when
    # the next trace opens (app.session.session.settle_heap): so does each run here, after its timing.
    took, sent, raw = box["t1"] - box["t0"], box["bytes"], box["raw"]
    if marks is not None:
        marks["started"] = box["t0"]
    box.clear()
    gc.unfreeze()
    gc.collect()
    return took, sent, raw


def timeline(trace_file: Path, codec: str, script: Path) -> dict:
    """One transfer through the 10 MiB/s link, in seconds from the sender starting to encode: when
    its first batch of columns was whole (it leaves for the link) and its last column line
    encoded, when this app had read the last one
    (the frame's end: the reader starts its final assembly) and when it held the trace."""
    marks: dict = {}
    result = ColumnReader.result

    def timed(self):
        marks["read"] = time.time()
        try:
            return result(self)
        finally:
            marks["held"] = time.time()

    with tempfile.TemporaryDirectory() as tmp:
        stamps = Path(tmp) / "stamps.json"
        ColumnReader.result = timed
        try:
            send_once(trace_file, codec, True, "columns", script, extra=f"timeline={shlex.quote(str(stamps))}",
                      marks=marks)
        finally:
            ColumnReader.result = result
        sender = json.loads(stamps.read_text())
    t0 = marks["started"]
    return {"first": sender["first"] - t0, "last": sender["last"] - t0, "read": marks["read"] - t0,
            "held": marks["held"] - t0}


def whole_run(script: Path, codec: str, how: str, rate: float = RATE) -> float:
    """Wall seconds of one whole run of ``script`` (capture, encoding, transfer, reading), as
    the app waits for it: in the local worker (``how`` "local"), or in a real worker behind a
    local launcher, straight through a pipe ("pipe") or through a link of ``rate`` bytes a
    second ("link")."""
    launcher = None
    if how != "local":
        worker = f"{shlex.quote(sys.executable)} -m core.worker"
        if how == "link":
            worker += f" | {shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'bench/slow_link.py'))} {rate}"
        launcher = from_command(f"sh -c {shlex.quote(f'cd {shlex.quote(str(ROOT))} && {worker}')}", name="bench",
                                compress=codec)
    t0 = time.perf_counter()
    result = run_capture(str(script), timeout=900, launcher=launcher, memory_rate=0)
    took = time.perf_counter() - t0
    assert result.trace.error is None and result.trace.calls, result.trace.error
    del result
    gc.unfreeze()
    gc.collect()
    return took


def compare_whole_runs(title: str, script: Path, cases: dict[str, str], repeat: int, codec: str,
                       rate: float = RATE) -> None:
    """Whole runs of ``script`` in each of ``cases`` (``whole_run``'s "local", "pipe", "link",
    each with its label), taking turns ``repeat`` times: each case's median, and what the link
    adds over the pipe."""
    print(f"{title}, whole runs (wall seconds, median of {repeat}, cases taking turns; {codec}):")
    times: dict = {case: [] for case in cases}
    for _ in range(repeat):
        for case in cases:
            times[case].append(whole_run(script, codec, case, rate))
    for case, label in cases.items():
        ts = times[case]
        print(f"  {label:<26}{statistics.median(ts):>7.2f} s  (runs: {', '.join(f'{t:.2f}' for t in ts)})")
    link, pipe = statistics.median(times["link"]), statistics.median(times["pipe"])
    print(f"  the link adds {link - pipe:+.2f} s to a whole run over the pipe")


LOOP_STEPS = 20
SLOW_RATE = 1024 * 1024  # a VPN to a cluster, say


def loop_script(folder: Path) -> Path:
    """The 4,802-node example as a training loop: LOOP_STEPS steps of SGD, one backward call each."""
    text = EXAMPLES[0][1].read_text().split("start = time.perf_counter()")[0]
    path = folder / "loop_4802.py"
    path.write_text(text + f"opt = torch.optim.SGD(model.parameters(), lr=0.01)\nfor step in range({LOOP_STEPS}):\n"
                    "    opt.zero_grad()\n    model(inputs).pow(2).mean().backward()\n    opt.step()\n")
    return path


def compress(data: bytes, codec: str) -> tuple[bytes, float, float]:
    """The data compressed in chunks as a frame is, with the CPU seconds to compress and to decompress it."""
    t0 = time.process_time()
    packer = wire.Packer(codec)
    out = b"".join(packer.cut(data[at:at + wire.CHUNK]) for at in range(0, len(data), wire.CHUNK)) + packer.end()
    t1 = time.process_time()
    dec = wire.decompressor(codec)
    assert b"".join(dec.decompress(out[at:at + wire.CHUNK]) for at in range(0, len(out), wire.CHUNK)) == data
    return out, t1 - t0, time.process_time() - t1


def in_process(trace: Trace, codecs: list[str]) -> dict:
    """CPU seconds to encode and decode, and compressed sizes, for both encodings."""
    out = {}
    with paused_gc():
        t0 = time.process_time()
        text = json.dumps(trace.to_dict(), separators=(",", ":")).encode()
        t1 = time.process_time()
        trace_from_dict(json.loads(text))
        t2 = time.process_time()
    out["json"] = {"encode": t1 - t0, "decode": t2 - t1, "raw": len(text)}
    t0 = time.process_time()
    lines = list(encode_lines(trace))
    t1 = time.process_time()
    with paused_gc():  # as the app reads a frame (core.protocol.wire.StreamDecoder)
        reader = ColumnReader()
        for line in lines:
            reader.feed(line)
        t2 = time.process_time()
        back = reader.result()
        t3 = time.process_time()
    assert back == trace
    data = b"".join(lines)
    out["columns"] = {"encode": t1 - t0, "decode": t3 - t1, "parse": t2 - t1, "build": t3 - t2, "raw": len(data)}
    for name, raw in (("json", text), ("columns", data)):
        for codec in codecs:
            packed, seconds, back = compress(raw, codec)
            out[name][codec] = (len(packed), seconds, back)
    return out


def temp_folder() -> Path:
    """A folder of the bench's own, removed when it ends (however it ends)."""
    folder = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="end-to-end runs per case (median)")
    ap.add_argument("--traces", help="a folder with the examples' traces saved as <stem>.json (skips capture)")
    ap.add_argument("--only", choices=["4802", "50000"], help="one example")
    ap.add_argument("--whole-run", action="store_true",
                    help="only whole runs of the 50,000-node example: local, behind a launcher, through the link")
    ap.add_argument("--loop", action="store_true",
                    help=f"only whole runs of a {LOOP_STEPS}-step training loop of the 4,802-node example, behind a "
                         f"launcher, through a pipe and a 1 MiB/s link")
    args = ap.parse_args()
    codec = "zstd" if "zstd" in wire.available_codecs() else "zlib"
    if args.loop:
        compare_whole_runs(f"{LOOP_STEPS} steps of the 4,802-node example", loop_script(temp_folder()),
                           {"pipe": "launcher, pipe", "link": "launcher, 1 MiB/s link"}, args.repeat, codec,
                           SLOW_RATE)
        return
    if args.whole_run:
        compare_whole_runs("50,000 nodes", EXAMPLES[1][1], {"local": "local worker", "pipe": "launcher, pipe",
                                                            "link": "launcher, 10 MiB/s link"}, args.repeat, codec)
        return
    tmp = temp_folder()
    codecs = wire.available_codecs()
    for label, script in EXAMPLES:
        if args.only and args.only != label.split()[0].replace(",", ""):
            continue
        trace_file = Path(args.traces) / f"{script.stem}.json" if args.traces else tmp / f"{script.stem}.json"
        if not trace_file.is_file():
            result = run_capture(str(script), timeout=900)
            result.trace.save(trace_file)
        trace = as_the_worker_holds_it(load_trace(trace_file))
        cpu = in_process(trace, codecs)
        print(f"\n{label}, in one process (CPU seconds; MB):")
        print(f"  {'encoding':<9}{'raw MB':>8}{'encode':>8}{'decode':>8}" +
              "".join(f"{c + ' MB':>10}{c + ' s':>9}{'wire ' + c:>11}" for c in codecs))
        for name in ("json", "columns"):
            c = cpu[name]
            row = f"  {name:<9}{c['raw'] / 1e6:>8.1f}{c['encode']:>8.2f}{c['decode']:>8.2f}"
            for codec in codecs:
                size, seconds, _ = c[codec]
                row += f"{size / 1e6:>10.2f}{seconds:>9.2f}{size / RATE:>10.2f}s"
            print(row)
        col = cpu["columns"]
        print(f"  columns decode = lines fed {col['parse']:.2f} (parsed, and each block of rows built as it came) + "
              f"the rest built at the end {col['build']:.2f}; encode + decode "
              f"{col['encode'] + col['decode']:.2f} s against the zlib wire's {col['zlib'][0] / RATE:.2f} s "
              f"({(col['encode'] + col['decode']) / (col['zlib'][0] / RATE):.2f}x); JSON's "
              f"{cpu['json']['encode'] + cpu['json']['decode']:.2f} s against {cpu['json']['zlib'][0] / RATE:.2f} s")
        for codec in codecs:
            size, packs, unpacks = col[codec]
            print(f"  {codec}: the worker's side {col['encode']:.2f} s encoding + {packs:.2f} s compressing (on its "
                  f"writer thread), the app's {unpacks:.2f} s decompressing + {col['decode']:.2f} s decoding, "
                  f"against {size / RATE:.2f} s on the link")
        print(f"\n{label}, end to end (median of {args.repeat}):")
        print(f"  {'link':<13}{'encoding':<9}{'codec':<6}{'bytes sent':>12}{'seconds':>9}{'wire':>8}{'x wire':>8}")
        links = [(False, False), (True, False)] + ([(True, True)] if can_pin() else [])
        for throttle, pinned in links:
            cases = [("json", "zlib"), ("columns", "zlib")] + ([("columns", "zstd")] if "zstd" in codecs else []) \
                + [("columns", "raw")]  # uncompressed: what --compress none and the local worker send
            if pinned:
                cases = cases[1:-1]
            for encoding, codec in cases:
                runs = [send_once(trace_file, codec, throttle, encoding, script, pinned) for _ in range(args.repeat)]
                seconds = statistics.median(r[0] for r in runs)
                sent = runs[0][1]
                link = ("link, pinned" if pinned else "10 MiB/s") if throttle else "pipe"
                ratio = f"{seconds / (sent / RATE):.2f}x" if throttle else ""
                print(f"  {link:<13}{encoding:<9}{codec:<6}{sent:>12,}{seconds:>8.2f}s{sent / RATE:>7.2f}s{ratio:>8}")
                sys.stdout.flush()
        print(f"\n{label}, one transfer through the 10 MiB/s link, ms after the sender starts encoding:")
        for codec in codecs:
            t = {k: 1000 * v for k, v in timeline(trace_file, codec, script).items()}
            print(f"  {codec}: the worker's first batch {t['first']:.0f}, its last column {t['last']:.0f}; "
                  f"the app read the last at {t['read']:.0f} and held the trace at {t['held']:.0f} "
                  f"({t['held'] - t['last']:.0f} after the worker's last line)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
