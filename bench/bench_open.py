"""Opening notebooks and saved models, and show(), measured in one run.

Run: python bench/bench_open.py. Prints, on the 4,802-node residual MLP:
- show(loss): capturing the graph in the caller's process (no backward) against the plain
  forward that built it;
- the same model opened as a torch.export program (.pt2) against its model file (.py), both
  captured in this process (forward, loss, backward);
and the time to turn a 400-cell notebook into one script. Times are CPU time of this
process (one torch thread), so other work on a shared machine does not inflate them.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from core.worker.capture.recorder import capture_script  # noqa: E402
from core.programs.notebook import notebook_script  # noqa: E402
from core.worker.capture.tensor_capture import capture_tensor  # noqa: E402

MODEL_PY = """\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        nn.init.normal_(self.fc.weight, std=0.1 / 800)

    def forward(self, hidden):
        return hidden + torch.relu(self.fc(hidden))


class ResidualMLP(nn.Module):
    def __init__(self, width=64, num_blocks=800):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(num_blocks))

    def forward(self, hidden):
        for block in self.blocks:
            hidden = block(hidden)
        return hidden


torch.manual_seed(0)
model = ResidualMLP()
example_input = torch.randn(8, 64)
"""


def best(fn, repeat=3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="bench-open-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the folder goes when the bench ends, however
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))  # torch.export's cache: here too
    script = folder / "residual.py"
    script.write_text(MODEL_PY, encoding="utf-8")
    ns: dict = {}
    exec(compile(MODEL_PY, str(script), "exec"), ns)
    model, x = ns["model"], ns["example_input"]

    forward = best(lambda: model(x).pow(2).mean())
    loss = model(x).pow(2).mean()
    frame = sys._getframe()
    shown = best(lambda: capture_tensor(loss, frame))
    nodes = capture_tensor(loss, frame).calls[0].node_count
    print(f"show(loss) on {nodes:,} nodes: {shown * 1000:.0f} ms capture vs {forward * 1000:.0f} ms forward "
          f"({shown / forward:.1f}x)")

    pt2 = folder / "residual.pt2"
    t0 = time.process_time()
    torch.export.save(torch.export.export(model, (x,)), str(pt2))
    saved = time.process_time() - t0
    as_py = best(lambda: capture_script(str(script)), repeat=2)
    as_pt2 = best(lambda: capture_script(str(pt2)), repeat=2)
    trace = capture_script(str(pt2))
    print(f"opened as .pt2: {as_pt2:.2f} s vs its .py model file {as_py:.2f} s ({as_pt2 / as_py:.2f}x); "
          f"{trace.calls[0].node_count:,} nodes; export + save took {saved:.1f} s once")

    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
              "source": [f"x{i}_{j} = {j}\n" for j in range(9)] + ["%time pass\n"]} for i in range(400)]
    nb = folder / "big.ipynb"
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    times = [best(lambda: notebook_script(nb), repeat=1) for _ in range(5)]
    lines = len(notebook_script(nb).source.splitlines())
    print(f"400-cell notebook to script ({lines:,} lines): {statistics.median(times) * 1000:.1f} ms")
    for p in folder.iterdir():
        os.unlink(p)
    folder.rmdir()


if __name__ == "__main__":
    main()
