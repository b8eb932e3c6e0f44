"""Saved models sent to a worker behind a launcher: the whole run of a model script with a
``--weights`` safetensors file through a local ``sh -c`` launcher (the file travels in pieces)
against the same run with a local worker (which reads the file in place), with zlib and
uncompressed pieces, and through a pipe limited to 10 MiB/s (bench/slow_link.py; ``pv -L``
would lend the app credit for the second the worker takes to start, and let that much through
at full speed).

    python bench/bench_upload.py [--mb 64] [--repeat 3]

Prints the medians and their ratios to the local run, measured in this one run.
"""

from __future__ import annotations

import argparse
import atexit
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.client.handle import run_capture  # noqa: E402
from core.client.launchers import from_command, replace_options  # noqa: E402

SCRIPT = """import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear({n}, {n})
    def forward(self, x):
        return self.fc(x)
model = Net()
example_input = torch.ones(2, {n})
"""


def timed(path: str, load: dict, launcher=None) -> tuple[float, float]:
    """(seconds for the whole run, seconds until the worker had the files: its ``placed`` message)."""
    start = time.perf_counter()
    placed = []

    def on_event(event: dict) -> None:
        if event.get("type") == "placed" and not placed:
            placed.append(time.perf_counter() - start)

    result = run_capture(path, launcher=launcher, timeout=600, load=load, memory_rate=0, on_event=on_event)
    if result.trace.error is not None:
        raise SystemExit(f"run failed: {result.trace.error}")
    return time.perf_counter() - start, (placed or [0.0])[0]


def encode_rate(path: Path, codec: str | None, repeat: int, give_up: int | None = None) -> float:
    """Seconds (median) to cut ``path`` into pieces and write them to /dev/null."""
    import os

    from core.protocol import uploads

    saved = uploads.GIVE_UP
    if give_up is not None:
        uploads.GIVE_UP = give_up
    times = []
    try:
        with open(os.devnull, "wb") as out:
            for _ in range(repeat):
                start = time.perf_counter()
                uploads.send_files(out.write, [(path, path.name)], codec)
                times.append(time.perf_counter() - start)
    finally:
        uploads.GIVE_UP = saved
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=64, help="size of the weights file in MB")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from safetensors.torch import save_file

    n = int((args.mb * 1e6 / 4) ** 0.5)
    tmp = Path(tempfile.mkdtemp(prefix="bench-upload-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the folder goes when the bench ends, however
    script = tmp / "net.py"
    script.write_text(SCRIPT.format(n=n))
    weights = tmp / "net.safetensors"
    save_file({"fc.weight": torch.randn(n, n), "fc.bias": torch.randn(n)}, str(weights))
    load = {"weights": str(weights)}
    py = shlex.quote(sys.executable)
    base = from_command(f"sh -c 'cd {shlex.quote(str(ROOT))} && exec {py} -m core.worker'", name="local")
    cases = {"local worker (no transfer)": None, "launcher, zlib pieces": base,
             "launcher, uncompressed": replace_options(base, compress="none")}
    link = f"{py} {shlex.quote(str(ROOT / 'bench/slow_link.py'))} {10 * 1024 * 1024}"
    cases["launcher through a 10 MiB/s link, zlib"] = from_command(
        f"sh -c {shlex.quote(f'cd {shlex.quote(str(ROOT))} && {link} | {py} -m core.worker')}", name="link")
    print(f"weights: {weights.stat().st_size / 1e6:.1f} MB of random float32, {args.repeat} runs each")
    raw = encode_rate(weights, None, args.repeat)
    for label, codec, give_up in (("pieces, zlib (gives up on weights)", "zlib", None),
                                  ("pieces, zlib tried on every piece", "zlib", 10**9)):
        t = encode_rate(weights, codec, args.repeat, give_up)
        print(f"{label:36s} median {t:6.3f} s  ({t / raw:5.1f}x raw pieces, {raw:.3f} s)")
    medians = {}
    for label, launcher in cases.items():
        runs = [timed(str(script), load, launcher) for _ in range(args.repeat)]
        medians[label] = statistics.median(r[0] for r in runs)
        arrived = statistics.median(r[1] for r in runs)
        ref = medians["local worker (no transfer)"]
        sent = f", files on the host after {arrived:5.2f} s" if launcher is not None else ""
        print(f"{label:36s} median {medians[label]:6.2f} s  ({medians[label] / ref:4.2f}x the local run){sent}")


if __name__ == "__main__":
    main()
