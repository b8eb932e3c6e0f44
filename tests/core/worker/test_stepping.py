"""The backward stepper: stepped runs match the engine's order and torch.autograd.grad.

Each case builds the same graph (same seed) three times: once stepped node by node from this
thread while a "script" thread runs backward, once for ``torch.autograd.grad`` as the reference,
once for the engine's own order recorded with plain hooks. Every wait and join has a timeout,
so a stepper bug fails a test instead of hanging the suite.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from core.worker.capture.recorder import Capture
from core.protocol.messages import StepperState
from core.worker.capture.snapshot import Snapshotter
from core.worker.stepper import BackwardStepper, engine_order
from core.worker.capture.node_graph import number_nodes, root_nodes

WAIT_S = 20.0
EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"


def drive(stepper: BackwardStepper, count: int = 1, stop_after: int | None = None):
    """Run ``stepper.run()`` on a script thread and release it ``count`` nodes at a time from here.

    Returns (result, error, pending records seen). With ``stop_after``, calls ``stop()`` once that
    many steps have executed.
    """
    box: dict = {}

    def script():
        try:
            box["result"] = stepper.run()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=script, name="script", daemon=True)
    thread.start()
    pendings = []
    try:
        while True:
            pending = stepper.wait_paused(timeout=WAIT_S)
            if stepper.state is not StepperState.PAUSED:
                break
            if stop_after is not None and len(stepper.steps) >= stop_after:
                stepper.stop()
                break
            pendings.append(pending)
            stepper.step(count)
        thread.join(WAIT_S)
    finally:
        if thread.is_alive():
            stepper.stop()
            thread.join(5)
    assert not thread.is_alive(), f"backward hung in state {stepper.state}"
    return box.get("result"), box.get("error"), pendings


def in_thread(fn):
    """Run ``fn`` on another thread with a timeout; returns its result (fails on a hang)."""
    box: dict = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "backward hung: a blocking hook was left registered"
    if "error" in box:
        raise box["error"]
    return box.get("result")


def namer(named: dict):
    return lambda t: next((k for k, v in named.items() if v is t), None)


def values(t: torch.Tensor) -> list:
    return t.detach().reshape(-1).tolist()


# -- cases: build() -> dict(roots, real, named leaves, grads(result), ref(), watch) ---------------


def mlp_case():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x, target = torch.randn(5, 4), torch.randn(5, 2)
    loss = nn.MSELoss()(model(x), target)
    params = dict(model.named_parameters())
    return dict(roots=[loss], real=lambda: loss.backward(), named=params,
                ref=lambda: torch.autograd.grad(loss, list(params.values())))


def shared_case():
    torch.manual_seed(1)
    x = torch.randn(4, requires_grad=True)
    s = x.exp()
    y = (s * s + s.sin() * x).sum()
    return dict(roots=[y], real=lambda: y.backward(), named={"x": x}, ref=lambda: torch.autograd.grad(y, [x]))


def view_inplace_case():
    torch.manual_seed(2)
    x = torch.randn(2, 3, requires_grad=True)
    y = x * 2
    y[0].relu_()  # in place on a view of a non-leaf nothing saved: legal
    z = (y.t().reshape(-1) ** 2).sum()
    return dict(roots=[z], real=lambda: z.backward(), named={"x": x}, ref=lambda: torch.autograd.grad(z, [x]))


def non_scalar_case():
    torch.manual_seed(3)
    x = torch.randn(3, requires_grad=True)
    y = x * 2 + x.sin()
    return dict(roots=[y], real=lambda: y.backward(torch.ones_like(y)), named={"x": x},
                ref=lambda: torch.autograd.grad(y, [x], torch.ones_like(y)))


class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


def ste_case():
    x = torch.tensor([0.2, 1.7, -0.6, 2.5], requires_grad=True)
    y = RoundSTE.apply(x).sum()
    return dict(roots=[y], real=lambda: y.backward(), named={"x": x}, ref=lambda: torch.autograd.grad(y, [x]))


def multi_output_case():
    torch.manual_seed(4)
    x = torch.randn(6, requires_grad=True)
    m = torch.randn(3, 4, requires_grad=True)
    a, b, _unused = torch.split(x, 2)
    top, _indices = torch.max(m, dim=0)
    loss = (a * 2).sum() + b.exp().sum() + top.sum()
    return dict(roots=[loss], real=lambda: loss.backward(), named={"x": x, "m": m},
                ref=lambda: torch.autograd.grad(loss, [x, m]))


def broadcast_case():
    torch.manual_seed(5)
    a = torch.randn(3, 1, requires_grad=True)
    b = torch.randn(1, 4, requires_grad=True)
    y = (a * b).sum()
    return dict(roots=[y], real=lambda: y.backward(), named={"a": a, "b": b},
                ref=lambda: torch.autograd.grad(y, [a, b]))


CASES = {
    "mlp_mse": mlp_case,
    "shared_subexpression": shared_case,
    "views_and_inplace": view_inplace_case,
    "non_scalar": non_scalar_case,
    "straight_through": ste_case,
    "multi_output": multi_output_case,
    "broadcast": broadcast_case,
}


def stepped(case: dict, **kwargs) -> tuple[BackwardStepper, list[dict]]:
    stepper = BackwardStepper(case["roots"], case["real"], names=namer(case["named"]), **kwargs)
    result, error, pendings = drive(stepper)
    assert error is None, error
    assert stepper.state is StepperState.FINISHED
    return stepper, pendings


def check_against_trace(steps: list[dict], nodes) -> None:
    """Step names and edge counts agree with the trace nodes of the same ids."""
    by_id = {n.id: n for n in nodes}
    for s in steps:
        assert s["name"] == by_id[s["node"]].name
        assert len(s["grad_inputs"]) == len(by_id[s["node"]].next)


@pytest.mark.parametrize("name", list(CASES))
def test_stepped_matches_engine(name):
    build = CASES[name]
    case = build()
    nodes, _, _ = Snapshotter(lambda t: None).walk(root_nodes(case["roots"]))
    stepper, pendings = stepped(case)

    fresh = build()
    expected = fresh["ref"]()
    for (leaf_name, leaf), want in zip(case["named"].items(), expected):
        torch.testing.assert_close(leaf.grad, want, msg=leaf_name)

    twin = build()
    order = engine_order(twin["roots"], twin["real"])
    assert [s["node"] for s in stepper.steps] == order
    assert [p["node"] for p in pendings] == order  # paused before every executed node
    assert [s["index"] for s in stepper.steps] == list(range(len(order)))
    check_against_trace(stepper.steps, nodes)

    # Every leaf is an AccumulateGrad step showing its final .grad.
    acc = [s for s in stepper.steps if s["name"] == "AccumulateGrad"]
    assert sorted(k for s in acc for k in s["leaf_grads"]) == sorted(case["named"])
    for s in acc:
        (key, vals), = s["leaf_grads"].items()
        assert vals["data"] == pytest.approx(values(case["named"][key].grad))
        assert s["grad_inputs"] == []
    assert all(s["error"] is None for s in stepper.steps)
    json.dumps(stepper.steps)


def test_straight_through_grad_is_ones():
    case = ste_case()
    stepper, _ = stepped(case)
    assert case["named"]["x"].grad.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert [s["name"] for s in stepper.steps] == ["SumBackward0", "RoundSTEBackward", "AccumulateGrad"]


def test_multi_output_records():
    stepper, _ = stepped(multi_output_case())
    by_name = {s["name"]: s for s in stepper.steps}
    split = by_name["SplitBackward0"]
    assert [g and g["numel"] for g in split["grad_outputs"]] == [2, 2, None]  # unused output: None
    assert len(by_name["MaxBackward0"]["grad_outputs"]) == 1  # indices are not differentiable
    assert by_name["MaxBackward0"]["grad_inputs"][0]["numel"] == 12


def test_broadcast_grads_are_reduced():
    stepper, _ = stepped(broadcast_case())
    mul = next(s for s in stepper.steps if s["name"] == "MulBackward0")
    assert mul["grad_outputs"][0]["numel"] == 12
    assert [g["numel"] for g in mul["grad_inputs"]] == [3, 4]


def test_non_scalar_root_gets_grad_outputs():
    stepper, _ = stepped(non_scalar_case())
    assert stepper.steps[0]["name"] == "AddBackward0"
    assert stepper.steps[0]["grad_outputs"][0]["data"] == [1.0, 1.0, 1.0]


def test_create_graph_then_second_order():
    def build():
        x = torch.tensor([1.0, 2.0, -3.0], requires_grad=True)
        return x, (x**3).sum()

    x, y = build()
    first = BackwardStepper([y], lambda: torch.autograd.grad(y, x, create_graph=True))
    (dy,), error, _ = drive(first)
    assert error is None and first.state is StepperState.FINISHED
    assert dy.tolist() == [3.0, 12.0, 27.0] and dy.requires_grad
    # autograd.grad with inputs captures the grad: the AccumulateGrad node does not run.
    assert [s["name"] for s in first.steps] == ["SumBackward0", "PowBackward0"]

    z = dy.sum()
    second = BackwardStepper([z], lambda: torch.autograd.grad(z, x))
    (d2y,), error, _ = drive(second)
    assert error is None and second.state is StepperState.FINISHED
    assert d2y.tolist() == [6.0, 12.0, -18.0]

    x2, y2 = build()
    (ref_dy,) = torch.autograd.grad(y2, x2, create_graph=True)
    z2 = ref_dy.sum()
    order = engine_order([z2], lambda: torch.autograd.grad(z2, x2))
    assert [s["node"] for s in second.steps] == order
    assert [s["name"] for s in second.steps][:2] == ["SumBackward0", "MulBackward0"]


def test_two_backwards_accumulate():
    x = torch.tensor(2.0, requires_grad=True)
    names = namer({"x": x})
    shown = []
    for _ in range(2):
        y = x**2
        stepper = BackwardStepper([y], lambda: y.backward(), names=names)
        _, error, _ = drive(stepper)
        assert error is None
        acc = stepper.steps[-1]
        assert acc["name"] == "AccumulateGrad"
        assert acc["grad_outputs"][0]["data"] == [4.0]  # this call's gradient
        shown.append(acc["leaf_grads"]["x"]["data"])  # the accumulated .grad
    assert shown == [[4.0], [8.0]]
    assert x.grad.item() == 8.0


def test_retain_grad_reported_at_its_node():
    x = torch.tensor(2.0, requires_grad=True)
    hidden = x * 3
    hidden.retain_grad()
    other = x + 1
    out = hidden * other
    nodes, ids = number_nodes(root_nodes([out]))
    stepper = BackwardStepper([out], lambda: out.backward(), names=namer({"x": x, "hidden": hidden}),
                              watch=[hidden])
    _, error, _ = drive(stepper)
    assert error is None
    owner = next(s for s in stepper.steps if "hidden" in s["leaf_grads"])
    assert owner["node"] == ids[id(hidden.grad_fn)]
    assert owner["name"] == "MulBackward0"
    assert owner["leaf_grads"]["hidden"]["data"] == [3.0]
    assert hidden.grad.item() == 3.0 and x.grad.item() == 15.0
    assert sum("hidden" in s["leaf_grads"] for s in stepper.steps) == 1


def test_leaf_root_steps_its_accumulate_grad():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    stepper = BackwardStepper([x], lambda: x.backward(torch.tensor([3.0, 4.0])), names=namer({"x": x}))
    _, error, pendings = drive(stepper)
    assert error is None
    assert [s["name"] for s in stepper.steps] == ["AccumulateGrad"]
    assert list(stepper.steps[0]["leaf_grads"]) == ["x"]
    assert stepper.steps[0]["leaf_grads"]["x"]["data"] == [3.0, 4.0]
    assert len(pendings) == 1


def test_ids_match_snapshot_walk():
    case = mlp_case()
    nodes, ids, _ = Snapshotter(lambda t: None).walk(root_nodes(case["roots"]))
    order, mine = number_nodes(root_nodes(case["roots"]))
    assert [mine[id(n)] for n in order] == [n.id for n in nodes]
    assert [n.name() for n in order][0] == "MseLossBackward0"


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")  # 06 reads it on purpose
@pytest.mark.parametrize("script, errors", [("06_retain_grad.py", False), ("08_inplace_error.py", True),
                                            ("10_straight_through.py", False)])
def test_stepping_under_capture_matches_the_trace(script, errors):
    steps_by_call: dict[int, list[dict]] = {}

    def call_hook(index, api, roots, real):
        steps = steps_by_call.setdefault(index, [])
        stepper = BackwardStepper(roots, real, names=capture.names.name_of, on_step=steps.append,
                                  watch=[t for _, t in capture.names.named_tensors()])
        stepper.resume()
        return stepper.run()

    capture = Capture(str(EXAMPLES / script), mode="script", call_hook=call_hook)
    trace = capture.run()
    assert (trace.error is not None) == errors
    assert sorted(steps_by_call) == [c.index for c in trace.calls if c.api != "unreached"]
    for call in trace.calls:
        if call.api == "unreached":
            continue
        by_id = call.node_map()
        steps = steps_by_call[call.index]
        assert steps
        for s in steps:
            assert s["name"] == by_id[s["node"]].name
        final = {}
        for s in steps:
            final.update({k: v["data"] for k, v in s["leaf_grads"].items()})
        if call.api != "autograd.grad":  # autograd.grad returns its grads; AccumulateGrad does not run
            for name, vals in call.leaf_grads.items():  # the trace's grads after the call
                assert final[name] == vals.data
        assert (call.error is not None) == any(s["error"] for s in steps)


def test_step_tracker_matches_step_view():
    """The live, incremental view equals the view recomputed from all steps, at every step."""
    from core.worker.capture.recorder import capture_script
    from core.model.step_state import StepTracker, step_texts, step_view
    from tests.fixtures_graphs import step_record

    trace = capture_script(str(Path(__file__).resolve().parents[3] / "resources" / "examples" / "13_mlp_classifier.py"))
    call = trace.calls[0]
    root = call.nodes[0]
    # preorder: every consumer before the node it feeds
    with_steps = [step_record(i, node) for i, node in enumerate(call.nodes)]
    assert with_steps[0]["node"] == root.id
    tracker = StepTracker(call)
    for k, record in enumerate(with_steps):
        tracker.add(record)
        pending = {"node": with_steps[k + 1]["node"]} if k + 1 < len(with_steps) else None
        full = step_view(call, with_steps[: k + 1], pending)
        fast = tracker.view(pending)
        assert fast.states == full.states
        assert fast.edge_texts == step_texts(call, full)
    assert set(tracker.done) == {n.id for n in call.nodes}


def test_gradient_edge_root_is_one_graph_for_capture_and_stepping(tmp_path):
    script = tmp_path / "edge.py"
    script.write_text(
        "import torch\n"
        "from torch.autograd.graph import get_gradient_edge\n"
        "w = torch.tensor([1.0, 2.0], requires_grad=True)\n"
        "h = w * 3\n"
        "y = (h * h).sum()\n"
        "g = torch.autograd.grad(get_gradient_edge(y), [w], grad_outputs=[torch.ones(())])\n"
    )
    ids: dict[int, list[str]] = {}

    def call_hook(index, api, roots, real):
        nodes, _ = number_nodes(root_nodes(roots))
        ids[index] = [type(n).__name__ for n in nodes]
        return real()

    trace = Capture(str(script), mode="script", call_hook=call_hook).run()
    assert trace.error is None
    (call,) = trace.calls
    assert [n.name for n in call.nodes] == ids[0] == ["SumBackward0", "MulBackward0", "MulBackward0",
                                                         "AccumulateGrad"]


def test_running_on_keeps_leaf_grads_whole_and_edges_short():
    x = torch.randn(50, requires_grad=True)
    loss = (x * 2).sum()
    stepper = BackwardStepper([loss], loss.backward, names=lambda t: "x" if t is x else None)
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("r", stepper.run()), daemon=True)
    thread.start()
    assert stepper.wait_paused(WAIT_S)["name"] == "SumBackward0"
    stepper.step(1)  # one node at a time: every value
    stepper.wait_paused(WAIT_S)
    assert stepper.steps[0]["grad_inputs"][0]["data"] == [1.0] * 50
    stepper.resume()  # running on: the edge keeps its first values, the leaf its whole .grad
    thread.join(WAIT_S)
    mul, acc = stepper.steps[1], stepper.steps[2]
    assert mul["grad_inputs"][0] == {"numel": 50, "sample": [2.0] * 8}
    assert acc["leaf_grads"]["x"]["data"] == [2.0] * 50




def test_a_seed_made_under_inference_mode_is_stepped():
    """An inference tensor has no version counter: the stepper reads its values without one."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    with torch.inference_mode():
        seed = torch.ones(2)
    y = x * 3
    stepper = BackwardStepper([y], lambda: y.backward(gradient=seed), names=namer({"x": x}))
    _, error, _ = drive(stepper)
    assert error is None
    assert [s["name"] for s in stepper.steps] == ["MulBackward0", "AccumulateGrad"]
    assert stepper.steps[0]["grad_outputs"][0]["data"] == [1.0, 1.0]
    assert stepper.steps[-1]["leaf_grads"]["x"]["data"] == [3.0, 3.0]
    assert x.grad.tolist() == [3.0, 3.0]
