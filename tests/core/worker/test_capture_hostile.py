"""Scripts that use the corners of torch (torch.compile, dispatch modes, inference mode, nested
tensors, saved-tensor hooks, model outputs that are dataclasses) or hand the capture odd objects:
each prints, computes and ends under capture exactly as under plain ``python``.

Each script prints ``OUT ...`` lines (compared with a plain run's) and ``GRAD name [...]`` lines
(compared with the gradients the capture recorded).
"""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.client.handle import run_capture

TIMEOUT = 240  # seconds a run may take: torch.compile traces for a while on a loaded machine


def _write(tmp_path: Path, source: str, name: str = "script.py") -> Path:
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    return script


def _plain(script: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], cwd=str(script.parent), capture_output=True, text=True,
                          timeout=TIMEOUT)


def _lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def _grads(text: str, prefix: str = "GRAD ") -> dict[str, list]:
    """``name -> flat values`` of the lines ``GRAD name [...]`` (or another prefix) a script printed."""
    out = {}
    for line in _lines(text, prefix):
        _, name, values = line.split(" ", 2)
        out[name] = _flat(ast.literal_eval(values))
    return out


def _flat(values) -> list:
    if not isinstance(values, list):
        return [values]
    return [v for item in values for v in _flat(item)]


def _same_as_python(tmp_path: Path, source: str, name: str = "script.py"):
    """Run the script plainly and under capture; both print the same OUT lines. The capture's result."""
    script = _write(tmp_path, source, name)
    plain = _plain(script)
    assert plain.returncode == 0, plain.stderr
    result = run_capture(str(script), timeout=TIMEOUT)
    assert _lines(result.output, "OUT ") == _lines(plain.stdout, "OUT "), result.output
    assert _lines(plain.stdout, "OUT ")  # the comparison saw something
    return result, plain


def _assert_grads_recorded(call, plain_stdout: str) -> None:
    expected = _grads(plain_stdout)
    assert expected
    for name, values in expected.items():
        assert call.leaf_grads[name].data == values, name


# -- torch.compile and dispatch modes --------------------------------------------------------


@pytest.mark.slow
def test_a_function_compiled_with_aot_eager_runs_and_is_one_call(tmp_path):
    result, plain = _same_as_python(tmp_path, """\
        import torch
        torch.manual_seed(0)
        def f(x, w):
            return (x @ w).relu().sum()
        cf = torch.compile(f, backend="aot_eager")
        x = torch.randn(3, 4)
        w = torch.randn(4, 2, requires_grad=True)
        loss = cf(x, w)
        print("OUT loss", loss.item())
        loss.backward()
        print("GRAD w", w.grad.tolist())
        """)
    trace = result.trace
    assert trace.error is None
    # compile's own autograd.grad (AOTAutograd tracing its joint graph) is not the script's call
    assert trace.call_count == 1
    assert [c.api for c in trace.calls] == ["Tensor.backward"]
    _assert_grads_recorded(trace.calls[0], plain.stdout)


@pytest.mark.slow
def test_a_scripts_dispatch_mode_sees_only_the_scripts_ops(tmp_path):
    result, plain = _same_as_python(tmp_path, """\
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        class Count(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops = []
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(str(func))
                return func(*args, **(kwargs or {}))
        torch.manual_seed(0)
        w = torch.randn(3, requires_grad=True)
        with Count() as mode:
            y = (w * 2).sin().sum()
            y.backward()
        print("OUT ops", len(mode.ops), sorted(set(mode.ops)))
        print("GRAD w", w.grad.tolist())
        """)
    assert result.trace.error is None
    assert result.trace.call_count == 1
    _assert_grads_recorded(result.trace.calls[0], plain.stdout)


@pytest.mark.slow
def test_a_function_over_jagged_nested_tensors_compiles_under_capture(tmp_path):
    result, plain = _same_as_python(tmp_path, """\
        import torch
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 2)
        def f(nt):
            return lin(nt).sin()
        cf = torch.compile(f, backend="aot_eager", fullgraph=True)
        nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged)
        out = cf(nt)
        out.values().sum().backward()
        print("OUT done", out.values().shape)
        print("GRAD lin.weight", lin.weight.grad.tolist())
        """)
    assert result.trace.error is None
    assert result.trace.call_count == 1
    _assert_grads_recorded(result.trace.calls[0], plain.stdout)


COMPILED = """\
    import torch
    import torch._dynamo
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    def f(x):
        import math
        h = m(x).sum() * math.pi
        {extra}
        return h.exp()
    x = torch.randn(3, 4)
    ex = torch._dynamo.explain(f)(x)
    print("OUT graphs", ex.graph_count, "breaks", ex.graph_break_count)
    print("OUT graph ops", [len(g.graph.nodes) for g in ex.graphs])
    print("OUT reasons", sorted(str(b.reason).splitlines()[0] for b in ex.break_reasons))
    loss = torch.compile(f, backend="eager")(x)
    loss.backward()
    print("GRAD 0.weight", m[0].weight.grad.tolist())  # the one model's parameters go by their paths
    """


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["pass", "print('OUT inside')"], ids=["one-graph", "a-graph-break"])
def test_torch_compile_sees_the_graphs_and_breaks_of_a_plain_run(tmp_path, extra):
    """No graph break on the capture's sys._getframe, sys.settrace or __import__, and none of the
    capture's own frames compiled as graphs of their own. (The graphs hold the same ops; one
    spelling differs: under any TorchFunctionMode, Dynamo writes ``h * math.pi`` as the method
    ``mul`` rather than ``operator.mul``, so ``explain``'s op_count, which counts functions only,
    is not compared.)"""
    result, plain = _same_as_python(tmp_path, COMPILED.replace("{extra}", extra))
    assert _lines(plain.stdout, "OUT graphs")[0] == ("OUT graphs 1 breaks 0" if extra == "pass"
                                                      else "OUT graphs 2 breaks 1")
    assert result.trace.error is None
    assert result.trace.call_count == 1
    _assert_grads_recorded(result.trace.calls[0], plain.stdout)


# -- inference mode, model outputs, nested tensors --------------------------------------------


@pytest.mark.slow
def test_tensors_made_under_inference_mode_are_read_without_their_version(tmp_path):
    result, plain = _same_as_python(tmp_path, """\
        import torch
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2)
        with torch.inference_mode():
            out = m(torch.ones(1, 3))
            buf = torch.ones(3)
            buf.add_(1)  # in place on an inference tensor
        print("OUT eval", out.tolist(), buf.tolist())
        print("VALUE out", out.tolist())
        x = torch.randn(2, 3, requires_grad=True)
        loss = (m(x) ** 2).sum() + (x * buf.clone()).sum()
        loss.backward()
        print("OUT after", out.clone().sum().item())
        print("GRAD x", x.grad.tolist())
        print("GRAD m.weight", m.weight.grad.tolist())
        """)
    trace = result.trace
    assert trace.error is None
    assert trace.call_count == 1
    _assert_grads_recorded(trace.calls[0], plain.stdout)
    out = {t.name: t for t in trace.tensors}["out"]
    assert (out.version, out.values.data) == (0, _grads(plain.stdout, "VALUE ")["out"])


MODEL_OUTPUT = """\
    import torch
    from collections import OrderedDict
    from dataclasses import dataclass

    @dataclass
    class Output(OrderedDict):  # as a Hugging Face ModelOutput: an OrderedDict and a dataclass
        loss: torch.Tensor = None
        logits: torch.Tensor = None
        def __post_init__(self):
            for key in ("loss", "logits"):
                if getattr(self, key) is not None:
                    self[key] = getattr(self, key)

    class Net(torch.nn.Module):
        def __init__(self, with_loss):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.with_loss = with_loss
        def forward(self, x):
            logits = self.fc(x)
            return Output(loss=(logits ** 2).mean() if self.with_loss else None, logits=logits)

    torch.manual_seed(0)
    model = Net({with_loss})
    example_input = torch.randn(2, 4)
    if __name__ == "__main__" and "{plain}" == "yes":
        out = model(example_input)
        (out.loss if out.loss is not None else out.logits.sum()).backward()
        print("GRAD fc.weight", model.fc.weight.grad.tolist())
    """


@pytest.mark.slow
@pytest.mark.parametrize("with_loss", [False, True], ids=["logits", "loss"])
def test_a_model_returning_a_model_output_takes_its_loss_or_logits(tmp_path, with_loss):
    reference = _write(tmp_path, MODEL_OUTPUT.format(with_loss=with_loss, plain="yes"), "reference.py")
    plain = _plain(reference)
    assert plain.returncode == 0, plain.stderr
    model = _write(tmp_path, MODEL_OUTPUT.format(with_loss=with_loss, plain="no"), "model.py")
    trace = run_capture(str(model), timeout=TIMEOUT).trace
    assert trace.error is None, trace.error
    assert trace.mode == "model" and trace.call_count == 1
    _assert_grads_recorded(trace.calls[0], plain.stdout)


@pytest.mark.slow
def test_jagged_nested_tensors_through_linear_and_backward_arrive_whole(tmp_path):
    result, plain = _same_as_python(tmp_path, """\
        import torch
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 2)
        nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], layout=torch.jagged,
                                        requires_grad=True)
        out = lin(nt)
        out.values().sum().backward()
        print("OUT shape", out.values().shape)
        print("GRAD lin.weight", lin.weight.grad.tolist())
        print("GRAD nt", nt.grad.values().tolist())
        """)
    trace = result.trace
    assert trace.error is None, trace.error
    assert trace.call_count == 1 and [c.api for c in trace.calls] == ["Tensor.backward"]
    first = trace.calls[0]
    assert first.leaf_grads["lin.weight"].data == _grads(plain.stdout)["lin.weight"]
    assert first.leaf_grads["nt"].numel == len(_grads(plain.stdout)["nt"]) == 20  # a nested grad: its size
    # the ragged dim has no one size: its largest component's, as to_padded_tensor makes it
    shapes = {t.name: t.shape for t in first.tensors if t.name}
    assert shapes["nt"] == [2, 3, 4] and shapes["out"] == [2, 3, 2]


@pytest.mark.slow
def test_a_strided_nested_tensor_in_a_graph_never_backwarded_is_captured(tmp_path):
    result, _ = _same_as_python(tmp_path, """\
        import torch
        nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], requires_grad=True)
        y = (nt * 2).sin()
        print("OUT made", y.is_nested, y.size(0))
        """)
    trace = result.trace
    assert trace.error is None, trace.error
    assert trace.call_count == 0
    (unreached,) = trace.calls
    assert unreached.api == "unreached"
    assert [n.name for n in unreached.nodes][:2] == ["SinBackward0", "MulBackward0"]
    assert {t.name: t.shape for t in unreached.tensors if t.name}["nt"] == [2, 4, 3]


# -- saved-tensor hooks ------------------------------------------------------------------------


@pytest.mark.slow
def test_saved_tensors_packed_by_the_scripts_hooks_are_left_to_its_backward(tmp_path):
    """The tutorial's delete-on-unpack hooks: unpacked once, by the script's backward."""
    result, plain = _same_as_python(tmp_path, """\
        import os, tempfile, uuid
        import torch
        folder = tempfile.mkdtemp()
        def pack(t):
            print("OUT Packing")
            path = os.path.join(folder, str(uuid.uuid4()))
            torch.save(t, path)
            return path
        def unpack(path):
            print("OUT Unpacking")
            t = torch.load(path)
            os.remove(path)
            return t
        torch.manual_seed(0)
        x = torch.randn(5, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            y = x.pow(2)
        z = x.exp()  # saved without hooks: its snapshot shows it
        (y.sum() + z.sum()).backward()
        print("OUT left", os.listdir(folder))
        print("GRAD x", x.grad.tolist())
        """)
    assert _lines(plain.stdout, "OUT ")[:2] == ["OUT Packing", "OUT Unpacking"]
    trace = result.trace
    assert trace.error is None, trace.error
    assert trace.call_count == 1
    call = trace.calls[0]
    _assert_grads_recorded(call, plain.stdout)
    saved = {n.name: {s.name: s for s in n.saved} for n in call.nodes if n.saved}
    packed = saved["PowBackward0"]["self"]
    assert (packed.value, packed.tensor) == ("packed by the script's hook", None)
    assert saved["PowBackward0"]["exponent"].value == 2
    assert saved["ExpBackward0"]["result"].tensor is not None


# -- odd objects -------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_exception_whose_str_raises_is_reported_and_loses_no_call(tmp_path):
    script = _write(tmp_path, """\
        import torch
        class BadStr(Exception):
            def __str__(self):
                raise ValueError("no str for you")
        w = torch.ones(3, requires_grad=True)
        def hook(g):
            raise BadStr()
        for i in range(3):
            try:
                y = (w * (i + 1)).sum()
                if i == 1:
                    y.register_hook(hook)
                y.backward()
            except BadStr:
                print("OUT caught", i)
        print("OUT grad", w.grad.tolist())
        raise BadStr()
        """)
    plain = _plain(script)
    assert plain.returncode == 1 and "BadStr: <exception str() failed>" in plain.stderr
    result = run_capture(str(script), timeout=TIMEOUT)
    assert _lines(result.output, "OUT ") == _lines(plain.stdout, "OUT ") == [
        "OUT caught 1", "OUT grad [4.0, 4.0, 4.0]"]
    trace = result.trace
    assert trace.call_count == 3 and len(trace.calls) == 3
    assert trace.calls[1].error.type == "BadStr"
    assert trace.calls[1].error.message == "<str() raised ValueError>"
    err = trace.error
    assert (err.type, err.message, err.line) == ("BadStr", "<str() raised ValueError>", 17)


@pytest.mark.slow
def test_a_tensor_subclass_whose_shape_raises_and_a_global_that_refuses_attributes(tmp_path):
    result, plain = _same_as_python(tmp_path, """\
        import torch
        class Hostile:
            def __getattribute__(self, name):
                raise RuntimeError("touch me not: " + name)
        class Shapeless(torch.Tensor):
            @property
            def shape(self):
                raise RuntimeError("no shape")
        guard = Hostile()
        crowd = [Hostile(), torch.ones(2)]
        w = torch.ones(3, requires_grad=True)
        s = torch.full((3,), 2.0).as_subclass(Shapeless)  # torch reads no shape of it: the capture does
        for i in range(3):
            loss = (w * 2 * (i + 1)).sum()
            loss.backward()
            print("OUT step", i, w.grad.tolist())
        print("GRAD w", w.grad.tolist())
        """)
    assert plain.returncode == 0
    trace = result.trace
    assert trace.error is None, trace.error
    assert trace.call_count == 3
    _assert_grads_recorded(trace.calls[-1], plain.stdout)
    assert {t.name: t.shape for t in trace.tensors if t.name}["s"] == []  # its shape could not be read
