"""Check that notebooks and saved models open on an NVIDIA GPU (run on a machine with CUDA).

    python bench/gpu_check_open.py [--device cuda:0]

Opens, through the worker process as the app does, a notebook that picks its device with
``torch.cuda.is_available()``, a ``torch.export`` program and a TorchScript archive, each on
the GPU and on the CPU, and checks that every leaf grad agrees (float tolerance) and that the
captured tensors were on the GPU. Exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.client.handle import run_capture  # noqa: E402

NOTEBOOK_CELLS = [
    "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
    "torch.manual_seed(0)\nw = torch.randn(64, 32, device=device, requires_grad=True)\n"
    "x = torch.randn(16, 64, device=device)",
    "loss = torch.tanh(x @ w).pow(2).mean()\nloss.backward()",
]


def grads(trace) -> dict:
    if trace.error is not None:
        raise RuntimeError(f"{trace.error.type}: {trace.error.message}")
    out = {}
    for call in trace.calls:
        for name, values in call.leaf_grads.items():
            out[name] = values.data if values.data is not None else values.sample
    return out


def devices_of(trace) -> set:
    return {t.device for call in trace.calls for t in call.tensors}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs an NVIDIA GPU")
        return 2
    folder = Path(tempfile.mkdtemp(prefix="gpu-open-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the folder goes when the check ends, however
    nb = folder / "lesson.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                         "source": src} for src in NOTEBOOK_CELLS],
                              "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(4, 32)
    torch.export.save(torch.export.export(model, (x,)), str(folder / "mlp.pt2"))
    torch.jit.script(model).save(str(folder / "mlp.ts"))
    cases = [("notebook", nb, None), ("torch.export", folder / "mlp.pt2", None),
             ("TorchScript", folder / "mlp.ts", {"input_shapes": "4,32"})]
    ok = True
    for label, path, load in cases:
        on_gpu = run_capture(str(path), device=args.device, timeout=300, load=load).trace
        on_cpu = run_capture(str(path), device="cpu", timeout=300, load=load).trace
        try:
            g_gpu, g_cpu = grads(on_gpu), grads(on_cpu)
        except RuntimeError as exc:
            print(f"{label:<14} FAILED: {exc}")
            ok = False
            continue
        same = g_gpu.keys() == g_cpu.keys() and all(
            torch.allclose(torch.tensor(g_gpu[k]), torch.tensor(g_cpu[k]), rtol=1e-3, atol=1e-5) for k in g_cpu)
        gpu_used = any(d.startswith("cuda") for d in devices_of(on_gpu))
        print(f"{label:<14} {len(g_cpu)} leaf grads, same as on CPU: {same}; tensors on {sorted(devices_of(on_gpu))}")
        ok = ok and same and gpu_used
    print("ALL OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
