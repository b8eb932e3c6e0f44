"""Every bundled example, captured: exact node names, lines and gradients (measured with torch)."""

from collections import Counter
from pathlib import Path

import pytest

from tests.example_expectations import EXPECTATIONS

torch = pytest.importorskip("torch")

from core.worker.capture.recorder import capture_script  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"
BIG = {"50_big_residual_mlp.py", "51_huge_residual_mlp.py"}


def _lookup(grads: dict, name: str):
    """Parameters of the only module in a script are named by module path (fc1.weight)."""
    if name in grads:
        return grads[name]
    short = name.split(".", 1)[1] if name.startswith("model.") else name
    return grads.get(short)


def _close(actual, expected, tol):
    flat_e = torch.tensor(expected, dtype=torch.float64).reshape(-1).tolist()
    assert actual is not None and actual.data is not None
    assert len(actual.data) == len(flat_e)
    for a, e in zip(actual.data, flat_e):
        assert abs(a - e) <= tol + 1e-6 * abs(e), (actual.data, expected)


def test_every_example_has_expectations():
    scripts = {p.name for p in EXAMPLES.glob("[0-9]*.py")}
    assert scripts == set(EXPECTATIONS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in EXPECTATIONS if n not in BIG))
def test_example(name):
    exp = EXPECTATIONS[name]
    trace = capture_script(str(EXAMPLES / name), mode="script")
    if exp["error"] is None:
        assert trace.error is None, trace.error
    else:
        assert trace.error.type == exp["error"]["type"]
        assert exp["error"]["message"] in trace.error.message
        assert trace.error.line == exp["error"]["line"]
    assert trace.call_count == exp["call_count"]
    captured = [c for c in trace.calls if c.api != "unreached"]
    assert len(captured) == exp["call_count"]
    for want, call in zip(exp["calls"], captured):
        assert call.api == want["api"]
        assert call.line == want["line"]
        assert call.node(call.roots[0]).name == want["root"]
        assert sorted(n.name for n in call.nodes) == want["node_names"]
        tol = want.get("grad_tol", 0.0)
        if "raised" in want:
            assert call.error is not None and call.error.type == want["raised"]
        elif call.api == "autograd.grad":
            results = call.options["results"]
            assert len(results) == len(want["outputs"])
            for got, expected in zip(results, want["outputs"]):
                got_data = got["values"]["data"]
                assert torch.allclose(torch.tensor(got_data), torch.tensor(expected, dtype=torch.float32).reshape(-1))
        else:
            for leaf, value in want["leaf_grads"].items():
                if value is None:
                    continue
                _close(_lookup(call.leaf_grads, leaf), value, tol)
        for leaf, value in want.get("retained_grads", {}).items():
            tensor = next(t for t in call.tensors if t.name == leaf)
            if value is None:
                assert tensor.grad is None
            else:
                assert tensor.retains_grad and tensor.grad.values.data == [value]
    if exp.get("same_graph_every_call"):
        full = [c for c in captured if c.snapshot == "full"]
        summaries = [c for c in captured if c.snapshot == "summary"]
        assert len(full) == min(len(captured), 4)
        assert all(c.same_as == "c0" for c in captured[1:])
        assert all(not c.nodes and c.node_count == captured[0].node_count for c in summaries)


@pytest.mark.parametrize("name", [n for n in sorted(EXPECTATIONS) if "tensors" in EXPECTATIONS[n]])
def test_anatomy_examples(name):
    exp = EXPECTATIONS[name]
    trace = capture_script(str(EXAMPLES / name), mode="script")
    assert trace.error is None
    by_name = {t.name: t for t in trace.tensors}
    for var, want in exp["tensors"].items():
        t = by_name[var]
        assert t.shape == want["shape"]
        assert t.stride == want["stride"]
        assert t.storage_offset == want["storage_offset"]
        assert t.version == want["version"]
        assert t.is_view == want["is_view"]
        sharing = sorted(o.name for o in trace.tensors
                         if o.storage == t.storage and o.name != var and o.name in exp["tensors"])
        assert sharing == want["shares_storage_with"]


def test_model_file_is_run_as_a_model():
    trace = capture_script(str(EXAMPLES / "40_model_small_cnn.py"))
    assert trace.error is None and trace.mode == "model"
    call = trace.calls[0]
    want = EXPECTATIONS["40_model_small_cnn.py"]["model"]
    names = Counter(n.name for n in call.nodes)
    assert names - Counter({"SumBackward0": 1}) == Counter(want["node_names"])
    params = {t.name for t in call.tensors if t.is_leaf and t.requires_grad}
    assert {p.split(".", 1)[1] if p.startswith("model.") else p for p in want["parameters"]} <= params
    assert all(g.data is not None or g.sample is not None for g in call.leaf_grads.values())


@pytest.mark.slow
def test_big_example_node_count():
    trace = capture_script(str(EXAMPLES / "50_big_residual_mlp.py"))
    want = EXPECTATIONS["50_big_residual_mlp.py"]["calls"][0]
    call = trace.calls[0]
    assert call.node_count == want["node_count"]
    assert dict(Counter(n.name for n in call.nodes)) == want["node_counts"]
    modules = {n.module for n in call.nodes if n.name == "AddmmBackward0"}
    assert "blocks.0.fc" in modules and "blocks.799.fc" in modules
