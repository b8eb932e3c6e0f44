"""Opening a saved trace past the sizes the app opens: refused naming the size, or thinned and said so."""

import json

import pytest

from bench.big_traces import chain_trace, memory_trace
from core.model.trace_checks import MAX_CALL_NODES, MAX_MEMORY_SAMPLES


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.session.worker_handle import WorkerHandle
    from app.window.window import MainWindow

    w = MainWindow(handle=WorkerHandle(prestart=False), timeout=60)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    yield w
    w.handle.close()


def test_a_call_past_the_node_limit_is_named_in_problems(qtbot, window, tmp_path):
    from app.session.open_trace import open_trace

    path = tmp_path / "chain.json"
    path.write_text(json.dumps(chain_trace(MAX_CALL_NODES + 1)))
    assert not open_trace(window, str(path))
    assert window.trace is None
    assert window.problems.problems()[0].summary == (
        f"OpenError: {path}: field 'calls[0].nodes': 200,001 nodes in call 0; Backprop Studio opens calls of up to "
        "200,000 nodes")


def test_a_long_memory_record_opens_thinned_and_says_so(qtbot, window, tmp_path):
    from app.session.open_trace import open_trace

    path = tmp_path / "long.json"
    path.write_text(json.dumps(memory_trace(MAX_MEMORY_SAMPLES + 50_000)))
    assert open_trace(window, str(path))
    assert len(window.trace.memory) <= MAX_MEMORY_SAMPLES
    assert max(s.rss for s in window.trace.memory) == 9_000_000_000
    assert window.state_label.text().endswith(
        f"; memory: 150,000 samples, {len(window.trace.memory):,} kept (evenly spread, with every peak)")
