"""Each kind's opener accepts its own file and no other, and the registry picks the kind each file always had."""

import json
import subprocess
import sys
import textwrap

import pytest

from core.model.trace import Trace
from core.model.trace_json import load_trace
from core.programs import openers
from core.programs.opener import ProgramError
from core.programs.program import OPEN_FILTER, display_source, file_kind, is_openable, load_program

torch = pytest.importorskip("torch")

MODEL_PY = textwrap.dedent("""\
    import torch

    model = torch.nn.Linear(4, 2)
    example_input = torch.ones(2, 4)
    """)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One tiny file of each kind, by the name of the opener that should take it."""
    d = tmp_path_factory.mktemp("kinds")
    (d / "plain.py").write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * 3).sum().backward()\n")
    (d / "model.py").write_text(MODEL_PY)
    (d / "nb.ipynb").write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "source": "x = 1\n", "metadata": {}, "outputs": [], "execution_count": None}]}))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    torch.jit.save(torch.jit.trace(net, torch.ones(2, 4)), str(d / "net.ts"))
    torch.export.save(torch.export.export(net, (torch.ones(2, 4),)), str(d / "net.pt2"))
    torch.save(net.state_dict(), d / "weights.pt")
    torch.save(net, d / "whole.pt")
    Trace(calls=[], script="plain.py", source="x = 1\n").save(d / "run.json")
    hf = d / "tiny-bert"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10}))
    return {
        openers.SCRIPT: d / "plain.py", openers.MODEL_FILE: d / "model.py", openers.NOTEBOOK: d / "nb.ipynb",
        openers.TORCHSCRIPT: d / "net.ts", openers.EXPORT: d / "net.pt2", openers.CHECKPOINT: d / "weights.pt",
        openers.PICKLED_MODEL: d / "whole.pt", openers.TRACE: d / "run.json", openers.HUGGINGFACE: hf,
    }


# The kinds the suffix checks gave these files before the openers (file_kind, model_kind).
OLD_KINDS = {"script": "script", "model file": "script", "notebook": "notebook", "TorchScript archive": "torchscript",
             "torch.export program": "export", "checkpoint + class": "checkpoint",
             "whole pickled model": "checkpoint", "saved trace": "trace", "Hugging Face folder": "huggingface"}


def test_each_opener_accepts_its_file_and_refuses_the_others(files):
    for opener, path in files.items():
        others = [o.name for o in files if o is not opener and o.accepts(path)]
        if opener is openers.MODEL_FILE:  # a model file is a script too; the registry asks it first
            assert others == ["script"], path
        elif opener is openers.PICKLED_MODEL:  # a pickled model is a checkpoint by its name; asked first
            assert others == ["checkpoint + class"], path
        else:
            assert others == [], (opener, path, others)
        assert opener.accepts(path), (opener, path)


def test_the_registry_picks_the_kind_the_file_always_had(files):
    for opener, path in files.items():
        assert openers.opener_for(path) is opener, (path, openers.opener_for(path))
        assert file_kind(path) == OLD_KINDS[opener.name], path
        assert is_openable(path)
    assert file_kind(files[openers.SCRIPT].with_name("notes.txt")) == "script"  # anything else runs as Python
    assert not is_openable(files[openers.SCRIPT].with_name("notes.txt"))


def test_accepts_needs_no_torch(files, tmp_path):
    """The GUI asks every opener about every file without importing torch."""
    paths = json.dumps([str(p) for p in files.values()])
    code = ("import json, sys\nfrom core.programs import openers\n"
            f"kinds = [openers.opener_for(p).name for p in json.loads({paths!r})]\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nprint(json.dumps(kinds))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [o.name for o in files]


def test_pickled_classes_name_a_whole_model_only(files):
    assert openers.pickled_classes(files[openers.CHECKPOINT]) == []
    assert openers.pickled_classes(files[openers.PICKLED_MODEL]) == [
        "torch.nn.modules.container.Sequential", "torch.nn.modules.linear.Linear",
        "torch.nn.modules.activation.Tanh"]


def test_open_gives_the_program_or_says_why(files):
    assert load_program(files[openers.SCRIPT]).source.startswith("import torch\nx = torch.ones")
    assert load_program(files[openers.MODEL_FILE]).kind == "script"
    nb = load_program(files[openers.NOTEBOOK])
    assert (nb.kind, nb.cells) == ("notebook", [{"cell": 1, "first": 3, "lines": 1}])
    export = load_program(files[openers.EXPORT])
    assert export.kind == "export" and "model, example_input = open_export(" in export.source
    assert "open_export" in export.globals
    ts = load_program(files[openers.TORCHSCRIPT], {"input_shapes": "2,4"})
    ts_path = str(files[openers.TORCHSCRIPT])
    assert ts.kind == "torchscript" and ts.source.endswith(f"open_torchscript({ts_path!r}, '2,4')\n")
    with pytest.raises(ProgramError, match="holds weights only") as weights:
        load_program(files[openers.CHECKPOINT])
    assert weights.value.reason == "needs_code"
    with pytest.raises(ProgramError, match="whole pickled model") as pickled:
        load_program(files[openers.PICKLED_MODEL])
    assert pickled.value.reason == "unsafe_pickle"
    with pytest.raises(ProgramError, match=r"run.json is a saved trace: open it in the window \(python main.py run"):
        load_program(files[openers.TRACE])
    assert openers.TRACE.opens_as_trace and not openers.SCRIPT.opens_as_trace
    assert load_trace(files[openers.TRACE]).script == "plain.py"


def test_previews(files):
    assert display_source(files[openers.TRACE]) == ("", [])
    assert display_source(files[openers.EXPORT])[0] == (
        "# net.pt2: a torch.export program; the script that opens it shows once it runs.\n")
    assert display_source(files[openers.PICKLED_MODEL])[0] == (
        "# whole.pt: a PyTorch checkpoint; the script that opens it shows once it runs.\n")
    assert display_source(files[openers.HUGGINGFACE])[0] == (
        "# tiny-bert: a Hugging Face model folder; the script that opens it shows once it runs.\n")


def test_weights_files_and_the_open_filter(tmp_path):
    assert [openers.is_weights_file(tmp_path / n) for n in ("w.pt", "w.safetensors", "w.ckpt", "m.pt2", "m.py")] == [
        True, True, True, False, False]
    assert OPEN_FILTER == ("PyTorch files (*.py *.ipynb *.pt2 *.pt *.pth *.bin *.ckpt *.ts *.safetensors *.json);;"
                           "Python scripts (*.py);;Notebooks (*.ipynb);;"
                           "Models (*.pt2 *.pt *.pth *.bin *.ckpt *.ts *.safetensors);;Traces (*.json);;"
                           "All files (*)")


def test_build_makes_a_model_file_and_odd_scripts_stay_scripts(tmp_path):
    (tmp_path / "b.py").write_text("def build():\n    return None, None\n")
    (tmp_path / "bad.py").write_text("def (:\n")
    (tmp_path / "half.py").write_text("model = 1\n")
    assert [openers.opener_for(tmp_path / n).name for n in ("b.py", "bad.py", "half.py")] == [
        "model file", "script", "script"]
