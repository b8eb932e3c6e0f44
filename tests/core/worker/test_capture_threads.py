"""Backward calls from the script's threads: each is captured, none is taken for nested."""

import json
import textwrap
import threading

import pytest

torch = pytest.importorskip("torch")

from core.worker.capture import call_record  # noqa: E402
from core.worker.capture.recorder import capture_script  # noqa: E402

THREADS = """\
    import json
    import threading
    import torch

    barrier = threading.Barrier(8)
    results = []  # every thread call's gradient, as torch computed it


    def work(k):
        barrier.wait()  # all eight threads call backward at once
        for i in range(20):
            v = torch.randn(4, requires_grad=True)
            (g,) = torch.autograd.grad((v * v * (100.0 * (k + 1) + i)).sum(), v)
            results.append(g.tolist())


    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (a * 2).sum().backward()
    (a ** 2).sum().backward()
    json.dump(results, open(__file__ + ".json", "w"))
    """


def test_calls_from_eight_threads_at_once_are_all_captured(tmp_path):
    script = tmp_path / "threads.py"
    script.write_text(textwrap.dedent(THREADS))
    trace = capture_script(str(script), mode="script")
    assert trace.error is None, trace.error
    assert trace.call_count == 162
    assert len(trace.calls) == 162
    assert all("nested_in" not in c.options and "nested" not in c.options for c in trace.calls)
    threaded = [c for c in trace.calls if c.api == "autograd.grad"]
    assert len(threaded) == 160 and {c.line for c in threaded} == {13}
    by_torch = json.loads((tmp_path / "threads.py.json").read_text())
    captured = [c.options["results"][0]["values"]["data"] for c in threaded]
    assert sorted(captured) == sorted(by_torch)
    main = [c for c in trace.calls if c.api == "Tensor.backward"]
    assert [(c.line, c.leaf_grads["a"].data) for c in main] == [(23, [2.0, 2.0, 2.0]), (24, [4.0, 6.0, 8.0])]


CHECKPOINT = """\
    import torch
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    hidden = checkpoint(lambda t: torch.relu(layer(t)), x, use_reentrant=True)
    loss = hidden.sum()
    loss.backward()
    """


def test_a_checkpoint_run_on_the_engines_own_thread_is_nested_in_its_call(tmp_path, monkeypatch):
    # On CUDA the engine runs CheckpointFunctionBackward, and so the backward it calls on the
    # recomputed graph, on a device thread of its own: that call is nested though no call runs
    # on its thread. Here the node's backward is moved to another thread, where the node is the
    # one the engine reports running, as it is there.
    checkpoint_fn = torch.utils.checkpoint.CheckpointFunction
    real_backward = checkpoint_fn.backward
    running = threading.local()

    def on_device_thread(ctx, *grads):
        out = {}

        def run():
            running.node = ctx
            out["grads"] = real_backward(ctx, *grads)

        t = threading.Thread(target=run)
        t.start()
        t.join()
        return out["grads"]

    monkeypatch.setattr(checkpoint_fn, "backward", staticmethod(on_device_thread))
    monkeypatch.setattr(call_record, "_current_node", lambda: getattr(running, "node", None))
    script = tmp_path / "checkpointed.py"
    script.write_text(textwrap.dedent(CHECKPOINT))
    trace = capture_script(str(script), mode="script")
    assert trace.error is None, trace.error
    assert trace.call_count == 2
    inner, outer = trace.calls
    assert (inner.api, inner.options["nested_in"], inner.options["inside"]) == (
        "autograd.backward", 0, "CheckpointFunctionBackward")
    assert (outer.index, outer.options["nested"]) == (0, [1])
    assert sorted(inner.leaf_grads) == ["layer.bias", "layer.weight"]
