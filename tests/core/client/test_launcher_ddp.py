"""DDP scripts behind a launcher: two ranks on gloo, a model file with weights, and ending a run
ends torchrun and every rank."""

from __future__ import annotations

import psutil
import pytest
import torch

from core.client.handle import run_capture
from core.model.trace import Trace
from tests.core.client.test_launchers import (  # noqa: F401  (the launcher and sshd fixtures)
    launcher, marked_processes, run_then, sshd, write)


@pytest.mark.slow
def test_ddp_two_ranks_on_gloo(tmp_path):
    from tests.core.client.test_ranks import DDP_SCRIPT, local_grads

    script = write(tmp_path, "ddp_linear.py", DDP_SCRIPT)
    events = []
    result = run_capture(str(script), timeout=120, ddp={"nproc": 2, "rank": 1}, on_event=events.append)
    trace = result.trace
    assert trace.error is None, (trace.error, result.output[-2000:])
    (call,) = trace.calls
    (other,) = [e for e in events if e.get("type") == "rank_trace"]
    assert other.rank == 0 and isinstance(other.trace, Trace)  # sent in columns, read on arrival
    assert other.trace.calls[0].options["all_reduce"]["rank"] == 0
    assert other.trace.calls[0].leaf_grads == call.leaf_grads  # equal on every rank after the all-reduce
    ar = call.options["all_reduce"]
    assert ar["rank"] == 1 and ar["world_size"] == 2 and ar["backend"] == "gloo"
    assert sorted(ar["ranks"]) == ["0", "1"]  # both ranks captured
    local = local_grads()  # each rank's local gradient computed here
    for name in ("module.weight", "module.bias"):
        for r in ("0", "1"):
            got_local = torch.tensor(ar["ranks"][r][name]["local"]["data"])
            assert torch.allclose(got_local, local[int(r)][name], atol=1e-6)
        reduced0 = ar["ranks"]["0"][name]["reduced"]["data"]
        reduced1 = ar["ranks"]["1"][name]["reduced"]["data"]
        assert reduced0 == reduced1  # equal on every rank after the all-reduce
        mean = (local[0][name] + local[1][name]) / 2
        assert torch.allclose(torch.tensor(reduced1), mean, atol=1e-6)
        assert call.leaf_grads[name].data == reduced1
    # The all-reduce is marked on the AccumulateGrad nodes of both parameters.
    marked = {n.id for n in call.nodes if n.kind == "accumulate_grad"}
    assert set(ar["nodes"]) == marked and len(marked) == 2


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stop", "time limit"])
def test_ending_a_ddp_run_ends_torchrun_and_every_rank(launcher, tmp_path, how):
    """torchrun starts each rank in a session of its own, so no signal to a process group
    reaches them. Stop ends the worker's wait for torchrun at once and ends torchrun; a worker
    killed outright (what the time limit does after the stacks) takes torchrun with it; either
    way the ranks end with torchrun (``core.worker.ddp.die_with_parent``). Before, Stop waited in
    ``waitpid`` until the app killed the worker, and both left torchrun and its ranks running."""
    from tests.core.client.test_ranks import DDP_SCRIPT

    launcher, mark = launcher
    script = write(tmp_path, "ddp_loop.py", DDP_SCRIPT.replace(
        "dist.destroy_process_group()\n",
        "dist.barrier()\nif rank == 0:\n    print('both ranks looping', flush=True)\n"
        "import time\nwhile True:\n    time.sleep(0.05)\n"))
    started = []

    def end(client):
        started.extend(p for p in marked_processes(mark) if "ddp_rank" in " ".join(p.cmdline()))
        torchrun = [p for p in started if "torch.distributed.run" in " ".join(p.cmdline())]
        assert len(torchrun) == 1 and len(started) == 3  # torchrun and its 2 ranks
        if how == "stop":
            client.cancel()
        else:
            client._timed_out(client._run["id"], 120)

    err = run_then(launcher, script, "both ranks looping", end, timeout=120, ddp={"nproc": 2, "rank": 0})
    if how == "stop":  # the worker stopped the run itself, not the app's kill after the grace
        assert (err.type, err.kind, err.message) == ("KeyboardInterrupt", "cancelled", "stopped by you")
    else:
        assert err.kind == "timeout" and err.message.startswith("the run passed its time limit of 120 s")
    gone, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


@pytest.mark.slow
def test_ddp_model_file_with_weights(tmp_path):
    """``--weights`` reaches every rank: the reduced grads are those of the file's weights."""
    from safetensors.torch import save_file

    script = write(tmp_path, "ddp_model.py", (
        "import torch, torch.distributed as dist, torch.nn as nn\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
        "model = DDP(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)))\n"
        "example_input = torch.ones(4, 3) * (1 + dist.get_rank())\n"))
    torch.manual_seed(5)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    save_file({f"module.{k}": v for k, v in ref.state_dict().items()}, str(tmp_path / "w.safetensors"))
    result = run_capture(str(script), timeout=120, ddp={"nproc": 2, "rank": 1},
                         load={"weights": str(tmp_path / "w.safetensors")})
    assert result.trace.error is None, (result.trace.error, result.output[-2000:])
    got = {k: torch.tensor(v.data) for k, v in result.trace.calls[0].leaf_grads.items()}
    per_rank = []
    for rank in (0, 1):
        ref.zero_grad()
        ref(torch.ones(4, 3) * (1 + rank)).sum().backward()
        per_rank.append({f"module.{k}": p.grad.flatten().clone() for k, p in ref.named_parameters()})
    assert sorted(got) == ["module.0.bias", "module.0.weight", "module.1.bias", "module.1.weight"]
    for name, grad in got.items():
        assert torch.allclose(grad, (per_rank[0][name] + per_rank[1][name]) / 2, atol=1e-6), name


NAN_ON_RANK_1 = (
    "import torch, torch.distributed as dist, torch.nn as nn\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "dist.init_process_group('gloo')\nrank = dist.get_rank()\ntorch.manual_seed(0)\n"
    "model = DDP(nn.Linear(3, 2))\nx = torch.randn(4, 3)\n"
    "y = model(x).pow(2).mean()\n"
    "loss = torch.log(y * (rank != 1))\n"  # line 9: log(0) on rank 1 only
    "loss.backward()\ndist.destroy_process_group()\n")


@pytest.mark.slow
def test_the_nan_check_runs_on_every_rank(tmp_path):
    script = write(tmp_path, "ddp_nan.py", NAN_ON_RANK_1)
    events = []
    result = run_capture(str(script), timeout=120, ddp={"nproc": 2, "rank": 1}, on_event=events.append,
                         nan_check=True)
    rank1 = result.trace
    assert rank1.error is None, (rank1.error, result.output[-2000:])
    (other,) = [e for e in events if e.get("type") == "rank_trace"]
    rank0 = other.trace
    found = rank1.nan_check["forward"]
    assert (found["op"], found["line"], found["neginf"], found["numel"]) == ("log", 9, 1, 1)
    assert rank1.nan_check["backward"]["name"] == "LogBackward0"
    assert rank1.nan_check["backward"]["line"] == 9
    # rank 0 took the log of a positive mean: nothing non-finite in its forward
    assert rank0.nan_check is not None and rank0.nan_check["forward"] is None
