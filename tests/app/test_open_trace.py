"""A saved trace opens without running anything: File > Open Trace, drop, ``view`` and ``.json`` as SCRIPT."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.model.trace import ErrorInfo, Trace
from tests.fixtures_graphs import mlp_call

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.window.window import MainWindow
    from app.session.worker_handle import WorkerHandle

    w = MainWindow(handle=WorkerHandle(prestart=False), timeout=60)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    yield w
    w.handle.close()


def _saved(tmp_path, error=None) -> Path:
    call = mlp_call()
    trace = Trace(calls=[call], script="/elsewhere/train.py", source="import torch\n" * 12, device="cuda:0",
                  torch_version="2.13.0", output="epoch 1\n", call_count=1, error=error)
    path = tmp_path / "shared.json"
    trace.save(path)
    return path


def test_open_trace_shows_the_graph_without_running(qtbot, window, tmp_path):
    from app.session.open_trace import open_trace

    path = _saved(tmp_path)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=20_000):
        assert open_trace(window, str(path))
    assert window.call is not None and {n.id for n in window.call.nodes} == set(window.graph.node_items)
    assert window.output.text() == "epoch 1\n"
    assert "Opened the saved trace shared.json of train.py (recorded on cuda:0, torch 2.13.0)" == \
        window.state_label.text()
    assert not window.handle.running
    assert window.act_open_trace.shortcut().toString() == "Ctrl+Shift+O"
    file_menu = window.menuBar().actions()[0].menu()
    assert window.act_open_trace in file_menu.actions()


def test_a_bad_trace_is_named_and_the_previous_graph_stays(qtbot, window, tmp_path):
    from app.session.open_trace import open_trace

    good = _saved(tmp_path)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=20_000):
        open_trace(window, str(good))
    shown = window.trace
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text().replace('"numel":24', '"numel":"many"', 1).replace('"numel":8', '"numel":-8', 1))
    assert not open_trace(window, str(bad))
    assert window.trace is shown
    problem = window.problems.problems()[0]
    assert "bad.json: field 'calls[0].tensors[" in problem.summary and "numel" in problem.summary


def test_an_error_in_the_trace_is_listed_once(qtbot, window, tmp_path):
    from app.session.open_trace import open_trace

    path = _saved(tmp_path, error=ErrorInfo("ValueError", "boom", 4, kind="exception"))
    with qtbot.waitSignal(window.sig_trace_shown, timeout=20_000):
        open_trace(window, str(path))
    assert [p.summary for p in window.problems.problems()].count(window.problems.problems()[0].summary) == 1
    assert window.last_error.message == "boom"


def test_a_dropped_json_opens_as_a_trace(qtbot, window, tmp_path):
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    path = _saved(tmp_path)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    drop = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=20_000):
        window.dropEvent(drop)
    assert window.trace.script == "/elsewhere/train.py"
    assert not window.handle.running


def _main(args, env=None, timeout=120):
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(ROOT))


@pytest.mark.slow
def test_view_and_json_as_script_take_screenshots_without_a_display(tmp_path):
    path = _saved(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env["BACKPROP_STUDIO_SETTINGS"] = str(tmp_path / "settings.ini")
    for args in (["view", str(path)], [str(path)]):
        out = tmp_path / "shot.png"
        result = _main([*args, "--screenshot", str(out)], env=env)
        assert result.returncode == 0, result.stderr
        assert out.stat().st_size > 10_000
        out.unlink()
    result = _main(["view", str(path)], env=env)
    assert result.returncode == 2 and "no display found" in result.stderr
    result = _main(["trace", str(path)])
    assert result.returncode == 2 and "is a saved trace, not a script" in result.stderr


@pytest.mark.slow
def test_screenshot_of_an_unreadable_script_says_why(tmp_path):
    loop = tmp_path / "loop.py"
    loop.symlink_to(tmp_path / "loop2.py")
    (tmp_path / "loop2.py").symlink_to(loop)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", BACKPROP_STUDIO_SETTINGS=str(tmp_path / "s.ini"))
    for target, words in ((loop, "a loop of symbolic links"), (tmp_path, "a folder, not a file")):
        result = _main([str(target), "--screenshot", str(tmp_path / "x.png")], env=env)
        assert result.returncode == 2
        assert words in result.stderr
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"# -*- coding: latin-1 -*-\nimport torch\nx = torch.ones(2, requires_grad=True)\n"
                      b"(x * 2).sum().backward()\nprint('caf\xe9')\n")
    result = _main([str(latin), "--screenshot", str(tmp_path / "latin.png")], env=env, timeout=180)
    assert result.returncode == 0, result.stderr
