"""Each backward call's loss and small leaves (``CallInfo.scalars``), compared with a plain run of the
same script: exact float32 values, summaries included, through a real worker and the trace format."""

import json
import math
import runpy
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.client.handle import run_capture  # noqa: E402
from core.model.trace import CallInfo, Trace, TraceFormatError  # noqa: E402
from core.model.trace_json import trace_from_json  # noqa: E402
from core.worker.capture.loop_scalars import SCALAR_LIMIT  # noqa: E402
from core.worker.capture.recorder import capture_script  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"

# 50 epochs of a step too large: w grows ×(-19) a call, the loss overflows to inf, then w to
# -inf / inf and the grads to nan. A big weight rides along (norms only, no scalars).
DIVERGING = """\
    import torch

    w = torch.tensor([1.0, -2.0], requires_grad=True)
    big = torch.ones(SIZE, requires_grad=True)
    for epoch in range(50):
        loss = (w ** 2).sum() + (big * 0.0).sum()
        loss.backward()
        with torch.no_grad():
            w -= 10 * w.grad
        w.grad = None
        big.grad = None
""".replace("SIZE", str(SCALAR_LIMIT + 1))


def _plain_run(path) -> list[dict]:
    """Run ``path`` with plain torch, noting after each backward what the capture should record:
    the loss, and the script's ``w``/``b`` (or its model's parameters) and their grads."""
    seen = []
    original = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        scope = sys._getframe(1).f_globals
        leaves = {n: scope[n] for n in ("w", "b") if n in scope}
        if "model" in scope:
            leaves.update((f"model.{n}", p) for n, p in scope["model"].named_parameters())
        seen.append({"loss": self.item(),
                     "values": {n: t.detach().reshape(-1).tolist() for n, t in leaves.items()},
                     "grads": {n: t.grad.reshape(-1).tolist() for n, t in leaves.items() if t.grad is not None}})
        return out

    torch.Tensor.backward = backward
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        torch.Tensor.backward = original
    return seen


def _floats(record: dict) -> dict:
    """A recorded scalars record with "nan" / "inf" / "-inf" as floats, nan as a string (nan != nan)."""
    def f(x):
        x = float(x)
        return "nan" if math.isnan(x) else x

    return {"loss": f(record["loss"]),
            "values": {n: [f(x) for x in v] for n, v in record["values"].items()},
            "grads": {n: [f(x) for x in v] for n, v in record["grads"].items()}}


@pytest.mark.slow
def test_linear_regression_records_w_b_and_the_loss_of_every_epoch_exactly(capsys):
    path = EXAMPLES / "11_linear_regression_scratch.py"
    trace = run_capture(str(path), timeout=300).trace
    plain = _plain_run(path)
    assert trace.error is None and len(trace.calls) == len(plain) == 200
    assert [c.snapshot for c in trace.calls[:4]] == ["full", "full", "full", "summary"]
    assert [c.scalars for c in trace.calls] == plain  # float equality on every float32 value
    last = trace.calls[-1].scalars
    assert last["values"]["w"][0] == pytest.approx(2.0, abs=0.01)
    assert last["values"]["b"][0] == pytest.approx(1.0, abs=0.01)
    assert trace.calls[0].scalars["values"] == {"w": [0.0], "b": [0.0]}
    assert trace.calls[0].scalars["loss"] == pytest.approx(2.378, abs=1e-3)


@pytest.mark.slow
def test_the_nn_linear_loop_records_the_models_weight_and_bias(capsys):
    path = EXAMPLES / "12_linear_regression_nn.py"
    trace = run_capture(str(path), timeout=300).trace
    plain = _plain_run(path)
    assert [c.scalars for c in trace.calls] == plain
    assert sorted(trace.calls[-1].scalars["values"]) == ["model.bias", "model.weight"]


@pytest.mark.slow
def test_a_diverging_50_epoch_loop_keeps_scalars_in_summaries_and_its_nan_and_inf(tmp_path):
    path = tmp_path / "diverging.py"
    path.write_text(textwrap.dedent(DIVERGING))
    trace = run_capture(str(path), timeout=300).trace
    plain = _plain_run(path)
    assert trace.error is None and len(trace.calls) == 50
    for index in (0, 25, 49):  # the first, a middle (a summary) and the last call
        call = trace.calls[index]
        assert call.scalars is not None
        assert _floats(call.scalars) == _floats({**plain[index], "values": {"w": plain[index]["values"]["w"]},
                                                 "grads": {"w": plain[index]["grads"]["w"]}})
    assert trace.calls[25].snapshot == "summary" and trace.calls[25].nodes == []
    assert all("big" not in c.scalars["values"] for c in trace.calls)  # 17 elements: norms only
    assert trace.calls[25].grad_norms["params"]["big"]["grad"] == 0.0
    assert [_floats(c.scalars) for c in trace.calls] == [
        _floats({"loss": p["loss"], "values": {"w": p["values"]["w"]}, "grads": {"w": p["grads"]["w"]}})
        for p in plain]
    # What diverged, as the trace writes it: strings where JSON has no number.
    written = {x for c in trace.calls for v in (c.scalars["values"]["w"], c.scalars["grads"]["w"]) for x in v}
    assert {"inf", "-inf", "nan"} <= written and "inf" in {c.scalars["loss"] for c in trace.calls}
    back = trace_from_json(trace.to_json())
    assert [c.scalars for c in back.calls] == [c.scalars for c in trace.calls]


def test_the_root_value_is_the_loss_only_for_one_one_element_root(tmp_path):
    path = tmp_path / "roots.py"
    path.write_text(textwrap.dedent("""\
        import torch
        w = torch.tensor([3.0], requires_grad=True)
        v = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        (w * 2).sum().backward()
        (v * w).backward(torch.ones(3))
        torch.autograd.backward([(w * 1).sum(), (v * 1).sum()])
        g, = torch.autograd.grad((w * w).sum(), [w])
    """))
    trace = capture_script(str(path))
    s = [c.scalars for c in trace.calls]
    assert s[0] == {"loss": 6.0, "values": {"w": [3.0]}, "grads": {"w": [2.0]}}
    assert s[1] == {"loss": None, "values": {"v": [1.0, 2.0, 3.0], "w": [3.0]},
                    "grads": {"v": [3.0, 3.0, 3.0], "w": [8.0]}}
    assert s[2]["loss"] is None and s[2]["grads"] == {"w": [9.0], "v": [4.0, 4.0, 4.0]}
    # autograd.grad leaves .grad as it was
    assert s[3] == {"loss": 9.0, "values": {"w": [3.0]}, "grads": {"w": [9.0]}}


def test_the_trace_format_checks_scalars():
    base = json.loads(Trace(calls=[CallInfo(id="c0", index=0, api="Tensor.backward", line=1, roots=[], nodes=[],
                                            tensors=[])]).to_json())
    base["calls"][0]["scalars"] = {"loss": "-inf", "values": {"w": [1.0, "nan"]}, "grads": {}}
    assert trace_from_json(json.dumps(base)).calls[0].scalars["values"]["w"] == [1.0, "nan"]
    base["calls"][0]["scalars"] = {"loss": 1.0, "values": {"w": ["big"]}, "grads": {}}
    with pytest.raises(TraceFormatError, match=r"field 'calls\[0\].scalars': 'values' must map names"):
        trace_from_json(json.dumps(base))
    del base["calls"][0]["scalars"]  # a file written before the field
    assert trace_from_json(json.dumps(base)).calls[0].scalars is None

