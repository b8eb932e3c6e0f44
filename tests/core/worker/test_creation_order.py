"""Each op's node carries torch's autograd sequence number and the time it was made, on the
memory chart's clock: the order and the times the forward replay shows."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from core.client.handle import run_capture  # noqa: E402
from core.model.trace_json import load_trace  # noqa: E402

SCRIPT = """\
import torch
a = torch.tensor([1., 2.], requires_grad=True)
b = a * 2
c = b + 1
d = c.sum()
d.backward()
"""
PLAIN = SCRIPT + """\
import json
print(json.dumps({f.name(): f._sequence_nr() for f in (b.grad_fn, c.grad_fn, d.grad_fn)}))
"""


@pytest.mark.slow
def test_seqs_are_torchs_and_times_follow_them_within_the_memory_clock(tmp_path):
    script = tmp_path / "chain.py"
    script.write_text(SCRIPT)
    plain = subprocess.run([sys.executable, "-c", PLAIN], capture_output=True, text=True, timeout=120, check=True)
    torch_seqs = json.loads(plain.stdout.strip().splitlines()[-1])
    assert torch_seqs == {"MulBackward0": 0, "AddBackward0": 1, "SumBackward0": 2}

    trace = run_capture(str(script), timeout=120).trace
    assert trace.error is None
    call = trace.calls[0]
    by_name = {n.name: n for n in call.nodes}
    assert {name: by_name[name].seq for name in torch_seqs} == torch_seqs
    assert by_name["AccumulateGrad"].seq is None and by_name["AccumulateGrad"].created is None
    assert [by_name[name].line for name in ("MulBackward0", "AddBackward0", "SumBackward0")] == [3, 4, 5]

    times = [by_name[name].created for name in ("MulBackward0", "AddBackward0", "SumBackward0")]
    assert all(isinstance(t, float) for t in times)
    assert times[0] < times[1] < times[2]
    samples = [s.t for s in trace.memory]
    assert samples, "the run recorded memory samples"
    assert min(samples) <= times[0] and times[2] <= max(samples)


@pytest.mark.slow
def test_seq_and_created_survive_the_json_round_trip(tmp_path):
    script = tmp_path / "chain.py"
    script.write_text(SCRIPT)
    trace = run_capture(str(script), timeout=120).trace
    path = tmp_path / "trace.json"
    trace.save(path)
    again = load_trace(path).calls[0]
    assert [(n.name, n.seq, n.created) for n in again.nodes] == [(n.name, n.seq, n.created)
                                                                 for n in trace.calls[0].nodes]
