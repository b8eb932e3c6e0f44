"""Capture details: names, lines, saved tensors, unreached graphs, loops, storage and views."""

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.worker.capture.recorder import capture_script  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[3] / "resources" / "examples"


def _capture(tmp_path, source: str, **kwargs):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    return capture_script(str(script), **kwargs)


def test_function_locals_and_parameters_are_named(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        from torch import nn
        torch.manual_seed(0)
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(3, 4)
                self.fc2 = nn.Linear(4, 1)
            def forward(self, x):
                hidden = torch.relu(self.fc1(x))
                return self.fc2(hidden)
        model = Net()
        def compute(inputs):
            prediction = model(inputs)
            return prediction.pow(2).mean()
        loss = compute(torch.randn(2, 3))
        loss.backward()
        """)
    call = trace.calls[0]
    labels = {n.name: n.label for n in call.nodes if n.label}
    assert labels["MeanBackward0"] == "loss"
    assert labels["ReluBackward0"] == "hidden"
    assert labels["AddmmBackward0"] in ("prediction", "hidden")
    leaves = {n.label for n in call.nodes if n.kind == "accumulate_grad"}
    assert leaves == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    modules = {n.module for n in call.nodes if n.name == "AddmmBackward0"}
    assert modules == {"fc1", "fc2"}
    relu = next(n for n in call.nodes if n.name == "ReluBackward0")
    assert relu.line == 10


def test_gradients_match_autograd_grad(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        torch.manual_seed(1)
        w = torch.randn(3, 2, requires_grad=True)
        b = torch.randn(2, requires_grad=True)
        x = torch.randn(4, 3)
        y = (x @ w + b).tanh()
        loss = (y * y).sum()
        loss.backward()
        """)
    torch.manual_seed(1)
    w = torch.randn(3, 2, requires_grad=True)
    b = torch.randn(2, requires_grad=True)
    x = torch.randn(4, 3)
    loss = ((x @ w + b).tanh() ** 2).sum()
    gw, gb = torch.autograd.grad(loss, (w, b))
    grads = trace.calls[0].leaf_grads
    assert torch.allclose(torch.tensor(grads["w"].data).reshape(3, 2), gw, atol=1e-6)
    assert torch.allclose(torch.tensor(grads["b"].data), gb, atol=1e-6)
    call = trace.calls[0]
    tanh = next(n for n in call.nodes if n.name == "TanhBackward0")
    saved = {s.name: call.tensor(s.tensor) for s in tanh.saved if s.tensor}
    assert saved["result"].shape == [4, 2]
    assert saved["result"].name == "y"


def test_unreached_graph_and_custom_function(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        class Clip(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clamp(-1, 1)
            @staticmethod
            def backward(ctx, g):
                return g
        a = torch.tensor([0.5, 2.0], requires_grad=True)
        out = Clip.apply(a * 3)
        never = (a + 1).exp().sum()
        """)
    assert trace.call_count == 0
    (call,) = trace.calls
    assert call.api == "unreached"
    roots = sorted(call.node(r).name for r in call.roots)
    assert roots == ["ClipBackward", "SumBackward0"]
    clip = next(n for n in call.nodes if n.name == "ClipBackward")
    assert clip.kind == "custom" and clip.label == "out"


def test_training_loop_stays_small():
    trace = capture_script(str(EXAMPLES / "11_linear_regression_scratch.py"))
    assert trace.call_count == 200
    assert len(trace.calls) == 200
    assert [c.index for c in trace.calls if c.snapshot == "full"] == [0, 1, 2, 199]
    assert len(trace.to_json()) < 5_000_000
    last = trace.calls[-1]
    assert last.nodes and abs(last.leaf_grads["w"].data[0]) < 0.05


def test_views_share_storage_and_versions(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        x = torch.arange(12.0).view(3, 4)
        t = x.t()
        row = x[1]
        flat = x.view(-1)
        d = x.detach()
        c = x.clone()
        row.mul_(2)
        """)
    by = {t.name: t for t in trace.tensors}
    assert by["t"].stride == [1, 4] and by["row"].storage_offset == 4 and by["flat"].stride == [1]
    assert len({by[n].storage for n in ("x", "t", "row", "flat", "d")}) == 1
    assert by["c"].storage != by["x"].storage
    assert by["d"].version == by["x"].version == 1 and by["c"].version == 0
    assert by["t"].base == by["x"].base
    storage = next(s for s in trace.storages if s.id == by["x"].storage)
    assert storage.nbytes == 48 and set(storage.tensors) >= {by[n].id for n in ("x", "t", "row", "flat", "d")}


def test_stale_saved_tensor_is_reported_before_backward():
    trace = capture_script(str(EXAMPLES / "08_inplace_error.py"))
    call = trace.calls[0]
    stale = [n for n in call.nodes if n.stale]
    assert [n.name for n in stale] == ["SigmoidBackward0"]
    assert (stale[0].stale.saved, stale[0].stale.saved_version, stale[0].stale.version) == ("result", 0, 1)
    assert (stale[0].stale.op, stale[0].stale.op_line) == ("mul_", 12)
    assert call.error.type == "RuntimeError"


def test_create_graph_and_second_order(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        x = torch.tensor(2.0, requires_grad=True)
        y = x ** 3
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        (h,) = torch.autograd.grad(g, x)
        """)
    first, second = trace.calls
    assert first.options["create_graph"] is True
    assert first.leaf_grads["x"].data == [12.0]
    assert second.leaf_grads["x"].data == [12.0]
    assert second.node(second.roots[0]).label == "g"


def test_device_mismatch_names_the_op_and_both_tensors(tmp_path):
    # The meta device stands in for a second device on machines without a GPU.
    trace = _capture(tmp_path, """\
        import torch
        weights = torch.ones(2, device="meta", requires_grad=True)
        inputs = torch.ones(2)
        out = weights * inputs
        """)
    err = trace.error
    assert err.type == "RuntimeError" and err.line == 4
    assert "In mul() at line 4: weights is on meta (shape [2]); inputs is on cpu (shape [2])." in err.message


def test_inplace_nodes_and_devices_are_marked():
    trace = capture_script(str(EXAMPLES / "08_inplace_error.py"))
    nodes = {n.name: n for n in trace.calls[0].nodes}
    assert nodes["MulBackward0"].inplace == "mul_"
    assert nodes["SigmoidBackward0"].inplace is None
    assert nodes["SigmoidBackward0"].device == "cpu"


def test_statistics_of_a_big_tensor_are_exact(tmp_path):
    from core.worker.capture.values import values_of

    torch.manual_seed(3)
    t = torch.randn(3_000_000) * 0.1 + 0.01
    t[1_234_567] = 7.5  # one extreme value a strided sample would miss
    t[2_345_671] = -6.25
    values = values_of(t)
    assert values.numel == 3_000_000 and values.approx is False
    assert values.max == 7.5 and values.min == -6.25
    assert values.mean == pytest.approx(t.double().mean().item(), rel=1e-5)
    assert values.sample == t[:24].tolist()
    # A transposed (non-contiguous) view gives the same statistics, read in row-major order.
    view = t.reshape(1500, 2000).t()
    vals = values_of(view)
    assert (vals.min, vals.max) == (-6.25, 7.5)
    assert vals.sample == view.reshape(-1)[:24].tolist()


def test_statistics_past_the_exact_budget_are_marked_approximate(tmp_path):
    from core.worker.capture.values import ValueBatch

    torch.manual_seed(4)
    tensors = [torch.randn(100_000) for _ in range(3)]
    batch = ValueBatch(cpu_budget=150_000)
    out = [{} for _ in tensors]
    for target, t in zip(out, tensors):
        batch.add(target, "v", t, full=False)
    batch.flush()
    first, second, third = (o["v"] for o in out)
    assert first.approx is False and first.max == tensors[0].max().item()
    assert second.approx is True and third.approx is True
    sample = tensors[1][:: 100_000 // 4096][:4096]
    assert second.max == sample.max().item() and second.min == sample.min().item()
    assert second.sample == tensors[1][:24].tolist()
    # The trace says so, and only where it is true.
    from core.model.trace_json import _plain

    assert _plain(second)["approx"] is True and "approx" not in _plain(first)


def test_a_warning_names_the_script_line(tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = _capture(tmp_path, """\
            import torch
            x = torch.ones(2, requires_grad=True)
            y = x * 2
            y.sum().backward()
            print(y.grad)
            """)
    assert trace.error is None
    grad_warnings = [w for w in caught if "not a leaf Tensor" in str(w.message)]
    assert len(grad_warnings) == 1
    assert Path(grad_warnings[0].filename) == tmp_path / "script.py"
    assert grad_warnings[0].lineno == 5


def test_capture_holds_no_activation_through_backward(tmp_path):
    from core.worker.capture.recorder import Capture

    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""\
        import weakref
        import torch
        w = torch.randn(4, 4, requires_grad=True)
        def forward():
            hidden = torch.randn(8, 4) @ w
            return hidden.sin().sum(), weakref.ref(hidden)
        loss, ref = forward()
        alive = [ref() is not None]
        w.register_hook(lambda g: alive.append(ref() is not None))
        loss.backward()
        """))
    capture = Capture(str(script))
    trace = capture.run()
    assert trace.error is None, trace.error.message
    call = trace.calls[0]
    sin = next(n for n in call.nodes if n.name == "SinBackward0")
    assert call.tensor(sin.saved[0].tensor).name == "hidden"
    # Only SinBackward0 holds `hidden`; the engine frees it once that node ran, before w's grad,
    # and the capture must not keep it alive longer.
    assert capture.namespace["alive"] == [True, False]


def test_cuda_samples_carry_host_rss():
    from core.worker.memory_sources import CpuSource, CudaSource

    class Allocator:  # torch.cuda's counters, without a GPU
        @staticmethod
        def memory_stats(index):
            return {"allocated_bytes.all.current": 1024, "reserved_bytes.all.current": 2048,
                    "allocated_bytes.all.peak": 4096}

    source = CudaSource("cuda:0")
    source._cuda = Allocator()
    sample = source.read()
    assert (sample["allocated"], sample["reserved"], sample["max_allocated"]) == (1024, 2048, 4096)
    host = CpuSource().read()["rss"]
    assert sample["rss"] > 0 and abs(sample["rss"] - host) < 64 << 20


def test_an_error_inside_an_op_shows_the_script_traceback_only(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        a = torch.randn(2, 3, requires_grad=True)
        def f(x):
            return x @ torch.randn(4, 2)
        y = f(a)
        """)
    err = trace.error
    assert err.type == "RuntimeError" and err.line == 4
    lines = err.traceback.strip().splitlines()
    assert lines[-1] == "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x2)"
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    assert frames == [f'File "{tmp_path / "script.py"}", line 5, in <module>',
                      f'File "{tmp_path / "script.py"}", line 4, in f']


def test_a_stop_after_the_scripts_code_has_ended_is_dropped(tmp_path, sigint_gate):
    """Stop (``interrupt_main``) can land once the script's code has ended, while the capture
    builds the trace: the worker's SIGINT handler drops it then (``core.worker.interrupts``), so
    the finished run is not reported as stopped, nor its trace lost to a KeyboardInterrupt in the
    capture's own code. With Python's own handler the same Stop marks the run as cancelled."""
    import _thread
    import signal

    from core.worker.capture.recorder import Capture

    gate = sigint_gate
    script = tmp_path / "script.py"
    script.write_text("import torch\nw = torch.ones(3, requires_grad=True)\n(w * 2).sum().backward()\n")
    for handler in ("gate", "python"):
        gate.start()
        if handler == "python":
            signal.signal(signal.SIGINT, signal.default_int_handler)
        capture = Capture(str(script), mode="script")

        def ended():
            gate.script_ended()
            _thread.interrupt_main()  # the Stop comes just as the script's last line has run

        capture.script_ended = ended
        trace = capture.run()
        assert [n.name for n in trace.calls[0].nodes][:2] == ["SumBackward0", "MulBackward0"]
        assert trace.calls[0].leaf_grads["w"].data == [2.0, 2.0, 2.0]
        if handler == "gate":
            assert trace.error is None
        else:
            assert trace.error.kind == "cancelled"
