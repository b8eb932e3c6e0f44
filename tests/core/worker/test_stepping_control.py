"""Driving a backward stepper: step counts, run-to, stop, failures at their node, its states, and
what it frees and keeps alive."""

from __future__ import annotations

import gc
import json
import threading
import weakref

import pytest
import torch

from core.protocol.messages import StepEnd, StepperState
from core.worker.stepper import BackwardStepper, StepperStopped, engine_order, step_all
from tests.core.worker.test_stepping import WAIT_S, drive, in_thread, mlp_case, namer, shared_case, stepped


def test_step_count_run_to_and_resume():
    case = mlp_case()
    twin = mlp_case()
    order = engine_order(twin["roots"], twin["real"])
    stepper = BackwardStepper(case["roots"], case["real"])
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", stepper.run()), daemon=True)
    thread.start()
    try:
        assert stepper.wait_paused(WAIT_S)["node"] == order[0]
        stepper.step(3)
        assert stepper.wait_paused(WAIT_S)["node"] == order[3]
        assert len(stepper.steps) == 3
        stepper.run_to(order[7])
        assert stepper.wait_paused(WAIT_S)["node"] == order[7]
        assert stepper.pending["node"] == order[7]
        stepper.run_to(order[7])  # already next: stays paused
        assert stepper.wait_paused(WAIT_S)["node"] == order[7]
        stepper.resume()
        assert stepper.wait_paused(WAIT_S) is None
        thread.join(WAIT_S)
    finally:
        if thread.is_alive():
            stepper.stop()
            thread.join(5)
    assert not thread.is_alive()
    assert stepper.state is StepperState.FINISHED
    assert [s["node"] for s in stepper.steps] == order


def test_run_to_unknown_node_runs_to_end():
    case = shared_case()
    stepper = BackwardStepper(case["roots"], case["real"])
    stepper.run_to("n999")
    in_thread(stepper.run)
    assert stepper.state is StepperState.FINISHED
    torch.testing.assert_close(case["named"]["x"].grad, shared_case()["ref"]()[0])


def test_step_all_and_callbacks():
    case = mlp_case()
    seen = []
    result, steps = step_all(case["roots"], case["real"], on_step=seen.append, names=namer(case["named"]))
    assert result is None
    assert seen == steps
    twin = mlp_case()
    assert [s["node"] for s in steps] == engine_order(twin["roots"], twin["real"])
    json.dumps(steps)


def test_failing_callback_does_not_break_backward():
    case = shared_case()

    def bad(record):
        raise ValueError("callback bug")

    _, steps = step_all(case["roots"], case["real"], on_step=bad)
    assert steps and all(s["error"] is None for s in steps)
    torch.testing.assert_close(case["named"]["x"].grad, shared_case()["ref"]()[0])


def test_stop_midway_then_fresh_backwards():
    case = mlp_case()
    loss = case["roots"][0]
    stepper = BackwardStepper([loss], lambda: loss.backward(retain_graph=True))
    _, error, pendings = drive(stepper, stop_after=2)
    assert isinstance(error, StepperStopped)
    assert stepper.state is StepperState.STOPPED
    assert len(stepper.steps) == 2 and len(pendings) == 2
    assert stepper.wait_paused(0) is None

    # The same graph again, unstepped: a hook left behind would block or raise here.
    for p in case["named"].values():
        p.grad = None
    in_thread(lambda: loss.backward())
    for p, want in zip(case["named"].values(), mlp_case()["ref"]()):
        torch.testing.assert_close(p.grad, want)

    # A fresh graph over new parameters, stepped to the end.
    fresh = mlp_case()
    again, _ = stepped(fresh)
    twin = mlp_case()
    assert [s["node"] for s in again.steps] == engine_order(twin["roots"], twin["real"])


def test_stop_before_run():
    case = shared_case()
    stepper = BackwardStepper(case["roots"], case["real"])
    stepper.stop()
    with pytest.raises(StepperStopped):
        in_thread(stepper.run)
    assert stepper.state is StepperState.STOPPED and stepper.steps == []
    assert case["named"]["x"].grad is None


def test_finished_stepper_leaves_no_hooks():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = (x * 2).sum()
    stepper = BackwardStepper([y], lambda: y.backward(retain_graph=True))
    _, error, _ = drive(stepper)
    assert error is None and len(stepper.steps) == 3
    in_thread(lambda: y.backward())  # a leftover pre-hook would pause this forever
    assert len(stepper.steps) == 3  # a leftover post hook would record more steps
    assert x.grad.tolist() == [4.0, 4.0, 4.0]


def test_inplace_error_fails_at_sigmoid():
    def build():
        torch.manual_seed(0)
        a = torch.randn(3, requires_grad=True)
        b = a.sigmoid()
        b.mul_(2)
        return a, b.sum()

    a, loss = build()
    stepper = BackwardStepper([loss], lambda: loss.backward())
    _, error, pendings = drive(stepper)
    assert isinstance(error, RuntimeError)
    assert "modified by an inplace operation" in str(error)
    assert stepper.state is StepperState.FAILED and stepper.error is error
    assert [s["name"] for s in stepper.steps] == ["SumBackward0", "MulBackward0", "SigmoidBackward0"]
    failed = stepper.steps[-1]
    assert failed["error"] == {"type": "RuntimeError", "message": str(error)}
    assert failed["grad_inputs"] == [] and failed["grad_outputs"][0]["numel"] == 3
    assert [s["error"] for s in stepper.steps[:-1]] == [None, None]
    assert [p["node"] for p in pendings] == [s["node"] for s in stepper.steps]
    assert a.grad is None

    a2, loss2 = build()
    order: list[str] = []
    with pytest.raises(RuntimeError, match="inplace"):
        engine_order([loss2], lambda: loss2.backward(), order)
    assert [s["node"] for s in stepper.steps] == order


def test_backward_twice_fails_at_first_saved_tensor():
    x = torch.tensor(2.0, requires_grad=True)
    w = torch.tensor(5.0, requires_grad=True)
    loss = (x * w).sum()
    loss.backward()
    stepper = BackwardStepper([loss], lambda: loss.backward(), names=namer({"x": x, "w": w}))
    _, error, _ = drive(stepper)
    assert isinstance(error, RuntimeError)
    assert "backward through the graph a second time" in str(error)
    assert stepper.state is StepperState.FAILED
    # SumBackward0 keeps only sizes and runs again; MulBackward0 needs its freed saved x and w.
    assert [(s["name"], s["error"] is None) for s in stepper.steps] == [("SumBackward0", True),
                                                                        ("MulBackward0", False)]
    assert (x.grad.item(), w.grad.item()) == (5.0, 2.0)  # untouched by the failed call


def test_stepper_states_while_stepping_three_nodes():
    a = torch.ones(2, requires_grad=True)
    loss = (a * 2).sum()  # SumBackward0, MulBackward0, AccumulateGrad
    seen = []
    stepper = BackwardStepper([loss], loss.backward, on_pause=lambda r: seen.append((r["name"], stepper.state)),
                              on_step=lambda r: seen.append((r["name"], stepper.state)))
    assert stepper.state is StepperState.IDLE
    _, error, pendings = drive(stepper)
    assert error is None and len(pendings) == 3
    # Paused before each node, running while it executes, finished once backward returned.
    assert seen == [(name, state) for name in ("SumBackward0", "MulBackward0", "AccumulateGrad")
                    for state in (StepperState.PAUSED, StepperState.RUNNING)]
    assert stepper.state is StepperState.FINISHED and a.grad.tolist() == [2.0, 2.0]
    # The end message carries the state's plain string.
    end = json.loads(json.dumps(StepEnd(call=0, state=stepper.state.value).to_dict()))
    assert end["state"] == "finished" and type(end["state"]) is str and str(stepper.state) == "finished"


def test_runs_once():
    case = shared_case()
    stepper = BackwardStepper(case["roots"], case["real"])
    stepper.resume()
    in_thread(stepper.run)
    with pytest.raises(RuntimeError, match="one backward call"):
        stepper.run()


def test_stop_frees_queued_gradients_on_the_script_thread():
    x = torch.randn(4, requires_grad=True)
    u, v = x.exp(), x.sin()
    mul = u * v
    loss = mul.sum()
    refs = []
    handle = mul.grad_fn.register_hook(lambda grad_inputs, _: refs.extend(weakref.ref(g) for g in grad_inputs))
    stepper = BackwardStepper([loss], lambda: loss.backward())
    alive_after = []

    def script():
        with pytest.raises(StepperStopped):
            stepper.run()
        gc.collect()
        alive_after.append(sum(r() is not None for r in refs))  # still on the script thread

    thread = threading.Thread(target=script, daemon=True)
    thread.start()
    try:
        for _ in range(2):  # SumBackward0, MulBackward0; then paused before Exp or Sin
            assert stepper.wait_paused(WAIT_S) is not None
            stepper.step()
        assert stepper.wait_paused(WAIT_S)["name"] in ("ExpBackward0", "SinBackward0")
        stepper.stop()
        thread.join(WAIT_S)
    finally:
        handle.remove()
        if thread.is_alive():
            stepper.stop()
            thread.join(5)
    assert not thread.is_alive()
    assert len(refs) == 2
    # The node that never ran kept its input in the thread's ready queue until drained.
    assert alive_after == [0]


def test_stepper_keeps_no_graph_alive():
    x = torch.randn(3, requires_grad=True)
    h = x * 2
    h.retain_grad()
    loss = (h * h).sum()  # MulBackward0 saves h itself
    ref = weakref.ref(h)
    stepper = BackwardStepper([loss], lambda: loss.backward(retain_graph=True), watch=[h])
    stepper.resume()
    in_thread(stepper.run)
    assert len(stepper.steps) == 4
    del loss, h
    gc.collect()
    assert ref() is None  # the stepper, still referenced here, holds no part of the graph


def test_pause_after_resume():
    case = mlp_case()
    twin = mlp_case()
    order = engine_order(twin["roots"], twin["real"])
    stepper = BackwardStepper(case["roots"], case["real"],
                              on_step=lambda record: stepper.pause() if record["index"] == 2 else None)
    stepper.resume()
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", stepper.run()), daemon=True)
    thread.start()
    try:
        assert stepper.wait_paused(WAIT_S)["node"] == order[3]
        assert len(stepper.steps) == 3
        stepper.resume()
        thread.join(WAIT_S)
    finally:
        if thread.is_alive():
            stepper.stop()
            thread.join(5)
    assert stepper.state is StepperState.FINISHED
    assert [s["node"] for s in stepper.steps] == order


def test_step_to_fills_the_batched_previews_before_pausing():
    x = torch.randn(50, requires_grad=True)
    w = torch.randn(50, requires_grad=True)
    loss = ((x * 2) * w).sum()
    stepper = BackwardStepper([loss], loss.backward, names=lambda t: {id(x): "x", id(w): "w"}.get(id(t)))
    thread = threading.Thread(target=stepper.run, daemon=True)
    thread.start()
    assert stepper.wait_paused(WAIT_S)["name"] == "SumBackward0"
    stepper.run_to("never")  # runs on to the end: every preview is read in one batch
    thread.join(WAIT_S)
    assert stepper.state is StepperState.FINISHED
    outer, inner = [s for s in stepper.steps if s["name"] == "MulBackward0"]
    assert outer["grad_outputs"][0] == {"numel": 50, "sample": [1.0] * 8}
    assert inner["grad_outputs"][0] == {"numel": 50, "sample": w[:8].tolist()}
    leaves = {k: v for s in stepper.steps for k, v in s["leaf_grads"].items()}
    assert torch.equal(torch.tensor(leaves["w"]["data"]), (x * 2).detach())
    assert torch.equal(torch.tensor(leaves["x"]["data"]), (2 * w).detach())
    assert leaves["x"]["data"] == x.grad.tolist() and leaves["w"]["data"] == w.grad.tolist()
