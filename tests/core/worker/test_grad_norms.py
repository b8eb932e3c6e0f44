"""Gradient norms per call, clipping and optimizer steps, compared with a plain run of the same script."""

import json
import math
import runpy
import textwrap

import pytest

torch = pytest.importorskip("torch")

from core.model.grad_health import event_text  # noqa: E402
from core.model.trace import TraceFormatError  # noqa: E402
from core.model.trace_json import trace_from_json  # noqa: E402
from core.worker.capture.recorder import capture_script  # noqa: E402

LOOP = """\
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    w = torch.randn(3, requires_grad=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(16, 4)
    y = torch.randn(16, 1)
    grads, totals, clipped, before, after = [], [], [], [], []
    for step in range(5):
        opt.zero_grad()
        w.grad = None
        loss = (model(x) - y).pow(2).mean() + (w * w).sum()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()} | {"w": w.grad.clone()})
        totals.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3))
        clipped.append([p.grad.clone() for p in model.parameters()])
        before.append({n: p.detach().clone() for n, p in model.named_parameters()})
        opt.step()
        after.append({n: p.detach().clone() for n, p in model.named_parameters()})
"""


def _script(tmp_path, source: str):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    path = _script(tmp_path_factory.mktemp("loop"), LOOP)
    plain = runpy.run_path(str(path))
    return capture_script(str(path)), plain


def test_each_norm_is_the_vector_norm_of_that_grad_in_a_plain_run(loop):
    trace, plain = loop
    assert [c.snapshot for c in trace.calls] == ["full", "full", "full", "summary", "full"]
    for call, grads in zip(trace.calls, plain["grads"]):
        params = call.grad_norms["params"]
        assert sorted(params) == ["0.bias", "0.weight", "2.bias", "2.weight", "w"]
        for name, g in grads.items():
            assert params[name]["grad"] == float(torch.linalg.vector_norm(g))
            assert "added" not in params[name]
        assert params["0.weight"]["module"] == "0" and params["w"]["module"] == "w"
        for module in ("0", "2"):
            both = torch.cat([grads[f"{module}.weight"].flatten(), grads[f"{module}.bias"].flatten()])
            assert call.grad_norms["modules"][module] == pytest.approx(float(torch.linalg.vector_norm(both)), rel=1e-6)


def test_param_norm_and_ratio_are_of_the_leaf_after_the_call(loop):
    trace, plain = loop
    # Call 2 ran on the parameters as they were after step 1.
    weight = plain["after"][1]["0.weight"]
    entry = trace.calls[2].grad_norms["params"]["0.weight"]
    assert entry["param"] == float(torch.linalg.vector_norm(weight))
    assert entry["ratio"] == entry["grad"] / entry["param"]


def test_a_parameter_changed_after_a_step_is_measured_again(tmp_path):
    # A step measures each ‖param‖ and the next call reuses it; a change in place in between
    # (a weight rescaled under no_grad) is seen by its version and read again.
    path = _script(tmp_path, """\
        import torch
        torch.manual_seed(0)
        lin = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        x = torch.randn(5, 3)
        seen = []
        for step in range(3):
            opt.zero_grad()
            lin(x).pow(2).sum().backward()
            seen.append({n: float(torch.linalg.vector_norm(p)) for n, p in lin.named_parameters()})
            opt.step()
            if step == 1:
                with torch.no_grad():
                    lin.weight.mul_(3.0)
        """)
    plain = runpy.run_path(str(path))
    trace = capture_script(str(path))
    assert [{n: e["param"] for n, e in c.grad_norms["params"].items()} for c in trace.calls] == [
        {"lin.bias": s["bias"], "lin.weight": s["weight"]} for s in plain["seen"]]


def test_clip_grad_norm_records_torchs_total_and_the_norm_after(loop):
    trace, plain = loop
    clips = [e for e in trace.grad_events if e["kind"] == "clip_grad_norm_"]
    assert [(e["after_call"], e["line"]) for e in clips] == [(i, 17) for i in range(5)]
    for event, total, clipped in zip(clips, plain["totals"], plain["clipped"]):
        assert event["total_norm"] == float(total)
        assert event["clip_coef"] == float(torch.clamp(0.3 / (total + 1e-6), max=1.0))
        after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in clipped]))
        assert event["norm_after"] == float(after)
        assert (event["max_norm"], event["norm_type"], event["params"]) == (0.3, 2.0, 4)
    assert clips[0]["clip_coef"] < 1.0 and clips[0]["norm_after"] == pytest.approx(0.3, rel=1e-5)


def test_each_step_records_the_update_per_module_after_its_call(loop):
    trace, plain = loop
    steps = [e for e in trace.grad_events if e["kind"] == "optimizer.step"]
    assert [(e["after_call"], e["line"], e["optimizer"]) for e in steps] == [(i, 20, "SGD") for i in range(5)]
    for event, old, new in zip(steps, plain["before"], plain["after"]):
        for module in ("0", "2"):
            names = (f"{module}.weight", f"{module}.bias")
            delta = math.sqrt(sum(float(torch.linalg.vector_norm(new[n] - old[n])) ** 2 for n in names))
            size = math.sqrt(sum(float(torch.linalg.vector_norm(new[n])) ** 2 for n in names))
            assert event["update"][module] == pytest.approx(delta / size, rel=1e-6)
        assert "w" not in event["update"]  # not among the optimizer's parameters
    zeros = [e["after_call"] for e in trace.grad_events if e["kind"] == "zero_grad"]
    assert zeros == [None, 0, 1, 2, 3]


def test_norms_and_events_round_trip_and_are_checked(loop):
    trace, _ = loop
    back = trace_from_json(trace.to_json())
    assert back.calls[3].grad_norms == trace.calls[3].grad_norms
    assert back.grad_events == trace.grad_events
    data = json.loads(trace.to_json())
    del data["grad_events"]
    for call in data["calls"]:
        del call["grad_norms"]
    old = trace_from_json(json.dumps(data))  # a file written before these fields
    assert old.grad_events == [] and old.calls[0].grad_norms is None
    data["calls"][0]["grad_norms"] = {"params": {"w": {"module": "w", "grad": "big", "param": 1, "ratio": 1}},
                                      "modules": {}}
    with pytest.raises(TraceFormatError, match=r"field 'calls\[0\].grad_norms': 'params.w'"):
        trace_from_json(json.dumps(data))
    data["calls"][0].pop("grad_norms")
    data["grad_events"] = [{"kind": "clip_grad_norm_", "after_call": 0, "line": 3}]
    with pytest.raises(TraceFormatError, match=r"field 'grad_events': \[0\]"):
        trace_from_json(json.dumps(data))
    data["grad_events"] = [dict(trace.grad_events[0], after_call=5)]
    with pytest.raises(TraceFormatError, match=r"field 'grad_events\[0\].after_call': names call 5, past the 5"):
        trace_from_json(json.dumps(data))


def test_accumulated_grad_records_what_the_call_added(tmp_path):
    path = _script(tmp_path, """\
        import torch
        w = torch.tensor([3.0, 4.0], requires_grad=True)
        (w * 2).sum().backward()
        (w * w).sum().backward()
    """)
    trace = capture_script(str(path))
    first, second = (c.grad_norms["params"]["w"] for c in trace.calls)
    assert first == {"module": "w", "grad": float(torch.tensor([2.0, 2.0]).norm()), "param": 5.0,
                     "ratio": float(torch.tensor([2.0, 2.0]).norm()) / 5.0}
    assert second["grad"] == float(torch.tensor([8.0, 10.0]).norm())  # 2 + 2w
    assert second["added"] == float(torch.tensor([6.0, 8.0]).norm())  # 2w: 10.0


def test_clip_grad_value_and_nonfinite_norms(tmp_path):
    path = _script(tmp_path, """\
        import torch
        from torch.nn.utils import clip_grad_value_
        w = torch.tensor([3.0, -4.0], requires_grad=True)
        (w * 10).sum().backward()
        clip_grad_value_([w], 1.5)
        v = torch.tensor([1e30], requires_grad=True)
        (v * v * v).sum().backward()
    """)
    originals = (torch.nn.utils.clip_grad_value_, torch.nn.utils.clip_grad.clip_grad_norm_,
                 torch.optim.Optimizer.zero_grad)
    trace = capture_script(str(path))
    assert (torch.nn.utils.clip_grad_value_, torch.nn.utils.clip_grad.clip_grad_norm_,
            torch.optim.Optimizer.zero_grad) == originals  # restored after the run
    assert trace.grad_events == [{"kind": "clip_grad_value_", "after_call": 0, "line": 5, "clip_value": 1.5,
                                  "total_norm": float(torch.tensor([10.0, 10.0]).norm()),
                                  "norm_after": float(torch.tensor([1.5, 1.5]).norm()), "params": 1}]
    assert trace.calls[1].grad_norms["params"]["v"]["grad"] == "inf"
    assert trace.calls[1].grad_norms["modules"] == {"v": "inf"}
    assert trace_from_json(trace.to_json()).calls[1].grad_norms == trace.calls[1].grad_norms


EXAMPLES = __import__("pathlib").Path(__file__).resolve().parents[3] / "resources" / "examples"


def test_deep_sigmoid_mlp_is_flagged_vanishing_at_its_first_layers():
    from core.model.grad_health import grad_health

    trace = capture_script(str(EXAMPLES / "34_vanishing_gradients.py"))
    health = grad_health(trace)
    assert health.matrix.modules == [f"layers.{i}" for i in range(10)] + ["head"]
    assert health.matrix.calls == [0, 1, 2, 3, 4]
    assert [(f.kind, f.module, f.call, f.calls) for f in health.flags] == \
        [("vanishing", f"layers.{i}", 0, 5) for i in range(7)]
    assert all(f.first < 1e-3 * f.last for f in health.flags)
    steps = [e for e in trace.grad_events if e["kind"] == "optimizer.step"]
    assert len(steps) == 5 and steps[0]["update"]["layers.0"] < 1e-9 < steps[0]["update"]["head"]


def test_relu_net_with_a_huge_learning_rate_explodes_from_the_call_before_it_and_clipping_holds(capsys):
    from core.model.grad_health import grad_health

    trace = capture_script(str(EXAMPLES / "35_exploding_and_clipping.py"))
    health = grad_health(trace)
    assert health.matrix.modules == ["fc1", "fc2", "fc3"]
    # Calls 0-7 without clipping (lr 1.0 from the step after call 3), 8-15 clipped.
    assert [(f.kind, f.module, f.call) for f in health.flags] == [("exploding", m, 3) for m in ("fc1", "fc2", "fc3")]
    assert health.matrix.row("fc1")[7] != health.matrix.row("fc1")[7]  # nan by then
    clips = [e for e in trace.grad_events if e["kind"] == "clip_grad_norm_"]
    assert [(e["after_call"], e["line"]) for e in clips] == [(i, 38) for i in range(8, 16)]
    assert all(e["norm_after"] == pytest.approx(1.0, rel=1e-5) and e["clip_coef"] < 1 for e in clips)
    printed = [float(line.split()[-1]) for line in capsys.readouterr().out.splitlines() if "before clipping" in line]
    assert [e["total_norm"] for e in clips] == pytest.approx(printed, rel=5e-3)  # printed to 3 digits


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_grad_calls_record_none_and_a_create_graph_grad_is_measured_without_a_graph(tmp_path):
    path = _script(tmp_path, """\
        import torch
        x = torch.tensor([2.0], requires_grad=True)
        (g,) = torch.autograd.grad(x ** 3, x, create_graph=True)
        (x ** 3).backward(create_graph=True)
        x.grad.sum().backward()

        class Scale(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                ctx.variable = "not a tensor"  # a ctx attribute named like AccumulateGrad's
                return t * 2

            @staticmethod
            def backward(ctx, grad):
                return grad * 2

        w = torch.tensor([1.0, 1.0], requires_grad=True)
        Scale.apply(w).sum().backward()
    """)
    trace = capture_script(str(path))
    assert trace.error is None
    assert [c.api for c in trace.calls] == ["autograd.grad", "Tensor.backward", "Tensor.backward", "Tensor.backward",
                                            "unreached"]
    assert trace.calls[4].grad_norms is None
    assert trace.calls[0].grad_norms is None
    assert trace.calls[1].grad_norms["params"]["x"] == {"module": "x", "grad": 12.0, "param": 2.0, "ratio": 6.0}
    # d(3x^2)/dx = 6x = 12, added to the 12 already there
    assert trace.calls[2].grad_norms["params"]["x"] == {"module": "x", "grad": 24.0, "param": 2.0, "ratio": 12.0,
                                                        "added": 12.0}
    assert trace.calls[3].grad_norms["params"]["w"]["grad"] == float(torch.tensor([2.0, 2.0]).norm())


@pytest.mark.slow
def test_norms_and_events_reach_the_app_through_the_worker(tmp_path, loop):
    """Calls are streamed as soon as they are stored (summaries too), the events go with the trace."""
    from core.client.handle import run_capture

    path = _script(tmp_path, LOOP)
    trace = run_capture(str(path), timeout=120).trace
    local, _ = loop
    assert [c.snapshot for c in trace.calls] == ["full", "full", "full", "summary", "full"]
    assert [c.grad_norms for c in trace.calls] == [c.grad_norms for c in local.calls]
    assert [(e["kind"], e["after_call"], e["line"]) for e in trace.grad_events] == \
        [(e["kind"], e["after_call"], e["line"]) for e in local.grad_events]
    assert [e["total_norm"] for e in trace.grad_events if "total_norm" in e] == \
        [e["total_norm"] for e in local.grad_events if "total_norm" in e]


def test_get_total_norm_and_clip_grads_with_norm_record_torchs_values(tmp_path):
    path = _script(tmp_path, """\
        import torch
        from torch import nn
        from torch.nn.utils import clip_grads_with_norm_, get_total_norm
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        model(torch.randn(5, 4) * 10).pow(2).sum().backward()
        grads = [p.grad for p in model.parameters()]
        total = get_total_norm(grads)
        inf_total = torch.nn.utils.get_total_norm(grads, norm_type=float("inf"))
        clip_grads_with_norm_(model.parameters(), 2.0, total)
        clipped = [p.grad.clone() for p in model.parameters()]
        nn.utils.clip_grad_norm_(model.parameters(), 100.0)
    """)
    trace = capture_script(str(path))
    plain = runpy.run_path(str(path))
    total, clipped = plain["total"], plain["clipped"]
    assert float(total) > 2.0  # clipping scales down
    after = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in clipped])))
    assert trace.grad_events[:3] == [
        {"kind": "get_total_norm", "after_call": 0, "line": 8, "norm_type": 2.0, "total_norm": float(total),
         "tensors": 2},
        {"kind": "get_total_norm", "after_call": 0, "line": 9, "norm_type": float("inf"),
         "total_norm": float(plain["inf_total"]), "tensors": 2},
        {"kind": "clip_grads_with_norm_", "after_call": 0, "line": 10, "max_norm": 2.0, "total_norm": float(total),
         "clip_coef": float(torch.clamp(2.0 / (total + 1e-6), max=1.0)), "norm_after": after, "params": 2},
    ]
    assert trace.grad_events[2]["norm_after"] == pytest.approx(2.0, rel=1e-5)
    # clip_grad_norm_ runs torch's own total-norm and clipping inside: one event, not three
    assert [e["kind"] for e in trace.grad_events[3:]] == ["clip_grad_norm_"]
    assert trace_from_json(trace.to_json()).grad_events == trace.grad_events
    assert event_text(trace.grad_events[2]) == (f"clip_grads_with_norm_ (line 10): max 2, norm {float(total):.3g} → 2 "
                                                f"(× {trace.grad_events[2]['clip_coef']:.3g})")
    assert torch.nn.utils.get_total_norm.__module__ == "torch.nn.utils.clip_grad"  # restored after the run
