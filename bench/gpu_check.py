"""Check memory capture and stepping on an NVIDIA GPU (run on a machine with CUDA).

    python bench/gpu_check.py [--device cuda:0]

1. Runs bundled examples on the GPU in this process with the capture and the memory
   sampler, and prints, at every backward call, the sampler's figures next to
   ``torch.cuda.memory_allocated`` / ``memory_reserved`` read directly at the same moment.
2. Runs the same examples through the worker process (as the app does) and prints the peak
   allocated memory it reports.
3. Steps backward of an MLP on the GPU node by node and checks that allocated memory and
   the saved-tensor bytes of the graph fall as nodes release their saved tensors.
4. Runs GPT-2 small (4 x 128 tokens, needs ``transformers``) and a 1,200-block residual MLP
   bare and under capture, each in a fresh process, and checks that the peak
   ``torch.cuda.max_memory_allocated()`` under capture is within 5 % of the bare run's.
Every sampled ``allocated`` must equal ``torch.cuda.memory_allocated()`` read at the same
call, and CUDA samples must carry the host RSS. Exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.protocol.messages import StepperState  # noqa: E402
from core.worker.capture.recorder import Capture  # noqa: E402
from core.client.handle import run_capture  # noqa: E402
from core.worker.memory import MemorySampler  # noqa: E402
from core.worker.saved_bytes import saved_tensor_bytes  # noqa: E402
from core.worker.stepper import BackwardStepper  # noqa: E402
from core.worker.main import apply_device  # noqa: E402

EXAMPLES = ["01_multiply.py", "13_mlp_classifier.py", "30_graph_leak.py", "40_model_small_cnn.py",
            "50_big_residual_mlp.py"]
MB = 1 << 20


def in_process(device: str) -> bool:
    ok = True
    print(f"== capture + sampler in this process on {device}")
    print(f"{'example':<28}{'call':>5}{'sampler alloc MB':>18}{'direct alloc MB':>17}{'reserved MB':>13}"
          f"{'saved MB':>10}")
    for name in EXAMPLES:
        rows = []
        capture = Capture(str(ROOT / "resources" / "examples" / name), device=device)
        sampler = MemorySampler(device, rate_hz=50, saved_bytes_fn=capture.live_saved_bytes)

        def on_event(event, sampler=sampler, rows=rows):
            if event.get("type") == "call":
                sample = sampler.mark("backward", event)
                rows.append((event["index"], sample.allocated, torch.cuda.memory_allocated(device),
                             sample.reserved, sample.saved_bytes))
            elif event.get("type") == "call_done":
                sampler.mark("between", event)

        capture.on_event = on_event
        capture.started = time.perf_counter()
        sampler.origin = capture.started
        apply_device(device)
        with sampler:
            trace = capture.run()
        for index, alloc, direct, reserved, saved in rows[:3] + rows[-1:]:
            print(f"{name:<28}{index:>5}{alloc / MB:>18.2f}{direct / MB:>17.2f}{reserved / MB:>13.2f}"
                  f"{saved / MB:>10.2f}")
        for index, alloc, direct, *_ in rows:  # every call, not only the printed ones
            if alloc != direct:
                print(f"   MISMATCH at call {index}: the sampler read {alloc} bytes, "
                      f"torch.cuda.memory_allocated {direct}")
                ok = False
        if sampler.samples and not all(s.rss > 0 for s in sampler.samples):
            print("   MISSING host RSS in CUDA samples")
            ok = False
        if trace.error and name not in ("08_inplace_error.py",):
            print(f"   script error: {trace.error.type}: {trace.error.message}")
        peak = max((s.max_allocated for s in sampler.samples), default=0)
        print(f"{'':<28}  {len(sampler.samples)} samples, peak allocated {peak / MB:.2f} MB")
    return ok


def through_worker(device: str) -> bool:
    print(f"== through the worker process on {device}")
    ok = True
    for name in EXAMPLES:
        result = run_capture(str(ROOT / "resources" / "examples" / name), device=device, timeout=300)
        trace = result.trace
        samples = trace.memory
        peak = max((s.max_allocated for s in samples), default=0)
        devices = {s.device for s in samples}
        print(f"{name:<28} {trace.call_count:>4} calls  {len(samples):>5} samples  devices {sorted(devices)}  "
              f"peak allocated {peak / MB:.2f} MB  error: {trace.error.type if trace.error else None}")
        if not samples or not any(d.startswith("cuda") for d in devices):
            ok = False
    return ok


def stepping_frees(device: str) -> bool:
    print(f"== stepping backward on {device}: saved tensors released node by node")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(device)
    x = torch.randn(2048, 1024, device=device)
    loss = model(x).pow(2).mean()
    roots = [loss.grad_fn]
    before_saved = saved_tensor_bytes(roots)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    rows = []

    def on_step(record):
        torch.cuda.synchronize(device)
        rows.append((record["index"], record["name"], torch.cuda.memory_allocated(device), saved_tensor_bytes(roots)))

    stepper = BackwardStepper([loss], lambda: loss.backward(), on_step=on_step)
    thread = threading.Thread(target=stepper.run)
    thread.start()
    while True:
        pending = stepper.wait_paused(timeout=30)
        if pending is None:
            break
        stepper.step()
    thread.join(timeout=60)
    print(f"before backward: allocated {before / MB:.1f} MB, saved tensors {before_saved / MB:.1f} MB")
    for index, name, alloc, saved in rows:
        print(f"  step {index:>2} {name:<22} allocated {alloc / MB:8.1f} MB   saved {saved / MB:8.1f} MB")
    ok = stepper.state is StepperState.FINISHED and rows and rows[-1][3] == 0 and before_saved > 0
    drops = sum(1 for a, b in zip(rows, rows[1:]) if b[3] < a[3])
    print(f"saved bytes fell at {drops} steps, to {rows[-1][3] if rows else '?'}; state {stepper.state}: "
          f"{'OK' if ok else 'FAILED'}")
    return bool(ok)


def debug_run(device: str) -> bool:
    """A debug run on the GPU: pause at the call, step two nodes, continue; grads match the trace."""
    import atexit
    import queue
    import shutil
    import tempfile

    from core.client.handle import WorkerClient

    print(f"== a debug run on {device}: paused at backward, stepped in place")
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the folder goes when the check ends, however
    script = folder / "debugged.py"
    script.write_text("import torch\n"
                      "dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
                      "w = torch.randn(256, 256, device=dev, requires_grad=True)\n"
                      "x = torch.randn(64, 256, device=dev)\n"
                      "loss = (x @ w).relu().pow(2).mean()\n"
                      "loss.backward()\n")
    events: queue.Queue = queue.Queue()
    client = WorkerClient(events.put, prestart=False)
    steps: list[dict] = []
    try:
        client.run(str(script), device=device, debug={"pause_all": True})
        presses = 0
        while True:
            e = events.get(timeout=120)
            kind = e.get("type")
            if kind == "step":
                steps.append(e["record"])
            elif kind == "step_paused":
                presses += 1
                client.control("step" if presses <= 2 else "continue")
            elif kind == "finished":
                trace = e["result"].trace
                break
    finally:
        client.close()
    call = trace.calls[0] if trace.calls else None
    stepped = next((s["leaf_grads"]["w"] for s in steps if "w" in (s.get("leaf_grads") or {})), None)
    ok = call is not None and trace.error is None and stepped is not None and \
        stepped.get("sample") == call.leaf_grads["w"].sample
    print(f"{len(steps)} steps, error {trace.error.type if trace.error else None}, "
          f"stepped w.grad sample equals the trace's: {ok}")
    return ok


PEAK_SCRIPTS = [  # script, extra environment
    ("bench/scripts/gpt2_small.py", {"GPT2_BATCH": "4x128"}),
    ("bench/scripts/residual_mlp.py", {"RESIDUAL_BLOCKS": "1200"}),
]
PEAK_CODE = """\
import sys, runpy, torch
sys.path.insert(0, {root!r})
if {captured!r}:
    from core.worker.capture.recorder import Capture
    trace = Capture({script!r}, device={device!r}).run()
    assert trace.error is None, trace.error.message
else:
    runpy.run_path({script!r}, run_name="__main__")
torch.cuda.synchronize()
print("PEAK", torch.cuda.max_memory_allocated())
"""


def peak_of(script: str, device: str, env: dict, captured: bool) -> int:
    code = PEAK_CODE.format(root=str(ROOT), script=str(ROOT / script), device=device, captured=captured)
    run_env = dict(os.environ, HF_HUB_OFFLINE="1", BACKPROP_STUDIO_DEVICE=device, **env)
    proc = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("PEAK "):
            return int(line.split()[1])
    raise RuntimeError(f"{script} failed:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")


def peak_memory(device: str) -> bool:
    print(f"== peak CUDA memory, bare against captured, each in a fresh process on {device}")
    ok = True
    for script, env in PEAK_SCRIPTS:
        if "gpt2" in script and subprocess.run([sys.executable, "-c", "import transformers"]).returncode != 0:
            print(f"{script:<34} skipped: transformers is not installed")
            continue
        bare = peak_of(script, device, env, captured=False)
        captured = peak_of(script, device, env, captured=True)
        ratio = captured / bare if bare else float("inf")
        good = ratio <= 1.05
        ok &= good
        print(f"{script:<34} bare {bare / MB:9.1f} MB   captured {captured / MB:9.1f} MB   "
              f"{(ratio - 1) * 100:+.1f} %  {'OK' if good else 'OVER 5 %'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs an NVIDIA GPU")
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(args.device)}")
    results = [in_process(args.device), through_worker(args.device), stepping_frees(args.device),
               debug_run(args.device), peak_memory(args.device)]
    print("ALL OK" if all(results) else "SOME CHECKS FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
