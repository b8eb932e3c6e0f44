"""A small MLP trained under bfloat16 autocast on the CPU: the graph carries the casts torch makes
(ToCopyBackward0, bfloat16 gradients cast back to the float32 parameters), and each recorded norm
is the norm of the float32 ``.grad`` of a plain run."""

import runpy
import textwrap
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from core.worker.capture.recorder import capture_script  # noqa: E402

SCRIPT = """\
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 4)
    y = torch.randn(16, 1)
    grads, seen = [], []
    for step in range(3):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            loss = (out.float() - y).pow(2).mean()
        # every node of the graph, with the dtype of the gradient it gets and of each one it sends on
        stack, nodes = [loss.grad_fn], {}
        while stack:
            node = stack.pop()
            if node in nodes:
                continue
            nodes[node] = None
            stack.extend(fn for fn, _ in node.next_functions if fn is not None)
        met = []
        for node in nodes:
            if node.name().endswith("AccumulateGrad"):
                met.append((node.name().split("::")[-1], None, None))
            else:
                node.register_hook(lambda gi, go, node=node: met.append(
                    (node.name(), go[0].dtype, tuple(g.dtype for g in gi if g is not None))))
        loss.backward()
        seen.append(met)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("bf16") / "script.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return capture_script(str(path)), runpy.run_path(str(path))


def test_each_norm_is_the_norm_of_the_float32_grad_of_a_plain_run(run):
    trace, plain = run
    assert trace.error is None and [c.index for c in trace.calls] == [0, 1, 2]
    for call, grads in zip(trace.calls, plain["grads"]):
        params = call.grad_norms["params"]
        assert sorted(params) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        for name, g in grads.items():
            assert g.dtype == torch.float32
            assert params[name]["grad"] == float(torch.linalg.vector_norm(g))


def test_the_graph_has_the_cast_nodes_and_dtypes_torch_made(run):
    trace, plain = run
    for call, met in zip(trace.calls, plain["seen"]):
        assert Counter(n.name for n in call.nodes) == Counter(name for name, _, _ in met)
        assert Counter(n.name for n in call.nodes) == Counter({
            "ToCopyBackward0": 5, "AccumulateGrad": 4, "AddmmBackward0": 2, "TBackward0": 2, "MeanBackward0": 1,
            "PowBackward0": 1, "SubBackward0": 1, "ReluBackward0": 1})
        # each ToCopyBackward0 hands its gradient on in the dtype the forward cast came from
        casts = sorted([(str(go).removeprefix("torch."), str(gi[0]).removeprefix("torch."))
                        for name, go, gi in met if name == "ToCopyBackward0"])
        assert casts == [("bfloat16", "float32")] * 4 + [("float32", "bfloat16")]  # 4 params in; out.float()
        marked = sorted(tuple(m["dtype"]) for n in call.nodes if n.name == "ToCopyBackward0" for m in n.edge_marks)
        assert marked == casts
        # the other nodes compute in bfloat16 below out.float(), float32 above it
        for name, go, gi in met:
            if name in ("AddmmBackward0", "ReluBackward0", "TBackward0"):
                assert go == torch.bfloat16 and set(gi) == {torch.bfloat16}
            elif name in ("MeanBackward0", "PowBackward0", "SubBackward0"):
                assert go == torch.float32
        dtypes = {t.name: t.dtype for t in call.tensors if t.name}
        assert dtypes == {"loss": "float32", "out": "bfloat16", "0.weight": "float32", "0.bias": "float32",
                          "2.weight": "float32", "2.bias": "float32"}
