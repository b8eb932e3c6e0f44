"""Check the memory chart's figures on an NVIDIA GPU (run on a machine with CUDA).

    python bench/gpu_memory_check.py [--device cuda:0]

1. In this process, with the capture and the sampler wired as the worker wires them (per-op
   saved-tensor accounting, zero_grad / step / empty_cache markers): at every backward call the
   sampler's ``allocated`` and ``reserved`` equal ``torch.cuda.memory_allocated`` /
   ``memory_reserved`` read at the same moment.
2. Through the worker, as the app runs it: on the MLP example the saved bytes rise over several
   samples during the first forward pass, before the first backward; a "starting" phase comes first.
3. The caching-allocator example: after ``del`` the cache (reserved - allocated) is positive, and
   the ``empty_cache`` marker is followed by a sample whose reserved is lower.
Exits non-zero when a check fails. Prints what it measured.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.worker.capture.recorder import Capture  # noqa: E402
from core.client.handle import run_capture  # noqa: E402
from core.worker.memory import MemorySampler  # noqa: E402
from core.worker.memory_marks import install_marks, script_line  # noqa: E402
from core.worker.main import apply_device  # noqa: E402

EXAMPLES = ROOT / "resources" / "examples"
MB = 1 << 20


def allocated_and_reserved_at_each_call(device: str) -> bool:
    print(f"== allocated / reserved at each backward call, in this process on {device}")
    ok = True
    for name in ("13_mlp_classifier.py", "30_graph_leak.py", "32_caching_allocator.py"):
        capture = Capture(str(EXAMPLES / name), device=device)
        sampler = MemorySampler(device, rate_hz=50, saved_bytes_fn=capture.live_saved_storages)
        capture.on_node = lambda node, sampler=sampler: sampler.on_node(node)
        rows = []

        def on_event(event, sampler=sampler, rows=rows):
            if event.get("type") == "call":
                sample = sampler.mark("backward", event)
                rows.append((event["index"], sample.allocated, torch.cuda.memory_allocated(device),
                             sample.reserved, torch.cuda.memory_reserved(device)))
            elif event.get("type") == "call_done":
                sampler.mark("between", event)
            elif event.get("type") == "forward":
                sampler.mark("forward", event)

        capture.on_event = on_event
        capture.started = time.perf_counter()
        sampler.origin = capture.started
        apply_device(device)
        remove = install_marks(sampler.note, script_line(capture.names))
        try:
            with sampler:
                capture.run()
        finally:
            remove()
        bad = [r for r in rows if r[1] != r[2] or r[3] != r[4]]
        print(f"{name:<28} {len(rows)} calls checked, {len(bad)} mismatches; first call: allocated "
              f"{rows[0][1] / MB:.2f} MB (torch {rows[0][2] / MB:.2f}), reserved {rows[0][3] / MB:.2f} MB "
              f"(torch {rows[0][4] / MB:.2f})" if rows else f"{name:<28} no calls")
        ok &= bool(rows) and not bad
    return ok


def saved_bytes_rise_during_forward(device: str) -> bool:
    print(f"== saved bytes during the first forward pass, through the worker on {device}")
    trace = run_capture(str(EXAMPLES / "13_mlp_classifier.py"), device=device, timeout=300).trace
    memory = trace.memory
    if not memory:
        print("   no samples")
        return False
    first_op = next((i for i, s in enumerate(memory) if s.phase == "forward"), None)
    first_bwd = next((i for i, s in enumerate(memory) if s.phase == "backward"), None)
    if first_op is None or first_bwd is None:
        print("   no forward or no backward phase")
        return False
    rising = [s.saved_bytes for s in memory[first_op:first_bwd] if s.saved_bytes]
    print(f"   starting first: {memory[0].phase == 'starting'}; saved bytes during forward: {rising}; "
          f"host RSS recorded: {any(s.rss for s in memory)}; device {memory[-1].device}")
    return memory[0].phase == "starting" and len(set(rising)) >= 3 and rising == sorted(rising)


def caching_allocator_gap(device: str) -> bool:
    print(f"== the caching allocator example on {device}")
    trace = run_capture(str(EXAMPLES / "32_caching_allocator.py"), device=device, timeout=300).trace
    print("   " + (trace.output or "").strip().replace("\n", "\n   "))
    memory = trace.memory
    mark = next((i for i, s in enumerate(memory) if s.mark == "empty_cache"), None)
    if mark is None:
        print("   no empty_cache marker")
        return False
    before = max((s.reserved - s.allocated for s in memory[:mark]), default=0)
    after = memory[mark]
    print(f"   largest cache before empty_cache: {before / MB:.1f} MB; at the marker: reserved "
          f"{after.reserved / MB:.1f} MB, allocated {after.allocated / MB:.1f} MB")
    return before > 0 and after.reserved - after.allocated < before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to check")
        return 2
    results = {
        "allocated/reserved at each call": allocated_and_reserved_at_each_call(args.device),
        "saved bytes rise during forward": saved_bytes_rise_during_forward(args.device),
        "caching allocator gap": caching_allocator_gap(args.device),
    }
    for check, passed in results.items():
        print(f"{'PASS' if passed else 'FAIL'}  {check}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
