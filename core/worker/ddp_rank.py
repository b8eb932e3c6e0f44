"""One rank of a DDP script under ``torchrun``: capture it and write its trace to a file.

Started by ``core.worker.ddp`` through ``torch.distributed.run`` (torchrun) ``--nproc_per_node=N -m
core.worker.ddp_rank --out DIR SCRIPT``; a rank ends with the torchrun that started it. Every ``DistributedDataParallel`` the script builds is
watched: a hook on each parameter records the gradient this rank computed *before* the
all-reduce, and after each backward call the call's ``options["all_reduce"]`` holds, per
parameter, that local gradient and the reduced one DDP wrote into ``.grad``, plus the ids of
the ``AccumulateGrad`` nodes whose gradients the all-reduce touches. With ``--nan-check`` each rank
runs the NaN/Inf check (``core.worker.capture.nan_check``) on its own ops and gradients, so each
rank's trace names the first non-finite op and node that rank met.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace

import torch

from core.worker.capture.nan_check import NanCheck
from core.worker.capture.recorder import Capture
from core.worker.capture.values import values_of
from core.worker.ddp import die_with_parent
from core.worker.env import apply_device


class DDPWatch:
    """The DDP modules a script built and each parameter's local gradient per backward call."""

    def __init__(self):
        self.params: list[tuple[str, torch.Tensor]] = []  # (name under the DDP module, parameter)
        self.local: dict[int, torch.Tensor] = {}  # id(param) -> this rank's gradient, last call
        self.per_call: dict[int, dict] = {}  # call index -> {param name: {"local", "reduced"}}
        self.names_in_trace: dict[int, str] = {}  # id(param) -> the name the capture gave it
        self.backend = "gloo"  # the process group's backend, read when DDP wraps a module

    def install(self) -> None:
        from torch.nn.parallel import DistributedDataParallel

        real_init = DistributedDataParallel.__init__
        watch = self

        def __init__(ddp_self, module, *args, **kwargs):
            real_init(ddp_self, module, *args, **kwargs)
            try:
                watch.backend = str(torch.distributed.get_backend(ddp_self.process_group))
            except Exception:
                pass
            for name, p in module.named_parameters():
                if p.requires_grad:
                    watch.params.append((name, p))
                    record = lambda g, key=id(p): watch._record(key, g)  # noqa: E731
                    record._bps_internal = True  # not listed among the script's hooks (core.worker.capture.cuts)
                    p.register_hook(record)

        DistributedDataParallel.__init__ = __init__

    def _record(self, key: int, grad: torch.Tensor) -> None:
        self.local[key] = grad.detach().clone()

    def call_hook(self, capture):
        def hook(index, api, roots, real):
            self.local.clear()
            try:
                return real()
            finally:
                if self.params:
                    entry = {}
                    for name, p in self.params:
                        label = capture.names.name_of(p) or name
                        self.names_in_trace[id(p)] = label
                        local = self.local.get(id(p))
                        entry[label] = {
                            "local": _plain(values_of(local)) if local is not None else None,
                            "reduced": _plain(values_of(p.grad)) if p.grad is not None else None,
                        }
                    self.per_call[index] = entry

        return hook


def _plain(values) -> dict:
    return {k: v for k, v in asdict(values).items() if v is not None}


def mark(trace, per_call: dict, rank: int, world: int, backend: str):
    """The trace with each call's all-reduce recorded in its options."""
    calls = []
    for call in trace.calls:
        params = per_call.get(call.index)
        if not params:
            calls.append(call)
            continue
        names = {t.id: t.name for t in call.tensors}
        nodes = [n.id for n in call.nodes if n.kind == "accumulate_grad" and names.get(n.variable) in params]
        options = dict(call.options)
        options["all_reduce"] = {"backend": backend, "world_size": world, "rank": rank, "op": "average",
                                 "nodes": nodes, "params": params}
        calls.append(replace(call, options=options))
    return replace(trace, calls=calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="core.worker.ddp_rank")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--load", default=None, help="JSON: how to open the file (weights, input_shapes)")
    parser.add_argument("--nan-check", action="store_true", help="check each op's output and each gradient")
    parser.add_argument("script")
    args = parser.parse_args(argv)
    die_with_parent()  # torchrun starts ranks in sessions of their own: one ending ends them
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = args.device
    if device.startswith("cuda") and torch.cuda.is_available():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}"
    apply_device(device)
    watch = DDPWatch()
    watch.install()
    capture = Capture(args.script, device=device, mode=args.mode, load=json.loads(args.load) if args.load else None)
    capture.call_hook = watch.call_hook(capture)
    if args.nan_check:  # off, the capture pushes no check mode and hooks no node
        capture.nan_check = NanCheck()
    trace = capture.run()
    trace = mark(trace, watch.per_call, rank, world, watch.backend)
    path = os.path.join(args.out, f"rank{rank}.json")
    trace.save(path + ".part")
    os.replace(path + ".part", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
