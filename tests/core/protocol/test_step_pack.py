"""Continue sends each gradient preview once; the app gets back the records the stepper made.
Stepping uses a short GIL switch interval, and gives the default back when it ends."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import torch

from core.protocol.step_pack import pack_records, unpack_steps
from core.worker.stepper import BackwardStepper
from core.protocol.switch_interval import STEP_SWITCH_S, quick_switch, stepping_switch


def _continued_records():
    """A 3-block MLP stepped with Continue: previews of more than 8 values are light and shared."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 1))
    loss = net(torch.randn(5, 4)).pow(2).mean()
    names = {id(p): n for n, p in net.named_parameters()}
    stepper = BackwardStepper([loss], loss.backward, names=lambda t: names.get(id(t)))
    stepper.resume()
    stepper.run()
    return stepper.steps, net


def _wire(msg: dict) -> dict:
    return json.loads(json.dumps(msg, separators=(",", ":")))


def test_packed_batch_unpacks_to_the_records_the_stepper_made():
    records, net = _continued_records()
    before = json.dumps(records)
    packed, previews = pack_records(records)
    assert json.dumps(records) == before  # the stepper's own records are left as they were
    refs = sum(len(r.get("grad_outputs") or []) + len(r.get("grad_inputs") or []) + len(r.get("leaf_grads") or {})
               for r in records)
    # a node's incoming gradient is the one the node before it sent: one preview for both
    assert len(previews) < refs
    tanh = next(i for i, r in enumerate(records) if r["name"] == "TanhBackward0")
    produced_by = next(r for r in records[:tanh] if records[tanh]["grad_outputs"][0] in r["grad_inputs"])
    assert produced_by["name"] == "AddmmBackward0"
    got = unpack_steps(_wire({"type": "steps", "call": 0, "records": packed, "previews": previews}))
    assert "previews" not in got
    assert got["records"] == records
    # shared again in the app: the Tanh's incoming preview is the Addmm's outgoing one
    back = got["records"]
    at = records[tanh]
    assert any(back[tanh]["grad_outputs"][0] is g for r in back[:tanh] for g in r["grad_inputs"])
    # leaf grads keep every value, equal to what the engine left in .grad
    leaves = {k: v for r in back for k, v in r["leaf_grads"].items()}
    assert leaves["0.weight"]["data"] == net[0].weight.grad.flatten().tolist()
    assert leaves["4.bias"]["data"] == net[4].bias.grad.tolist()
    assert at["grad_outputs"][0]["numel"] == 5 * 16


def test_unpack_leaves_old_batches_and_survives_bad_positions():
    old = {"type": "steps", "call": 0, "records": [{"node": "n0", "grad_inputs": [{"numel": 1, "data": [2.0]}]}]}
    assert unpack_steps(json.loads(json.dumps(old))) == old
    bad = unpack_steps({"type": "steps", "records": [{"node": "n1", "grad_inputs": [0, 7, None],
                                                      "grad_outputs": [0], "leaf_grads": {"x": 0}}],
                        "previews": [{"numel": 1, "data": [3.0]}]})
    record = bad["records"][0]
    assert record["grad_inputs"] == [{"numel": 1, "data": [3.0]}, None, None]
    assert record["grad_outputs"][0] is record["grad_inputs"][0] is record["leaf_grads"]["x"]


class _Recorder:
    """A worker channel that keeps each message as the app would decode it."""

    codec = None
    columns = False
    broken = False

    def __init__(self):
        self.messages = []

    def send(self, msg: dict) -> None:
        from core.protocol.wire import plain_message

        self.messages.append(_wire(plain_message(msg)))


def test_continue_in_the_worker_sends_one_packed_batch(tmp_path):
    from core.worker.main import Worker

    script = tmp_path / "mlp.py"
    script.write_text(textwrap.dedent("""\
        import torch
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(8)])
        loss = net(torch.randn(4, 16)).pow(2).mean()
        loss.backward()
        grads = [p.grad.flatten().tolist() for p in net.parameters()]
    """))
    channel = _Recorder()
    worker = Worker(channel)
    interval = sys.getswitchinterval()
    cwd = os.getcwd()
    try:
        worker.run({"cmd": "run", "run": 1, "path": str(script), "step": {"call": 0, "mode": "all"},
                    "memory_rate": 0})
    finally:
        os.chdir(cwd)
    assert sys.getswitchinterval() == interval  # the short interval ended with the stepped call
    kinds = [m["type"] for m in channel.messages]
    assert kinds.count("step_begin") == 1 and kinds.count("step_end") == 1
    batches = [m for m in channel.messages if m["type"] == "steps"]
    assert len(batches) == 1  # 42 nodes, run on in well under half a second: one batch
    batch = batches[0]
    # each Tanh's incoming gradient is sent as the position of the Addmm preview that produced it
    packed = batch["records"]
    for i, r in enumerate(packed):
        if r["name"] == "TanhBackward0":
            (incoming,) = r["grad_outputs"]
            assert isinstance(incoming, int) and any(incoming in p["grad_inputs"] for p in packed[:i])
    refs = sum(len(r["grad_outputs"]) + len(r["grad_inputs"]) + len(r["leaf_grads"]) for r in packed)
    assert len(batch["previews"]) < refs
    records = unpack_steps(batch)["records"]
    nodes = next(m for m in channel.messages if m["type"] == "step_begin")["graph"]["nodes"]
    assert len(records) == len(nodes) == 42
    assert [r["index"] for r in records] == list(range(42))
    trace = next(m for m in channel.messages if m["type"] == "trace")["trace"]
    call = trace["calls"][0]
    leaves = {k: v for r in records for k, v in r["leaf_grads"].items()}
    assert sorted(leaves) == sorted(call["leaf_grads"]) and len(leaves) == 16
    whole = 0
    for name, grad in call["leaf_grads"].items():  # the captured .grad after the call
        if grad["data"] is not None:  # the biases: every value
            assert leaves[name]["data"] == grad["data"]
            whole += 1
        else:  # the weights: the capture keeps a sample, the step every value
            assert len(grad["sample"]) >= 8 and leaves[name]["data"][:len(grad["sample"])] == grad["sample"]
    assert 8 <= whole < 16  # both kinds were compared


def test_quick_switch_sets_and_restores_the_interval():
    from core.protocol import switch_interval

    held = set(switch_interval._owners)  # a window of an earlier test may still be paused
    for owner in held:
        quick_switch(False, owner)
    interval = sys.getswitchinterval()
    try:
        quick_switch(True, "gui")
        assert stepping_switch() and sys.getswitchinterval() == min(interval, STEP_SWITCH_S)
        quick_switch(True, "worker")
        quick_switch(True, "gui")  # idempotent per owner
        quick_switch(False, "gui")  # the worker still steps: still short
        assert stepping_switch() and sys.getswitchinterval() == min(interval, STEP_SWITCH_S)
        quick_switch(False, "worker")
        assert not stepping_switch() and sys.getswitchinterval() == interval
        quick_switch(False, "worker")
        assert sys.getswitchinterval() == interval
    finally:
        quick_switch(False, "gui")
        quick_switch(False, "worker")
        sys.setswitchinterval(interval)
        for owner in held:
            quick_switch(True, owner)
