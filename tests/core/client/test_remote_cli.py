"""Headless commands on a host: ``hosts`` saves them, ``--host`` / ``--worker-command`` pick one,
and wrong options are refused naming the option."""

import json
import os
import shlex
import sys

import pytest
import torch

from app.cli.commands import main
from core.protocol import wire
from core.client.process import ROOT

PY = sys.executable
WORKER = f"sh -c 'cd {shlex.quote(str(ROOT))} && exec {shlex.quote(PY)} -m core.worker'"


@pytest.fixture(autouse=True)
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))


def test_hosts_add_list_remove(capsys):
    assert main(["hosts"]) == 0
    assert "no saved hosts" in capsys.readouterr().out
    assert main(["hosts", "add", "gpu-box", "me@gpu-box", "--python", "/opt/venv/bin/python"]) == 0
    assert main(["hosts", "add", "lab", "--worker-command", WORKER]) == 0
    capsys.readouterr()
    assert main(["hosts"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gpu-box (") and out[0].endswith("me@gpu-box /opt/venv/bin/python, the worker's code sent)")
    assert out[1].startswith("lab (sh -c ")
    assert main(["hosts", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == out
    assert main(["hosts", "remove", "gpu-box"]) == 0
    assert main(["hosts", "remove", "gpu-box"]) == 2
    assert "no saved host is named 'gpu-box'" in capsys.readouterr().out


@pytest.mark.slow
def test_hosts_check_reports_each_worker_or_why_not(capsys):
    assert main(["hosts", "check"]) == 2
    assert "no saved hosts to check" in capsys.readouterr().out
    assert main(["hosts", "add", "lab", "--worker-command", WORKER]) == 0
    assert main(["hosts", "add", "gone", "--worker-command", "sh -c 'echo no route to gone >&2; exit 255'"]) == 0
    capsys.readouterr()
    assert main(["hosts", "check", "lab"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"lab: starting {WORKER}"
    assert out[1].startswith("lab: ready in ") and out[1].endswith(
        f"Python {sys.version.split()[0]}, torch {torch.__version__}, protocol 5, compresses traces with "
        + " or ".join(wire.available_codecs()))
    assert "  lab: cpu (CPU)" in out[2:]
    assert main(["hosts", "check"]) == 1  # every saved host: lab comes up, gone does not
    out = capsys.readouterr().out
    assert "lab: ready in " in out
    assert "gone: failed after " in out
    assert out.rstrip().endswith("s: the worker on gone did not start: sh exited with code 255: no route to gone")
    assert main(["hosts", "check", "two words"]) == 2
    assert "hosts check: --host 'two words': no saved host has that name" in capsys.readouterr().err


def test_check_report_names_devices_that_cannot_be_used():
    from app.cli.hosts import check_report
    from core.protocol.messages import Hello

    hello = Hello(host="gpu01", python="3.12.3", torch="2.13.0", protocol=4, codecs=["zlib"], devices=[
        {"id": "cuda", "name": "CUDA unavailable: the driver is too old", "kind": "error"},
        {"id": "cuda:0", "name": "NVIDIA H100", "kind": "cuda", "total_memory": 80 * 2**30},
        {"id": "cpu", "name": "CPU", "kind": "cpu"}])
    assert check_report("gpu-box", hello, 2.34) == [
        "gpu-box: ready in 2.3 s: on gpu01, Python 3.12.3, torch 2.13.0, protocol 4, compresses traces with zlib",
        "  gpu-box: CUDA unavailable: the driver is too old",
        "  gpu-box: cuda:0 (NVIDIA H100, 80 GB)",
        "  gpu-box: cpu (CPU)"]


@pytest.mark.slow
def test_trace_on_a_saved_host(tmp_path, capsys):
    script = tmp_path / "square.py"
    script.write_text("import torch\nx = torch.tensor(3.0, requires_grad=True)\ny = x * x\ny.backward()\n")
    assert main(["hosts", "add", "lab", "--worker-command", WORKER]) == 0
    out_json = tmp_path / "t.json"
    assert main(["trace", str(script), "--host", "lab", "--json", str(out_json), "--compress", "zlib"]) == 0
    out = capsys.readouterr().out
    assert "x.grad = 6" in out
    doc = json.loads(out_json.read_text())
    assert doc["script"] == str(script.resolve()) and doc["calls"][0]["leaf_grads"]["x"]["data"] == [6.0]


@pytest.mark.parametrize("argv, message", [
    (["--host", "a", "--worker-command", "b"], "--host and --worker-command: give one of them"),
    (["--remote-cwd", "/data"], "--remote-cwd, --send-folder and --compress need --host or --worker-command"),
    (["--nproc", "2", "--rank", "2"], "--rank 2: ranks run from 0 to 1"),
    (["--worker-command", "ssh 'box"], "--worker-command: No closing quotation"),
    (["--host", "two words"], "--host 'two words': no saved host has that name"),
])
def test_bad_worker_options_are_named(tmp_path, capsys, argv, message):
    script = tmp_path / "s.py"
    script.write_text("x = 1\n")
    assert main(["trace", str(script), *argv]) == 2
    assert message in capsys.readouterr().err


def test_all_reduce_summary_lists_each_rank():
    from app.cli.summary import all_reduce_summary

    ar = {"backend": "gloo", "world_size": 2, "rank": 0, "op": "average", "nodes": ["n3"],
          "params": {"fc.bias": {"local": {"numel": 2, "data": [1.0, 3.0]}, "reduced": {"numel": 2, "data": [2.0, 2.0]}}},
          "ranks": {"0": {"fc.bias": {"local": {"numel": 2, "data": [1.0, 3.0]}}},
                    "1": {"fc.bias": {"local": {"numel": 2, "data": [3.0, 1.0]}}}}}
    assert all_reduce_summary(ar) == [
        "  all-reduce (gloo, 2 ranks, average; this is rank 0) on 1 parameter(s)",
        "    fc.bias rank 0 local grad = [1, 3]",
        "    fc.bias rank 1 local grad = [3, 1]",
        "    fc.bias after all-reduce = [2, 2]",
    ]
    assert all_reduce_summary(None) == []


@pytest.mark.slow
def test_trace_json_of_a_ddp_run_writes_every_rank(tmp_path, capsys):
    """``trace --nproc 2 --rank 1 --json OUT``: OUT holds rank 1's trace, ``OUT.rank0.json`` rank 0's,
    each with its own local gradients and the same reduced ones."""
    from tests.core.client.test_ranks import DDP_SCRIPT, local_grads

    script = tmp_path / "ddp_linear.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / "run.json"
    assert main(["trace", str(script), "--nproc", "2", "--rank", "1", "--json", str(out), "--quiet"]) == 0
    other = tmp_path / "run.rank0.json"
    assert f"traces of 2 ranks written: {out}, {other}" in capsys.readouterr().out
    from core.model.trace_json import load_trace

    by_rank = {}
    for path in (out, other):
        (call,) = load_trace(path).calls
        by_rank[call.options["all_reduce"]["rank"]] = call
    assert sorted(by_rank) == [0, 1]
    local = {r: grads["module.bias"] for r, grads in local_grads().items()}
    for r, call in by_rank.items():
        ar = call.options["all_reduce"]
        got = torch.tensor(ar["ranks"][str(r)]["module.bias"]["local"]["data"])
        assert torch.allclose(got, local[r], atol=1e-6)  # each file is its own rank's
        assert torch.allclose(torch.tensor(call.leaf_grads["module.bias"].data), (local[0] + local[1]) / 2,
                              atol=1e-6)
    assert by_rank[0].leaf_grads["module.bias"].data == by_rank[1].leaf_grads["module.bias"].data


@pytest.mark.slow
def test_stepping_a_ddp_script_runs_it_as_one_process(tmp_path, capsys):
    """Debug and step pause the script in the worker itself: a DDP script set for torchrun runs as
    rank 0 of a world of 1 there, its process group starts, and every step and grad is rank 0's own;
    the environment is back as it was afterwards."""
    script = tmp_path / "ddp_linear.py"
    script.write_text((
        "import torch, torch.distributed as dist, torch.nn as nn\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo')\nrank = dist.get_rank()\ntorch.manual_seed(0)\n"
        "model = DDP(nn.Linear(3, 2))\ntorch.manual_seed(100 + rank)\nx = torch.randn(4, 3)\n"
        "print('world', dist.get_world_size(), 'rank', rank)\n"
        "loss = model(x).pow(2).mean()\nloss.backward()\ndist.destroy_process_group()\n"))
    out_json = tmp_path / "steps.json"
    assert main(["step", str(script), "--nproc", "2", "--json", str(out_json)]) == 0
    err = capsys.readouterr().err
    assert "as one process, rank 0 of a world of 1" in err and "'trace --nproc 2' captures every rank" in err
    doc = json.loads(out_json.read_text())
    assert doc["state"] == "finished" and [s["name"] for s in doc["steps"]] == [
        "MeanBackward0", "PowBackward0", "AddmmBackward0", "AccumulateGrad", "TBackward0", "AccumulateGrad"]
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    torch.manual_seed(100)
    gw, gb = torch.autograd.grad(ref(torch.randn(4, 3)).pow(2).mean(), (ref.weight, ref.bias))
    assert torch.allclose(torch.tensor(doc["leaf_grads"]["module.weight"]["data"]), gw.reshape(-1), atol=1e-6)
    assert torch.allclose(torch.tensor(doc["leaf_grads"]["module.bias"]["data"]), gb.reshape(-1), atol=1e-6)
    # The worker's own environment around the run, set and restored.
    from core.worker import ddp

    os.environ["WORLD_SIZE"] = "7"  # already set: kept
    try:
        with ddp.world_of_one():
            assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "7"
            assert int(os.environ["MASTER_PORT"]) > 0 and os.environ["MASTER_ADDR"] == "127.0.0.1"
        assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ and os.environ["WORLD_SIZE"] == "7"
    finally:
        del os.environ["WORLD_SIZE"]


def test_every_option_a_help_text_names_exists(capsys):
    """The help of each command names options (``hosts``: "--worker-command for any other
    launcher"); each one it names is an option some command has."""
    import re

    paths = [[], ["trace"], ["step"], ["export"], ["hosts"], ["hosts", "add"], ["hosts", "check"], ["hosts", "list"],
             ["hosts", "remove"]]
    texts = {}
    for path in paths:
        with pytest.raises(SystemExit) as done:
            main(path + ["--help"])
        assert done.value.code == 0
        texts[" ".join(path)] = capsys.readouterr().out
    defined = set()
    for text in texts.values():  # an option's own line in the list: "  --name VALUE  what it does"
        defined.update(re.findall(r"^\s+(?:-\w(?: \S+)?, )?(--[a-z][a-z-]*)", text, re.M))
    assert {"--worker-command", "--remote-cwd", "--timeout", "--json"} <= defined
    for where, text in texts.items():
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))
        assert named <= defined, (where, named - defined)
