"""Stepping overhead on the ~5,000-node residual MLP of ``50_big_residual_mlp.py``.

Run: python bench/bench_stepping.py [--steps N] [--repeat N]. One thread, in this process.
Prints: time from ``run()`` to the first pause (walk + hook install), the median and p95 time
from ``step()`` to the next paused state (controller and script on two threads, as in the
worker), and continue-to-end (``resume()`` at the first pause until finished) against a plain
backward of an identical graph, and the ``steps`` message a Continue sends: its JSON size,
encode and decode times as records holding their previews against each preview sent once
(``core.protocol.step_pack``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from core.protocol.messages import StepperState  # noqa: E402
from core.worker.stepper import BackwardStepper, StepperStopped, step_all  # noqa: E402

WIDTH, BLOCKS, BATCH = 64, 800, 8


class Block(nn.Module):
    def __init__(self, width, init_std):
        super().__init__()
        self.fc = nn.Linear(width, width)
        nn.init.normal_(self.fc.weight, std=init_std)
        nn.init.zeros_(self.fc.bias)

    def forward(self, hidden):
        return hidden + torch.relu(self.fc(hidden))


def build_loss(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    hidden = inputs
    for block in model:
        hidden = block(hidden)
    return hidden.pow(2).mean()


def start(stepper: BackwardStepper) -> threading.Thread:
    def script():
        try:
            stepper.run()
        except StepperStopped:
            pass

    thread = threading.Thread(target=script, daemon=True)
    thread.start()
    return thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="single steps to time")
    parser.add_argument("--repeat", type=int, default=5, help="runs for the end-to-end figures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(WIDTH, 0.1 / BLOCKS) for _ in range(BLOCKS)))
    inputs = torch.randn(BATCH, WIDTH)

    loss = build_loss(model, inputs)
    loss.backward()  # warm-up
    plain = []
    for _ in range(args.repeat):
        loss = build_loss(model, inputs)
        t0 = time.perf_counter()
        loss.backward()
        plain.append(time.perf_counter() - t0)

    setup, to_end, headless = [], [], []
    nodes = 0
    for _ in range(args.repeat):
        loss = build_loss(model, inputs)
        stepper = BackwardStepper([loss], loss.backward)
        t0 = time.perf_counter()
        thread = start(stepper)
        stepper.wait_paused(60)
        t1 = time.perf_counter()
        stepper.resume()
        stepper.wait_paused(600)
        t2 = time.perf_counter()
        thread.join(60)
        assert stepper.state is StepperState.FINISHED, stepper.state
        nodes = len(stepper.steps)
        setup.append(t1 - t0)
        to_end.append(t2 - t1)

        loss = build_loss(model, inputs)
        t0 = time.perf_counter()
        _, records = step_all([loss], loss.backward)
        headless.append(time.perf_counter() - t0)

    loss = build_loss(model, inputs)
    stepper = BackwardStepper([loss], loss.backward)
    thread = start(stepper)
    stepper.wait_paused(60)
    per_step = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        stepper.step()
        stepper.wait_paused(60)
        per_step.append(time.perf_counter() - t0)
    stepper.stop()
    thread.join(60)

    plain_s = statistics.median(plain)
    per_step.sort()
    print(f"graph: {nodes} executed nodes (residual MLP, {BLOCKS} blocks, batch {BATCH}), torch {torch.__version__}, "
          "1 thread")
    print(f"plain backward:                 {plain_s * 1e3:8.1f} ms (median of {args.repeat})")
    print(f"run() to first pause (setup):   {statistics.median(setup) * 1e3:8.1f} ms")
    print(f"step() to next pause:           median {statistics.median(per_step) * 1e3:.3f} ms, "
          f"p95 {per_step[int(len(per_step) * 0.95)] * 1e3:.3f} ms, max {per_step[-1] * 1e3:.3f} ms "
          f"({args.steps} steps)")
    end = statistics.median(to_end)
    print(f"resume() from first pause:      {end * 1e3:8.1f} ms = {end / plain_s:.1f}x plain backward "
          f"({end / nodes * 1e6:.0f} us/node)")
    head = statistics.median(headless)
    print(f"step_all (setup + run to end):  {head * 1e3:8.1f} ms = {head / plain_s:.1f}x plain backward")
    batch_figures(records, args.repeat)


def batch_figures(records: list[dict], repeat: int) -> None:
    """The Continue batch of ``records`` as JSON: each record with its previews, then packed."""
    import json

    from core.protocol.step_pack import pack_records, unpack_steps

    def plain():
        return {"type": "steps", "call": 0, "records": records}

    def packed():
        rows, previews = pack_records(records)
        return {"type": "steps", "call": 0, "records": rows, "previews": previews}

    figures = {}
    for name, make in (("records", plain), ("packed", packed)):
        enc, dec = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            data = json.dumps(make(), separators=(",", ":"))
            t1 = time.perf_counter()
            unpack_steps(json.loads(data))
            dec.append(time.perf_counter() - t1)
            enc.append(t1 - t0)
        figures[name] = (len(data), statistics.median(enc), statistics.median(dec))
    (size0, enc0, dec0), (size1, enc1, dec1) = figures["records"], figures["packed"]
    print(f"Continue's steps message:       {size0 / 1e6:.2f} -> {size1 / 1e6:.2f} MB ({size1 / size0:.2f}x), "
          f"encode {enc0 * 1e3:.0f} -> {enc1 * 1e3:.0f} ms, decode {dec0 * 1e3:.0f} -> {dec1 * 1e3:.0f} ms "
          f"(each preview once; median of {repeat})")


if __name__ == "__main__":
    main()
