"""Saved models open like model files: forward, a sum as the loss, backward, with exact leaf grads."""

import io
import json
import sys
import textwrap
from contextlib import redirect_stdout

import pytest

torch = pytest.importorskip("torch")

from core.worker.capture.recorder import capture_script  # noqa: E402
from core.client.handle import run_capture  # noqa: E402
from core.programs.model_files import example_inputs  # noqa: E402
from core.programs.model_kinds import ModelFileError, model_kind, parse_shapes  # noqa: E402
from core.programs.program import ProgramError, display_source, file_kind, load_program  # noqa: E402

NET_PY = textwrap.dedent("""\
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 3)
            self.fc2 = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    model = Net()
    example_input = torch.linspace(-1, 1, 8).reshape(2, 4)
    """)


def small_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def plain_grads(model, *inputs) -> dict:
    """Leaf grads of the same forward + sum + backward, run directly."""
    model.zero_grad()
    model(*inputs).sum().backward()
    return {name: p.grad.flatten().tolist() for name, p in model.named_parameters()}


def traced_grads(trace) -> dict:
    """Leaf grads of the trace's one call (big graphs keep a sample of the later tensors' values)."""
    assert trace.error is None, trace.error
    (call,) = trace.calls
    return {name: values.data if values.data is not None else values.sample
            for name, values in call.leaf_grads.items()}


def test_parse_shapes():
    assert parse_shapes("2,4") == [([2, 4], "float32")]
    assert parse_shapes("2x8:int64; 3") == [([2, 8], "int64"), ([3], "float32")]
    assert parse_shapes(["5,4", "1:float64"]) == [([5, 4], "float32"), ([1], "float64")]
    with pytest.raises(ModelFileError, match="'2,a': write the sizes as numbers"):
        parse_shapes("2,a")
    with pytest.raises(ModelFileError, match="unknown dtype 'float8'"):
        parse_shapes("2:float8")
    x = example_inputs([([2, 3], "float32")])
    assert torch.equal(x, example_inputs([([2, 3], "float32")]))  # the same on every run


@pytest.mark.slow
def test_export_program_grads_equal_a_plain_run(tmp_path):
    model = small_model()
    x = torch.randn(5, 4)
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(path))
    assert file_kind(path) == "export"
    trace = run_capture(str(path), timeout=300).trace  # through the worker, as the app opens it
    assert trace.mode == "model"
    # The inputs come from the program's input specs: shape (5, 4), float32, seeded values.
    expected = plain_grads(model, example_inputs([([5, 4], "float32")]))
    assert traced_grads(trace) == expected
    assert sorted(expected) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    names = sorted(n.name for n in trace.calls[0].nodes)
    assert names.count("AccumulateGrad") == 4 and "TanhBackward0" in names
    assert "open_export(" in trace.source  # the Source panel shows how the file was opened


def test_torchscript_needs_shapes_then_matches(tmp_path):
    model = small_model()
    path = tmp_path / "mlp.ts"
    torch.jit.script(model).save(str(path))
    assert model_kind(path) == "torchscript"
    err = capture_script(str(path)).error
    assert (err.type, err.kind, err.reason) == ("OpenError", "load", "needs_shapes")
    assert "does not record its input shapes" in err.message and "--input-shape" in err.message
    trace = capture_script(str(path), load={"input_shapes": "6,4"})
    assert traced_grads(trace) == plain_grads(model, example_inputs([([6, 4], "float32")]))
    # An archive that records its shapes as the extra file "input_shapes" needs none.
    recorded = tmp_path / "recorded.ts"
    torch.jit.script(model).save(str(recorded), _extra_files={"input_shapes": "2,4"})
    trace = capture_script(str(recorded))
    assert traced_grads(trace) == plain_grads(model, example_inputs([([2, 4], "float32")]))


@pytest.mark.slow
def test_safetensors_checkpoint_with_its_model_class(tmp_path):
    from safetensors.torch import save_file

    script = tmp_path / "net.py"
    script.write_text(NET_PY, encoding="utf-8")
    ns: dict = {}
    exec(compile(NET_PY, str(script), "exec"), ns)
    torch.manual_seed(11)
    trained = ns["Net"]()  # other weights than the script's own
    weights = tmp_path / "net.safetensors"
    save_file(trained.state_dict(), str(weights))
    trace = run_capture(str(script), timeout=300, load={"weights": str(weights)}).trace  # through the worker
    assert traced_grads(trace) == plain_grads(trained, ns["example_input"])
    assert sorted(trace.calls[0].leaf_grads) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    # The same weights as a state_dict saved with torch.save.
    pt = tmp_path / "net.pt"
    torch.save(trained.state_dict(), pt)
    trace_pt = capture_script(str(script), load={"weights": str(pt)})
    assert traced_grads(trace_pt) == traced_grads(trace)
    # Weights of another model: the error names the keys that do not match.
    save_file({"fc1.weight": torch.zeros(3, 4), "head.bias": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    err = capture_script(str(script), load={"weights": str(tmp_path / "other.safetensors")}).error
    assert "other.safetensors does not match the model's parameters" in err.message
    assert "missing 3: fc1.bias, fc2.weight, fc2.bias" in err.message and "unexpected 1: head.bias" in err.message


def test_weights_alone_say_which_script_to_add(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(tmp_path / "w.safetensors"))
    torch.save({"w": torch.ones(2)}, tmp_path / "w.pt")
    for name in ("w.safetensors", "w.pt"):
        with pytest.raises(ProgramError, match=rf"{name} holds weights only .*--weights {name}") as info:
            load_program(tmp_path / name)
        assert info.value.reason == "needs_code"


def test_pickled_model_refused_unless_trusted(tmp_path):
    model = small_model()
    path = tmp_path / "whole.pt"
    torch.save(model, path)
    err = capture_script(str(path)).error
    assert err.reason == "unsafe_pickle" and err.kind == "load"
    assert "whole pickled model" in err.message and "runs Python code" in err.message
    assert "--trust-pickle" in err.message
    assert err.traceback == ""  # nothing from the file ran
    trace = capture_script(str(path), load={"trust_pickle": True, "input_shapes": "2,4"})
    assert traced_grads(trace) == plain_grads(model, example_inputs([([2, 4], "float32")]))


@pytest.mark.slow
def test_cli_flags(tmp_path):
    from app.cli import commands as cli
    from safetensors.torch import save_file

    script = tmp_path / "net.py"
    script.write_text(NET_PY, encoding="utf-8")
    ns: dict = {}
    exec(compile(NET_PY, str(script), "exec"), ns)
    halves = {k: torch.full_like(v, 0.5) for k, v in ns["model"].state_dict().items()}
    save_file(halves, str(tmp_path / "h.safetensors"))
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.main(["trace", str(script), "--weights", str(tmp_path / "h.safetensors"), "--quiet",
                         "--json", str(tmp_path / "t.json")])
    assert code == 0, out.getvalue()
    # Every weight is 0.5, so fc2.bias.grad is the batch size for each output.
    assert "fc2.bias.grad = [2, 2]" in out.getvalue()
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["calls"][0]["leaf_grads"]["fc2.bias"]["data"] == [2.0, 2.0]


@pytest.mark.slow
def test_huggingface_folder_offline(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, vocab_size=40, max_position_embeddings=16)
    folder = tmp_path / "tiny-bert"
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(str(folder))
    assert file_kind(folder) == "huggingface"
    trace = capture_script(str(folder))
    grads = traced_grads(trace)
    model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True)
    model.config.return_dict = False
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (2, 8), generator=gen)
    sum(o.sum() for o in model(ids)).backward()
    for name in ("pooler.dense.bias", "encoder.layer.0.output.LayerNorm.bias", "embeddings.LayerNorm.weight"):
        expected = dict(model.named_parameters())[name].grad.flatten().tolist()[: len(grads[name])]
        assert grads[name] == pytest.approx(expected, rel=1e-5, abs=1e-6), name


def test_huggingface_without_transformers_says_so(tmp_path, monkeypatch):
    from core.programs.model_files import open_huggingface

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ModelFileError, match="needs the transformers package") as info:
        open_huggingface(str(tmp_path))
    assert info.value.reason == "missing_package"


def test_display_source_needs_no_torch(tmp_path):
    (tmp_path / "m.pt2").write_bytes(b"PK")
    text, cells = display_source(tmp_path / "m.pt2")
    assert text.startswith("# m.pt2: a torch.export program") and cells == []


def test_dropped_script_and_weights_open_together(tmp_path):
    from app.session.open_files import split_dropped

    assert split_dropped(["/a/net.py", "/a/w.safetensors"]) == ("/a/net.py", {"weights": "/a/w.safetensors"})
    assert split_dropped(["/a/readme.txt", "/a/nb.ipynb"]) == ("/a/nb.ipynb", {})
    assert split_dropped(["/a/readme.txt"]) == (None, {})


@pytest.mark.slow
def test_window_asks_before_running_a_pickled_model(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from PySide6.QtWidgets import QInputDialog, QMessageBox

    from app.window.window import MainWindow

    model = small_model()
    path = tmp_path / "whole.pt"
    torch.save(model, path)
    asked = []
    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: asked.append(a[2]) or QMessageBox.StandardButton.Yes)
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("3,4", True))
    w = MainWindow(timeout=300)
    qtbot.addWidget(w)
    w.show()
    try:
        with qtbot.waitSignal(w.sig_trace_shown, timeout=120_000):
            w.open_script(str(path))
        assert len(asked) == 1 and "whole pickled model" in asked[0]
        assert w.load_options == {"trust_pickle": True, "input_shapes": "3,4"}
        assert w.trace.error is None and w.call is not None
        expected = plain_grads(model, example_inputs([([3, 4], "float32")]))
        assert {k: v.data for k, v in w.call.leaf_grads.items()} == expected
        assert "open_pickled_model(" in w.source.editor.toPlainText()
    finally:
        w.handle.close()


def test_weights_opened_alone_ask_for_their_script(qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    from app.session.open_files import ask_fix
    from core.model.trace import ErrorInfo

    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(tmp_path / "net.py"), ""))
    err = ErrorInfo(type="OpenError", message="w.safetensors holds weights only", kind="load", reason="needs_code")
    fix = ask_fix(None, err, {}, str(tmp_path / "w.safetensors"))
    assert fix == {"script": str(tmp_path / "net.py"), "weights": str((tmp_path / "w.safetensors").resolve())}
    assert ask_fix(None, ErrorInfo(type="X", message="", reason=""), {}, "a.py") is None
