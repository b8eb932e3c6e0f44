"""Value previews and the graph walk taken the cheap way give exactly what the slow way gives."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.worker.capture.snapshot import Snapshotter
from core.worker.capture.node_graph import number_nodes
from core.worker.capture.values import IN_PLACE_WIDTH, STACK_LIMIT, ValueBatch, _unravel

ROOT = Path(__file__).resolve().parents[3]


def test_wide_tensors_reduced_in_place_give_their_own_exact_statistics():
    torch.manual_seed(0)
    weights = [torch.randn(256, 256) * (i + 1) for i in range(5)]
    assert IN_PLACE_WIDTH <= weights[0].numel() <= STACK_LIMIT
    batch, out = ValueBatch(), {}
    for i, w in enumerate(weights):
        batch.add(out, i, w, full=False, sample=8)
    batch.flush()
    for i, w in enumerate(weights):
        v = out[i]
        assert v.numel == 65536 and not v.approx
        assert v.min == w.min().item() and v.max == w.max().item()
        assert v.mean == w.mean().item()  # the value ``w.mean()`` shows in the script
        assert v.sample == w.reshape(-1)[:8].tolist()


@pytest.mark.slow
def test_transposed_preview_reads_row_major_values_without_loading_sympy():
    code = (
        "import sys, torch\n"
        "from core.worker.capture.values import values_of\n"
        "x = torch.arange(3000.).reshape(60, 50).t()\n"
        "v = values_of(x)\n"
        "assert v.sample == x.contiguous().reshape(-1)[:24].tolist(), v.sample\n"
        "assert (v.min, v.max) == (0.0, 2999.0)\n"
        "print('sympy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unravel_matches_torch():
    for shape in [(4, 5), (3, 1, 7), (10,), (2, 3, 4, 5)]:
        index = torch.arange(torch.Size(shape).numel())
        assert all(torch.equal(a, b) for a, b in zip(_unravel(index, shape), torch.unravel_index(index, shape)))


def test_structure_hash_is_the_sha1_of_names_and_edges_in_walk_order():
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    loss = ((a * b).relu() + a).sum()
    nodes, ids, digest = Snapshotter(lambda t: None).walk([loss.grad_fn])
    order, _ = number_nodes([loss.grad_fn])
    text = ""
    for node in order:
        text += node.name().replace("torch::autograd::", "")
        for fn, nr in node.next_functions:
            text += f"|{ids[id(fn)]}:{nr}" if fn is not None else "|-"
        text += ";"
    assert digest == hashlib.sha1(text.encode()).hexdigest()
    assert [n.name for n in nodes] == ["SumBackward0", "AddBackward0", "ReluBackward0", "MulBackward0",
                                      "AccumulateGrad", "AccumulateGrad"]
    assert nodes[1].next[0].node == "n2" and nodes[1].next[1].node == "n4"


def test_the_command_line_loads_no_qt():
    code = "import sys, app.cli.commands; print(sorted(m for m in sys.modules if m.startswith('PySide6')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
