"""Notebooks run as one script whose lines, nodes and errors map back to cells."""

import json

import pytest
from PySide6.QtCore import Qt

from core.programs.notebook import NotebookError, gutter_labels, locate, map_traceback, notebook_script, where

CELLS = [
    ("markdown", "# Gradients of w * x\n"),
    ("code", "%matplotlib inline\nimport torch\n"),
    ("code", "w = torch.tensor([1.0, 2.0], requires_grad=True)\nx = torch.tensor([3.0, 4.0])\n"),
    ("code", "!pip install torch\nloss = (w * x).sum()\nloss.backward()"),
    ("code", "print(w.grad)\nraise ValueError('cell five fails')\n"),
]


def write_notebook(path, cells, nbformat=4):
    doc = {"cells": [{"cell_type": kind, "metadata": {}, "source": src.splitlines(keepends=True),
                      **({"outputs": [], "execution_count": None} if kind == "code" else {})}
                     for kind, src in cells],
           "metadata": {}, "nbformat": nbformat, "nbformat_minor": 5}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_cells_become_one_script_with_a_line_map(tmp_path):
    nb = notebook_script(write_notebook(tmp_path / "nb.ipynb", CELLS))
    lines = nb.source.splitlines()
    # Cell numbers are positions in the notebook: the markdown cell is cell 1.
    assert [c["cell"] for c in nb.cells] == [2, 3, 4, 5]
    assert [c["lines"] for c in nb.cells] == [2, 2, 3, 2]
    loss_line = lines.index("loss = (w * x).sum()") + 1
    assert locate(nb.cells, loss_line) == (4, 2)
    assert where(nb.cells, loss_line) == "cell 4, line 2"
    assert where(nb.cells, nb.cells[0]["first"]) == "cell 2"
    assert where([], 7) == "line 7"
    assert lines[nb.cells[0]["first"]] == "pass  # skipped: %matplotlib inline (IPython magic)"
    assert [(s["cell"], s["line"], s["why"]) for s in nb.skipped] == [(2, 1, "IPython magic"), (4, 1, "shell command")]
    labels = gutter_labels(nb.cells)
    assert labels[nb.cells[2]["first"]] == "[4]" and labels[loss_line] == "2"


def test_magics_inside_blocks_and_cell_magics(tmp_path, capsys):
    cells = [("code", "for i in range(2):\n    %time x = i\n    files = !ls\ny = 1\ndisplay(y)"),
             ("code", "%%bash\necho hi\n"),
             ("code", "%%time\nz = 3\n"),
             ("code", "torch.ones?\n")]
    nb = notebook_script(write_notebook(tmp_path / "m.ipynb", cells))
    ns: dict = {}
    exec(compile(nb.source, "m.ipynb", "exec"), ns)  # still valid Python, indentation kept
    assert ns["y"] == 1 and ns["z"] == 3 and "files" not in ns
    assert capsys.readouterr().out == "1\n"  # display() without IPython prints
    whys = [s["why"] for s in nb.skipped]
    assert whys == ["IPython magic", "shell command", "cell magic %%bash: the cell did not run",
                    "cell magic %%time", "IPython help"]
    assert "    pass  # skipped: %time x = i (IPython magic)" in nb.source.splitlines()


def test_bad_notebooks_say_what_is_wrong(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text('{"cells": [', encoding="utf-8")
    with pytest.raises(NotebookError, match=r"bad.ipynb: not a notebook: invalid JSON at line 1"):
        notebook_script(bad)
    bad.write_text('{"metadata": {}}', encoding="utf-8")
    with pytest.raises(NotebookError, match="no 'cells' list"):
        notebook_script(bad)
    bad.write_text('{"cells": [{"cell_type": "code", "source": 3}]}', encoding="utf-8")
    with pytest.raises(NotebookError, match="cell 1: 'source'"):
        notebook_script(bad)


def test_format_3_notebooks(tmp_path):
    doc = {"nbformat": 3, "worksheets": [{"cells": [{"cell_type": "code", "input": ["a = 1\n", "b = a + 1"]}]}]}
    path = tmp_path / "old.ipynb"
    path.write_text(json.dumps(doc), encoding="utf-8")
    nb = notebook_script(path)
    assert nb.cells == [{"cell": 1, "first": 3, "lines": 2}]
    assert "b = a + 1" in nb.source


def test_traceback_lines_become_cells():
    cells = [{"cell": 3, "first": 5, "lines": 4}]
    text = 'Traceback:\n  File "/x/nb.ipynb", line 7, in <module>\n  File "/lib/a.py", line 7, in f\n'
    assert map_traceback(text, "/x/nb.ipynb", cells) == (
        'Traceback:\n  File "/x/nb.ipynb", cell 3, line 2, in <module>\n  File "/lib/a.py", line 7, in f\n')


@pytest.mark.slow
def test_notebook_runs_in_the_worker(tmp_path):
    torch = pytest.importorskip("torch")
    from core.client.handle import run_capture

    path = write_notebook(tmp_path / "nb.ipynb", CELLS)
    result = run_capture(str(path), timeout=300)
    trace = result.trace
    # The calls: one backward, with the script's names and its place in cell 4.
    assert [(c.api, where(trace.cells, c.line)) for c in trace.calls] == [("Tensor.backward", "cell 4, line 3")]
    call = trace.calls[0]
    assert sorted(n.name for n in call.nodes) == ["AccumulateGrad", "MulBackward0", "SumBackward0"]
    by_name = {n.name: n for n in call.nodes}
    assert by_name["SumBackward0"].label == "loss"
    assert where(trace.cells, by_name["MulBackward0"].line) == "cell 4, line 2"
    leaf = call.tensor(by_name["AccumulateGrad"].variable)
    assert leaf.name == "w"
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    (expected,) = torch.autograd.grad((w * torch.tensor([3.0, 4.0])).sum(), w)
    assert call.leaf_grads["w"].data == expected.tolist() == [3.0, 4.0]
    # The error: its cell and line, in the error and in the traceback.
    err = trace.error
    assert (err.type, err.where, err.message) == ("ValueError", "cell 5, line 2", "cell five fails")
    assert f'File "{path.resolve()}", cell 5, line 2' in err.traceback
    assert "    raise ValueError('cell five fails')\n" in err.traceback  # the cell's line, not the JSON's
    # The skipped lines are said in the output, before the script's own.
    assert result.output.splitlines()[:3] == [
        "cell 2, line 1: skipped '%matplotlib inline' (IPython magic)",
        "cell 4, line 1: skipped '!pip install torch' (shell command)",
        "tensor([3., 4.])",
    ]
    assert trace.source.splitlines()[trace.cells[0]["first"] - 1] == "# %% cell 2"


@pytest.mark.slow
def test_notebook_syntax_error_names_its_cell(tmp_path):
    pytest.importorskip("torch")
    from core.client.handle import run_capture

    path = write_notebook(tmp_path / "syn.ipynb", [("code", "a = 1"), ("markdown", "text"), ("code", "b = (\n")])
    err = run_capture(str(path), timeout=300).trace.error
    assert (err.type, err.kind, err.where) == ("SyntaxError", "syntax", "cell 3, line 1")


def test_source_panel_numbers_cells(qtbot, tmp_path):
    from widgets.panels.source import SourcePanel

    nb = notebook_script(write_notebook(tmp_path / "nb.ipynb", CELLS))
    panel = SourcePanel()
    qtbot.addWidget(panel)
    panel.resize(500, 300)
    panel.set_source(nb.source, str(tmp_path / "nb.ipynb"), nb.cells)
    assert panel.editor.labels[nb.cells[1]["first"]] == "[3]"
    assert panel.editor.labels[nb.cells[1]["first"] + 2] == "2"
    assert 1 not in panel.editor.labels  # the script's own header line has no number
    panel.set_source("x = 1\n", "a.py")
    assert panel.editor.labels == {}


@pytest.mark.slow
def test_window_opens_a_notebook(qtbot, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.window.window import MainWindow

    path = write_notebook(tmp_path / "nb.ipynb", CELLS)
    w = MainWindow(timeout=300)
    qtbot.addWidget(w)
    w.show()
    try:
        with qtbot.waitSignal(w.sig_trace_shown, timeout=120_000):
            w.open_script(str(path))
        assert w.call is not None and w.call.api == "Tensor.backward"
        assert w.source.editor.toPlainText() == w.trace.source
        assert w.source.editor.labels[w.trace.cells[2]["first"]] == "[4]"
        problem = [p for p in w.problems.problems() if p.severity == "error"][0]
        assert problem.where == "cell 5, line 2"
        mul = next(n for n in w.call.nodes if n.name == "MulBackward0")
        w.select_node(mul.id)
        assert "cell 4, line 2" in w.inspector.text()
        assert w.calls.list.item(0).data(Qt.ItemDataRole.UserRole + 3).startswith("cell 4, line 3")
    finally:
        w.handle.close()


def test_a_cell_and_line_map_back_to_the_script_line(tmp_path):
    from core.programs.notebook import script_line

    nb = notebook_script(write_notebook(tmp_path / "nb.ipynb", CELLS))
    assert [script_line(nb.cells, 4, n) for n in (1, 2, 3)] == [12, 13, 14]
    assert [where(nb.cells, line) for line in (12, 13, 14)] == ["cell 4, line 1", "cell 4, line 2", "cell 4, line 3"]
    assert script_line(nb.cells, 4, 4) is None  # cell 4 has three lines
    assert script_line(nb.cells, 1, 1) is None  # a markdown cell


STALE_CELLS = [
    ("markdown", "# A saved tensor changed in place"),
    ("code", "import torch\nw = torch.tensor([1.0, 2.0], requires_grad=True)"),
    ("code", "y = w.sigmoid()\nz = y * 2\ny.mul_(3)"),
    ("code", "z.sum().backward()"),
]


def _stale_trace():
    """What a run of STALE_CELLS records, as plain data: the failed call and its stale node."""
    from core.model.trace import CallInfo, Edge, ErrorInfo, NodeInfo, Stale, Trace

    message = "one of the variables needed for gradient computation has been modified by an inplace operation"
    error = ErrorInfo(type="RuntimeError", message=message, line=13, where="cell 4, line 1", file="/n/stale.ipynb")
    nodes = [NodeInfo(id="n0", name="SumBackward0", kind="backward", next=[Edge("n1", 0)], line=13),
             NodeInfo(id="n1", name="MulBackward0", kind="backward", next=[Edge("n2", 0), None], label="z", line=9),
             NodeInfo(id="n2", name="SigmoidBackward0", kind="backward", next=[Edge("n3", 0)], line=8,
                      stale=Stale(saved="result", saved_version=0, version=1, op_line=10, op="mul_")),
             NodeInfo(id="n3", name="AccumulateGrad", kind="accumulate_grad", next=[])]
    call = CallInfo(id="c0", index=0, api="Tensor.backward", line=13, roots=["n0"], nodes=nodes, tensors=[],
                    node_count=4, edge_count=3, error=error)
    cells = [{"cell": 2, "first": 3, "lines": 2}, {"cell": 3, "first": 7, "lines": 3},
             {"cell": 4, "first": 12, "lines": 1}]
    return Trace(calls=[call], script="/n/stale.ipynb", error=error, cells=cells)


def test_the_cells_match_what_the_notebook_gives(tmp_path):
    nb = notebook_script(write_notebook(tmp_path / "stale.ipynb", STALE_CELLS))
    trace = _stale_trace()
    assert nb.cells == trace.cells
    lines = nb.source.splitlines()
    assert (lines[13 - 1], lines[10 - 1], lines[8 - 1], lines[9 - 1]) == (
        "z.sum().backward()", "y.mul_(3)", "y = w.sigmoid()", "z = y * 2")


def test_problems_say_cell_and_line_in_a_notebook(qtbot):
    from widgets.panels.problems import ProblemsPanel

    panel = ProblemsPanel()
    qtbot.addWidget(panel)
    panel.set_trace(_stale_trace())
    error, stale = panel.problems()
    assert (error.where, stale.where) == ("cell 4, line 1 · call #0", "cell 3, line 3 · call #0")
    assert ("SigmoidBackward0 saved result at version 0, now at version 1: backward will fail here because the "
            "tensor was modified in place after this node saved it (in-place change at cell 3, line 3).") \
        in stale.text
    assert "The node was created at <a href='line:8'>cell 3, line 1</a>." in stale.details


def test_the_inspector_says_where_a_notebook_changed_a_saved_tensor(qtbot):
    from widgets.panels.inspector import stale_sentence

    stale = _stale_trace().calls[0].nodes[2].stale
    assert "(in-place change at <a href='line:10'>cell 3, line 3</a>)" in stale_sentence(stale, _stale_trace().cells)
    assert "(in-place change at <a href='line:10'>line 10</a>)" in stale_sentence(stale)


def test_the_cli_summary_says_cell_and_line():
    from app.cli.summary import trace_summary

    text = trace_summary(_stale_trace())
    assert "call #0: Tensor.backward at cell 4, line 1: 4 nodes, 3 edges" in text.splitlines()
    assert ("  stale saved tensor: SigmoidBackward0.result saved at version 0, now 1 (modified by mul_ at "
            "cell 3, line 3)") in text.splitlines()
    assert text.splitlines()[-1].startswith("error at cell 4, line 1: RuntimeError: ")


@pytest.mark.slow
def test_step_takes_and_says_cell_and_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    path = write_notebook(tmp_path / "stale.ipynb", STALE_CELLS)
    out = subprocess.run([sys.executable, "main.py", "step", str(path), "--breakpoint", "4:1"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr  # backward fails at the stale node
    assert out.stdout.splitlines()[0] == "call #0 (Tensor.backward, cell 4, line 1): 3 steps, failed"
    out = subprocess.run([sys.executable, "main.py", "step", str(path), "--breakpoint", "4:2"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert (out.returncode, out.stderr) == (
        2, "backprop-studio step: --breakpoint 4:2: the notebook has no code cell 4 with a line 2\n")


@pytest.mark.slow
def test_a_notebook_names_parameters_by_their_model(tmp_path):
    """The same code as a script and as a notebook: the notebook's one model names its parameters."""
    pytest.importorskip("torch")
    from core.client.handle import run_capture

    code = ("import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
            "model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))\n"
            "loss = model(torch.ones(2, 3)).pow(2).mean()\nloss.backward()\n")
    script = tmp_path / "seq.py"
    script.write_text(code, encoding="utf-8")
    notebook = write_notebook(tmp_path / "seq.ipynb", [("code", code)])
    as_script = run_capture(str(script), timeout=300).trace.calls[0]
    as_notebook = run_capture(str(notebook), timeout=300).trace.calls[0]
    assert sorted(as_script.leaf_grads) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert sorted(as_notebook.leaf_grads) == ["model.0.bias", "model.0.weight", "model.2.bias", "model.2.weight"]
    assert as_notebook.leaf_grads["model.2.bias"] == as_script.leaf_grads["2.bias"]
    leaves = sorted(as_notebook.tensor(n.variable).name for n in as_notebook.nodes if n.name == "AccumulateGrad")
    assert leaves == ["model.0.bias", "model.0.weight", "model.2.bias", "model.2.weight"]


@pytest.mark.slow
def test_debugging_a_notebook_pauses_at_its_cell_and_line(qtbot, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.session.session import SessionState
    from app.window.window import MainWindow

    path = write_notebook(tmp_path / "nb.ipynb", CELLS)
    w = MainWindow(timeout=300)
    qtbot.addWidget(w)
    w.show()
    try:
        w.open_script(str(path), run=False)
        said, show = [], w.stepper._status_bar
        w.stepper._status_bar = lambda text: (said.append(text), show(text))
        with qtbot.waitSignal(w.session.sig_paused, timeout=120_000):
            w.debug_script()
        qtbot.waitUntil(lambda: any(t.startswith("Paused at call #0") for t in said), timeout=30_000)
        assert next(t for t in said if t.startswith("Paused at call #0")).startswith(
            "Paused at call #0 (Tensor.backward, cell 4, line 3) before backward: 3 nodes.")
        w.session.continue_()
        qtbot.waitUntil(lambda: w.session.state is SessionState.IDLE and not w.handle.running, timeout=120_000)
    finally:
        w.handle.close()
