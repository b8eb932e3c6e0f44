"""Stop at random moments: a training loop stopped at a random time, many times over.

    python bench/stop_at_random.py [--runs 40] [--launcher] [--paused] [--layers 300] [--seed 1]

Each run starts a loop of SGD steps on a 300-layer MLP (about 1,500 nodes a call, each call
streamed to the app as it is captured) and presses Stop at a random moment 2 to 6 s in, so
the Stop lands sometimes in the script, sometimes while the worker streams a call.
``--paused`` debugs instead: the run pauses before backward of a random call (0 to 5) and
Stop comes there, as the window's Stop does (``stop_step``, then ``cancel``): the stepper
lets go of backward, the capture stores the call and streams it, and the interrupt comes
while it does.
``--launcher`` runs the worker behind a local launcher (``sh -c 'exec python -m core.worker'``),
where calls travel as compressed frames. For every run it prints how long the run took to
end after Stop, how many calls came back and the error; then how many runs took longer than
the script's own grace (1 s) to end, and how many came back with no line named or a call cut
off. Not a test: the moments are random, and it prints figures.
A run that makes no progress for ``--stall`` seconds (default 45: not paused, not ended)
gets every stack dumped, the app's (faulthandler, all threads) and the worker's (its fault
file, or what a launcher's worker sends back), on stderr, and the bench goes on.
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import random
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.protocol import events
from core.protocol import messages as protocol
from core.client.handle import STOP_GRACE, WorkerClient  # noqa: E402
from core.client.launchers import from_command  # noqa: E402

LOOP = """\
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(LAYERS)])
x = torch.randn(4, 32)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(10000):
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


class Watchdog(threading.Thread):
    """Dumps every stack, the app's and the worker's, once a run has made no progress for
    ``bound`` seconds: a stall that no wait's limit catches (a call that never returns) is named."""

    def __init__(self, client: WorkerClient, bound: float):
        super().__init__(name="stall-watchdog", daemon=True)
        self.client, self.bound = client, bound
        self.stopped = threading.Event()
        self.at, self.what, self.dumped = time.monotonic(), "starting", False
        self.stalls: list[str] = []

    def progress(self, what: str) -> None:
        self.at, self.what, self.dumped = time.monotonic(), what, False

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            if not self.dumped and time.monotonic() - self.at > self.bound:
                self.dumped = True
                self.dump()

    def dump(self) -> None:
        self.stalls.append(self.what)
        print(f"\n== no progress for {self.bound:g} s at: {self.what}. The app's stacks:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        worker = self.client._active  # noqa: SLF001 - the bench looks inside, as a debugger would
        if worker is None:
            print("== no worker is running", file=sys.stderr, flush=True)
            return
        print(f"== the worker's stacks (pid {worker.proc.pid if worker.proc else None}, "
              f"alive {worker.alive}):", file=sys.stderr, flush=True)
        worker.dump_and_wait(limit=5.0)
        print(worker.fault_text()[-30000:] or "(none came)", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--launcher", action="store_true", help="the worker behind a local launcher")
    parser.add_argument("--paused", action="store_true", help="Stop a debug run paused before a call")
    parser.add_argument("--layers", type=int, default=300, help="layers of the MLP (5 nodes each)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stall", type=float, default=45.0,
                        help="seconds without progress before every stack is dumped")
    args = parser.parse_args()
    # Ended by SIGTERM (``timeout``), it still closes its workers and removes its folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    launcher = None
    if args.launcher:
        launcher = from_command(f"sh -c {shlex.quote(f'cd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} -m core.worker')}")
    folder = Path(tempfile.mkdtemp(prefix="stop-at-random-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the folder goes when the bench ends, however
    script = folder / "loop.py"
    script.write_text(LOOP.replace("LAYERS", str(args.layers)))
    done, paused = threading.Event(), threading.Event()
    box: dict = {}

    def handle(event) -> None:
        if isinstance(event, protocol.StepPaused):
            paused.set()
        if isinstance(event, events.Finished):
            box["result"] = event.result
            done.set()

    client = WorkerClient(handle, prestart=True, launcher=launcher)
    watchdog = Watchdog(client, args.stall)
    watchdog.start()
    rng = random.Random(args.seed)
    slow, unnamed, cut = [], [], []
    try:
        watchdog.progress("the first (cold) run")
        client.run(str(script), timeout=120)  # the first worker starts cold: this run is not counted
        time.sleep(8)
        client.cancel()
        done.wait(60)
        for i in range(args.runs):
            done.clear()
            paused.clear()
            if args.paused:
                at = rng.randrange(6)
                watchdog.progress(f"run {i}: starting, to pause at call {at}")
                client.run(str(script), debug={"lines": [], "pause_all": True, "skip_to": at})
                watchdog.progress(f"run {i}: waiting to pause at call {at}")
                paused.wait(60)
                delay = rng.uniform(0.0, 0.2)
                time.sleep(delay)
                moment = f"Stop paused at call {at}"
            else:
                watchdog.progress(f"run {i}: starting")
                client.run(str(script), timeout=120)
                delay = rng.uniform(2.0, 6.0)
                time.sleep(delay)
                moment = f"Stop at {delay:.2f} s"
            began = time.monotonic()
            watchdog.progress(f"run {i}: {moment}, pressing Stop")
            if args.paused:
                client.control("stop_step")
            client.cancel()
            watchdog.progress(f"run {i}: {moment}, waiting for the run to end")
            ended = done.wait(60)
            took = time.monotonic() - began
            result = box.get("result") if ended else None
            err = result.trace.error if result is not None else None
            message = err.message if err is not None else "no result within 60 s"
            calls = len(result.trace.calls) if result is not None else 0
            print(f"{i:3d}  {moment}  ended {took:5.2f} s later  {calls:3d} calls  {message[:80]}",
                  flush=True)
            if took > STOP_GRACE:
                slow.append(i)
            if err is None or not err.line:
                unnamed.append(i)
            if "cut off" in message:
                cut.append(i)
    finally:
        watchdog.progress("closing the client")
        client.close()
        watchdog.stopped.set()
    where = ("behind a local launcher" if launcher else "in the local worker") + (", paused" if args.paused else "")

    def count(runs: list[int], what: str) -> str:
        return f"{len(runs)} {what}" + (f" (runs {', '.join(map(str, runs))})" if runs else "")

    print(f"\n{args.runs} runs {where}: {count(slow, f'took longer than {STOP_GRACE:g} s to end')}, "
          f"{count(unnamed, 'named no line')}, {count(cut, 'had a call cut off')}, "
          f"{len(watchdog.stalls)} stalled" + (f" ({'; '.join(watchdog.stalls)})" if watchdog.stalls else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
