"""Check a worker behind a launcher on an NVIDIA GPU (run on a machine with CUDA).

    python bench/gpu_remote_check.py

1. Starts the worker behind ``sh -c 'exec python -m core.worker'`` (what ssh runs on a host)
   and checks its hello lists every CUDA device with its name and memory, labelled as the
   device picker shows them.
2. Traces the 4,802-node example on cuda:0 through it, compressed, and checks the trace
   arrived whole (nodes, leaf grads, CUDA memory samples) and how long the transfer took.
3. Runs a two-layer DDP script under torchrun (nccl on two GPUs, gloo with one) and checks
   both ranks' reduced gradients are equal and are the mean of their local ones.
4. Sends a ``.pt2`` program through the launcher (the file travels in pieces) and runs it on
   cuda:0: its leaf grads match the same program run by a local worker on cuda:0, and the
   worker's temporary folder holds nothing of the run afterwards.
Exits non-zero when a check fails.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.client.handle import run_capture  # noqa: E402
from core.client.launchers import from_command  # noqa: E402

DDP = """import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("{backend}")
rank = dist.get_rank()
dev = torch.device("cuda", rank % torch.cuda.device_count())
torch.cuda.set_device(dev)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(dev))
torch.manual_seed(100 + rank)
x = torch.randn(32, 8, device=dev)
loss = model(x).pow(2).mean()
loss.backward()
dist.destroy_process_group()
"""


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    ok = True
    launcher = from_command(f"sh -c 'cd {shlex.quote(str(ROOT))} && exec {shlex.quote(sys.executable)} -m core.worker'",
                            name="gpu-host")
    events: list[dict] = []
    t0 = time.perf_counter()
    result = run_capture(str(ROOT / "resources/examples/50_big_residual_mlp.py"), device="cuda:0",
                         launcher=launcher, timeout=600, on_event=events.append)
    elapsed = time.perf_counter() - t0
    hello = next(e for e in events if e.get("type") == "hello")
    from app.session.host_devices import device_label

    cuda = [d for d in hello["devices"] if d["id"].startswith("cuda")]
    for d in cuda:
        print("picker:", device_label("gpu-host", d))
    ok &= len(cuda) == torch.cuda.device_count()
    trace = result.trace
    transfers = [e for e in events if e.get("type") == "transfer"]
    nodes = sum(len(c.nodes) for c in trace.calls)
    print(f"trace on cuda:0 through the launcher: error={trace.error}, {nodes} nodes, "
          f"{len(trace.memory)} memory samples, peak allocated "
          f"{max((s.allocated for s in trace.memory), default=0) / 2**20:.1f} MiB, {elapsed:.1f} s in all")
    if transfers:
        t = transfers[-1]
        print(f"transfer: {t['received']:,} bytes ({t['codec']}) for {t['raw']:,} bytes of JSON")
    ok &= trace.error is None and nodes > 4000 and bool(transfers)
    ok &= any(s.device.startswith("cuda") and s.allocated > 0 for s in trace.memory)

    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "ddp_cuda.py"
        script.write_text(DDP.format(backend=backend))
        result = run_capture(str(script), device="cuda:0", launcher=launcher, timeout=600,
                             ddp={"nproc": 2, "rank": 0})
    trace = result.trace
    if trace.error is not None or not trace.calls:
        print("DDP failed:", trace.error, result.output[-2000:])
        return 1
    ar = trace.calls[0].options.get("all_reduce", {})
    print(f"DDP on {backend}: ranks {sorted(ar.get('ranks', {}))}, marked nodes {ar.get('nodes')}")
    for name, entry in ar.get("params", {}).items():
        r0, r1 = ar["ranks"]["0"][name], ar["ranks"]["1"][name]
        mean = (torch.tensor(r0["local"]["data"]) + torch.tensor(r1["local"]["data"])) / 2 \
            if r0["local"].get("data") else None
        same = r0["reduced"] == r1["reduced"]
        close = mean is None or torch.allclose(torch.tensor(r0["reduced"]["data"]), mean, atol=1e-5)
        print(f"  {name}: reduced equal across ranks {same}, mean of local grads {close}")
        ok &= same and close
    ok &= check_model_upload()
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def check_model_upload() -> bool:
    """A .pt2 sent to the worker runs on cuda:0 with a local worker's grads; nothing stays behind."""
    with tempfile.TemporaryDirectory() as tmp:
        remote_tmp = Path(tmp) / "host-tmp"
        remote_tmp.mkdir()
        launcher = from_command(f"sh -c 'cd {shlex.quote(str(ROOT))} && exec env TMPDIR={shlex.quote(str(remote_tmp))} "
                                f"{shlex.quote(sys.executable)} -m core.worker'", name="gpu-host")
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
        path = Path(tmp) / "mlp.pt2"
        torch.export.save(torch.export.export(model, (torch.randn(16, 64),)), str(path))
        remote = run_capture(str(path), device="cuda:0", launcher=launcher, timeout=600).trace
        local = run_capture(str(path), device="cuda:0", timeout=600).trace
        if remote.error is not None or local.error is not None:
            print(".pt2 on cuda:0 failed:", remote.error or local.error)
            return False
        grads = lambda t: {k: v.data or v.sample for k, v in t.calls[0].leaf_grads.items()}  # noqa: E731
        same = grads(remote) == grads(local)
        left = [p.name for p in remote_tmp.iterdir() if p.name.startswith("backprop-studio-")]
        print(f".pt2 sent to the host, run on cuda:0: grads equal a local cuda:0 run {same}, left on the host {left}")
        return same and not left


if __name__ == "__main__":
    sys.exit(main())
