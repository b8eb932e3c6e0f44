"""Memory lessons told where a class looks: the leak problem, the peak's cause, checkpointing's saving."""

import textwrap
from pathlib import Path

import pytest

from core.model.trace import MemorySample
from widgets.memory.chart import MemoryChart
from widgets.memory.panel import MemoryPanel
from widgets.panels.problems import ProblemsPanel

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"
LEAK = "graph kept alive by `losses.append(loss)` (line 29): 20 graphs, 10.0 MB"


def _capture(path):
    pytest.importorskip("torch")
    from core.worker.capture.recorder import capture_script

    return capture_script(str(path), mode="script")


def test_the_leak_is_one_problem_naming_the_line_that_keeps_the_graphs(qtbot):
    trace = _capture(EXAMPLES / "30_graph_leak.py")
    panel = ProblemsPanel()
    qtbot.addWidget(panel)
    panel.set_trace(trace)
    # The 20 kept graphs saved weights that optimizer.step changed in place since: 38 stale saved
    # tensors, told in the leak problem instead of one warning each.
    assert [(p.severity, p.summary, p.where, p.line) for p in panel.problems()] == [
        ("warning", LEAK, "line 29", 29)]
    text = panel.problems()[0].text
    assert text.splitlines()[0] == LEAK
    assert ("38 of the tensors these graphs saved were changed in place since (an optimizer step updates "
            "the weights in place): a backward through them would now fail.") in text
    assert "losses.append(loss.item())" in text


def test_a_stale_tensor_that_fails_backward_is_still_its_own_problem(qtbot, tmp_path):
    script = tmp_path / "stale.py"
    script.write_text(textwrap.dedent("""\
        import torch
        x = torch.ones(3, requires_grad=True)
        losses = []
        for step in range(3):
            y = torch.sigmoid(x)
            losses.append(y.sum())
        y.mul_(2)
        losses[-1].backward()  # fails: sigmoid saved y, changed in place since
    """))
    trace = _capture(script)
    panel = ProblemsPanel()
    qtbot.addWidget(panel)
    panel.set_trace(trace)
    rows = [(p.summary, p.where) for p in panel.problems()]
    # The failed backward and its stale tensor stay problems of their own, beside the leak.
    assert rows[0][0].startswith("RuntimeError: one of the variables needed for gradient computation")
    assert rows[0][1] == "line 8 · call #0"
    assert rows[1] == ("SigmoidBackward0: saved 'result' changed in place (version 0 → 1)", "line 7 · call #0")
    assert rows[-1] == ("graph kept alive by `losses.append(y.sum())` (line 6): 2 graphs, 24 B", "line 6")


def test_a_list_of_grad_fns_is_a_leak_problem_from_the_samples(qtbot):
    from core.model.trace import Trace

    source = ("grad_fns = []\nfor epoch in range(4):\n    loss = model(x).sum()\n"
              "    grad_fns.append(loss.grad_fn)  # keeps the graph\n")
    samples = [MemorySample(t=0.1, device="cpu", saved_bytes=9152, kept_bytes=9152, kept_in="grad_fns")]
    panel = ProblemsPanel()
    qtbot.addWidget(panel)
    panel.set_trace(Trace(calls=[], source=source, memory=samples))
    (problem,) = panel.problems()
    assert problem.summary == "graph kept alive by `grad_fns.append(loss.grad_fn)` (line 4): 8.9 KB"
    assert problem.line == 4
    assert "keep what the loop needs from it (a number, loss.item()) instead of the node" in problem.text


def _samples(kept: int, where: str = "AddmmBackward0 · line 15 · fc1"):
    return [MemorySample(t=0.0, device="cpu", rss=300 << 20, phase="forward"),
            MemorySample(t=0.1, device="cpu", rss=300 << 20, saved_bytes=1000, where=where),
            MemorySample(t=0.2, device="cpu", rss=301 << 20, saved_bytes=4000, kept_bytes=kept,
                         kept_in="losses" if kept else "", phase="backward", call=0),
            MemorySample(t=0.3, device="cpu", rss=301 << 20, saved_bytes=0, phase="between")]


def test_a_peak_made_of_kept_graphs_is_blamed_on_the_keeping_line(qtbot):
    chart = MemoryChart()
    qtbot.addWidget(chart)
    chart.set_samples(_samples(kept=3000))
    assert chart.peak() == (0.2, 4000, "kept in losses")  # a live run: the list's name
    chart.set_lessons({"losses": "kept by losses.append(loss) · line 29"})
    assert chart.peak() == (0.2, 4000, "kept by losses.append(loss) · line 29")
    assert chart.peak_label.textItem.toPlainText() == "peak 3.9 KB · kept by losses.append(loss) · line 29"
    chart.set_samples(_samples(kept=1000))  # kept graphs hold a quarter: the op that ran is the cause
    assert chart.peak() == (0.2, 4000, "AddmmBackward0 · line 15 · fc1")
    assert chart.marker_items() == [(0, 0.2)]


def test_a_notebook_peak_reads_cell_and_line(qtbot):
    chart = MemoryChart()
    qtbot.addWidget(chart)
    chart.set_samples(_samples(kept=0))
    chart.set_lessons({}, cells=[{"cell": 1, "first": 1, "lines": 4}, {"cell": 3, "first": 13, "lines": 5}])
    assert chart.peak() == (0.2, 4000, "AddmmBackward0 · cell 3, line 2 · fc1")
    assert chart.peak_label.textItem.toPlainText() == "peak 3.9 KB · AddmmBackward0 · cell 3, line 2 · fc1"
    assert "after AddmmBackward0 · cell 3, line 2 · fc1" in chart.readout_html(2)


@pytest.mark.slow
def test_the_leak_peak_names_losses_append(qtbot):
    from core.client.handle import run_capture

    trace = run_capture(str(EXAMPLES / "30_graph_leak.py"), timeout=120).trace
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.show_trace(trace)
    # The peak comes in the last epoch: 19 kept validation graphs and the training graph.
    t, nbytes, cause = panel.chart.peak()
    assert (nbytes, cause) == (10_902_528, "kept by losses.append(loss) · line 29")
    assert panel.chart.peak_label.textItem.toPlainText() == "peak 10.4 MB · kept by losses.append(loss) · line 29"


@pytest.mark.slow
def test_checkpointing_is_shown_beside_the_same_model_without_it(qtbot):
    from core.client.handle import run_capture
    from core.model.memory_lessons import checkpoint_saving

    trace = run_capture(str(EXAMPLES / "14_checkpointing.py"), timeout=120).trace
    (saving,) = checkpoint_saving(trace)
    # Checkpointed: three block inputs and the head's input (4 x 128 KB) and the head's weight
    # (512 B) from forward; recomputing the last block saves 1.125 MB while the outer graph still
    # holds the three inputs. Plain: every activation and the weights' views, 3.5 MB.
    assert (saving.with_call.index, saving.without_call.index) == (3, 7)
    assert (saving.kept_bytes, saving.recompute_bytes) == (524_800, 1_179_648)
    assert (saving.with_bytes, saving.without_bytes) == (1_572_864, 3_670_528)
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.show_trace(trace)
    assert panel.lesson.text() == "with checkpointing: peak saved 1.5 MB; without: 3.5 MB (calls #3 and #7)"
    assert not panel.lesson.isHidden()
    assert [n.label.textItem.toPlainText() for n in panel.chart.note_items()] == [
        "#3 with checkpointing: peak saved 1.5 MB", "#7 without: peak saved 3.5 MB"]
