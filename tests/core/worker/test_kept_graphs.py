"""Graphs a script keeps alive in a list (losses, grad_fns) count as kept saved bytes."""

import textwrap

import pytest

torch = pytest.importorskip("torch")

from core.worker.capture.names import NameTable  # noqa: E402
from core.worker.saved_bytes import live_storages  # noqa: E402

# Four epochs, each keeping its graph through loss.grad_fn only: ``loss`` itself is deleted.
GRAD_FN_LOOP = textwrap.dedent("""\
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    x = torch.randn(16, 8)
    y = torch.randn(16, 1)

    grad_fns = []
    for epoch in range(4):
        loss = nn.functional.mse_loss(model(x), y)
        grad_fns.append(loss.grad_fn)  # keeps the graph, not the loss
        del loss
        model.zero_grad()  # a marked sample as each epoch ends
""")


def _graph(x, w):
    return (x @ w).relu().sum()


def test_a_list_of_grad_fns_is_reached_and_kept():
    w = torch.ones(4, 4, requires_grad=True)
    x = torch.ones(2, 4)
    fns = [_graph(x, w).grad_fn for _ in range(3)]
    table = NameTable(__file__)
    table.globals = {"grad_fns": fns, "w": w}
    kept: dict = {}
    roots = table.graph_roots([], kept)
    assert roots == fns and kept == {"grad_fns": fns}
    found = live_storages(roots, kept)
    # Each graph saves its own relu output (2 x 4 floats, 32 B); mm saves the shared x (32 B,
    # for w's gradient), counted once.
    assert sum(found.values()) == 3 * 32 + 32
    assert found.kept == {"grad_fns": 3 * 32 + 32}


def test_a_graph_named_outside_any_list_is_not_kept():
    w = torch.ones(4, 4, requires_grad=True)
    x = torch.ones(2, 4)
    loss = _graph(x, w)
    table = NameTable(__file__)
    table.globals = {"loss": loss, "losses": [_graph(x, w)]}
    kept: dict = {}
    found = live_storages(table.graph_roots([], kept), kept)
    assert sum(found.values()) == 2 * 32 + 32
    assert found.kept == {"losses": 32 + 32}  # the list's graph, with the x both graphs saved


@pytest.mark.slow
def test_kept_saved_bytes_grow_per_epoch_of_a_grad_fn_list(tmp_path):
    from core.client.handle import run_capture

    script = tmp_path / "grad_fn_list.py"
    script.write_text(GRAD_FN_LOOP)
    trace = run_capture(str(script), timeout=120).trace
    ends = [(s.saved_bytes, s.kept_bytes, s.kept_in, s.where) for s in trace.memory if s.mark == "zero_grad"]
    # Each epoch keeps one more graph: its ReLU output (16 x 32 floats, 2,048 B) and prediction
    # (16 x 1, 64 B). The first also holds x, y and the last layer's weight (704 B).
    assert ends == [(2816 + 2112 * i, 2816 + 2112 * i, "grad_fns", "line 14") for i in range(4)]
