"""Forward replay on the graph view: frame k draws exactly the first k ops and their leaves, the
Source panel and the memory chart follow op k, Play advances, Esc leaves."""

from dataclasses import replace

import pytest
from PySide6.QtCore import Qt

from app.window.export_dialog import ExportDialog, run_export
from core.model.trace import MemorySample
from tests.fixtures_graphs import mlp_call
from widgets.graph.replay import FADED, ForwardReplayer
from widgets.memory.chart import MemoryChart
from widgets.panels.source import SourcePanel

# mlp_call's ops as its script makes them: fc1 (t, addmm), relu, Scale, fc2 (t, addmm), the loss
MADE = ["n9", "n7", "n6", "n5", "n3", "n1", "n0"]
LEAVES_WITH = {"n9": ["n10"], "n7": ["n8"], "n3": ["n4"], "n1": ["n2"]}


def _call():
    c = mlp_call()
    order = {nid: i for i, nid in enumerate(MADE)}
    nodes = [replace(n, seq=order[n.id], created=1.0 + 0.1 * order[n.id]) if n.id in order else n for n in c.nodes]
    return replace(c, nodes=nodes)


@pytest.fixture
def replayer(qtbot, view):
    source = SourcePanel()
    chart = MemoryChart()
    for w in (source, chart):
        qtbot.addWidget(w)
    source.set_source("\n".join(f"x{i} = {i}" for i in range(1, 13)), "mlp.py")
    chart.set_samples([MemorySample(t=i / 10, device="cpu", rss=(300 + i) << 20, phase="forward") for i in range(25)])
    view.set_call(_call(), sync=True)
    r = ForwardReplayer(view, source, chart)
    r.start()
    return r


def _first(k):
    shown = set()
    for nid in MADE[:k]:
        shown |= {nid, *LEAVES_WITH.get(nid, [])}
    return shown


def test_frame_k_draws_exactly_the_first_k_ops_with_their_leaves(replayer):
    view = replayer.view
    assert replayer.bar.isVisible() and replayer.bar.slider.maximum() == 7
    for k in (1, 3, 5, 7, 2, 6, 4):  # forward and back: each frame redraws only what it changed
        replayer.bar.slider.setValue(k)
        shown = _first(k)
        assert replayer.shown_nodes() == shown
        drawn = {nid for nid, item in view.node_items.items() if item.opacity() == 1.0}
        faded = {nid for nid, item in view.node_items.items() if item.opacity() == FADED}
        assert drawn == shown and faded == set(view.node_items) - shown
        for e in view.edge_items:
            assert e.opacity() == (1.0 if set(e.key) <= shown else FADED), e.key
        # the newest op is ringed
        newest = view.node_items[MADE[k - 1]]
        assert replayer.painter.ring_rect().center() == newest.sceneBoundingRect().center()
    replayer.bar.slider.setValue(3)
    assert replayer.bar.caption.text() == "op 3 of 7: ReluBackward0, line 6"
    assert replayer.source.highlighted_lines() == [6]
    assert replayer.memory_time() == pytest.approx(1.2)
    replayer.bar.slider.setValue(6)
    assert replayer.bar.caption.text() == "op 6 of 7: AddmmBackward0, line 8"
    assert replayer.source.highlighted_lines() == [8] and replayer.memory_time() == pytest.approx(1.5)


def test_play_advances_to_the_last_op_and_stops(qtbot, replayer):
    bar = replayer.bar
    seen = []
    replayer.sig_frame.connect(seen.append)
    bar.speed.setCurrentIndex(bar.speed.findData(30))
    bar.play()
    assert bar.is_playing() and bar.play_button.text().endswith("Pause")
    qtbot.waitUntil(lambda: replayer.frame() == 7 and not bar.is_playing(), timeout=10_000)
    assert seen == [2, 3, 4, 5, 6, 7]
    assert replayer.shown_nodes() == _first(7) and replayer.source.highlighted_lines() == [9]
    bar.play()  # at the end, Play starts again from the first op
    assert replayer.frame() == 1
    bar.pause()


def test_esc_leaves_the_replay_and_draws_everything_again(qtbot, replayer):
    view = replayer.view
    replayer.set_frame(2)
    view.setFocus()
    qtbot.keyClick(view, Qt.Key.Key_Escape)
    assert not replayer.active and not replayer.bar.isVisible()
    assert all(item.opacity() == 1.0 for item in view.node_items.values())
    assert all(e.opacity() == 1.0 for e in view.edge_items)
    assert replayer.painter.ring_rect() is None and replayer.memory_time() is None
    assert replayer.source.highlighted_lines() == []
    assert view.viewportMargins().bottom() == 0


def test_folding_a_group_keeps_the_frame(replayer):
    view = replayer.view
    replayer.set_frame(2)  # fc1's two ops and its parameters: fc1 folded is one box, drawn
    view.set_collapsed({"fc1", "fc2"}, sync=True)
    assert {"group:fc1", "group:fc2"} <= set(view.node_items)
    drawn = {nid for nid, item in view.node_items.items() if item.opacity() == 1.0}
    assert drawn == {"group:fc1"}
    assert replayer.painter.ring_rect().center() == view.node_items["group:fc1"].sceneBoundingRect().center()


CHAIN = """\
import torch
a = torch.tensor([1., 2.], requires_grad=True)
b = a * 2
c = b + 1
d = c.sum()
d.backward()
"""


@pytest.mark.slow
def test_view_replay_forward_in_the_window(qtbot, window, tmp_path):
    script = tmp_path / "chain.py"
    script.write_text(CHAIN)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.open_script(str(script))
    assert window.graph.wait_ready()
    view_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&View")
    assert window.act_replay in view_menu.actions()
    window.act_replay.trigger()
    replay = window.replay
    assert replay.active and replay.bar.isVisible() and window.act_replay.isChecked()
    names = [replay.replay.step(k).name for k in range(1, 4)]
    assert names == ["MulBackward0", "AddBackward0", "SumBackward0"]
    replay.set_frame(2)
    assert replay.bar.caption.text() == "op 2 of 3: AddBackward0, line 4"
    assert window.source.highlighted_lines() == [4]
    add = next(n for n in window.call.nodes if n.name == "AddBackward0")
    assert replay.memory_time() == pytest.approx(add.created)
    samples = [s.t for s in window.trace.memory]
    assert min(samples) <= add.created <= max(samples)
    qtbot.keyClick(window.graph, Qt.Key.Key_Escape)
    assert not replay.active and not window.act_replay.isChecked()

    # File > Export: the replay's frames and GIF beside the graph
    dialog = ExportDialog(window)
    qtbot.addWidget(dialog)
    assert dialog.forward.isEnabled() and dialog.forward.text() == "Also export forward replay frames + GIF (3 ops)"
    dialog.path.setText(str(tmp_path / "chain.png"))
    dialog.forward.setChecked(True)
    written = run_export(window, **dialog.options())
    names = [p.name if p.parent == tmp_path else f"{p.parent.name}/{p.name}" for p in written]
    assert names == ["chain.png", "chain-forward/frame_001.png", "chain-forward/frame_002.png",
                     "chain-forward/frame_003.png", "chain-forward.gif"]
