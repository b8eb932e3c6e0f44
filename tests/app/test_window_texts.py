"""The window's own texts: the Help menu's shortcuts and tour, and the title naming the graph shown."""

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from core.model.trace import Trace
from tests.fixtures_graphs import mlp_call

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    """The main window, its worker started only when a test runs a script."""
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.session.worker_handle import WorkerHandle
    from app.window.window import MainWindow

    w = MainWindow(handle=WorkerHandle(prestart=False), timeout=120)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    yield w
    w.handle.close()


def _help_menu(window):
    return next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")


def test_help_menu_has_shortcuts_and_getting_started(qtbot, window):
    texts = [a.text() for a in _help_menu(window).actions() if not a.isSeparator()]
    assert texts == ["&Getting Started", "&Keyboard Shortcuts", "&About Backprop Studio"]


def test_shortcuts_dialog_lists_the_actions_keys(qtbot, window):
    from app.window.help_dialogs import ShortcutsDialog

    dialog = ShortcutsDialog(window)
    qtbot.addWidget(dialog)
    rows = dialog.rows()
    assert ("Open", "Ctrl+O") in rows and ("Continue", "F5") in rows and ("Step", "F10") in rows
    assert ("Debug", "F9") in rows and ("Export", "Ctrl+E") in rows and ("Open Trace", "Ctrl+Shift+O") in rows
    assert ("Keyboard Shortcuts", "Ctrl+/") in rows and ("Getting Started", "F1") in rows
    # Read from the actions: a shortcut changed is listed as it now is.
    window.act_fit.setShortcut("Ctrl+9")
    assert ("Fit to Window", "Ctrl+9") in ShortcutsDialog(window).rows()
    keys = [k for _, k in rows]
    assert len(keys) == len(set(keys)), "two actions share a shortcut"


def test_getting_started_lists_every_example_and_opens_one(qtbot, window, monkeypatch):
    from app.window.help_dialogs import GettingStartedDialog

    opened = []
    monkeypatch.setattr(window, "open_script", lambda path, **_: opened.append(path) or True)
    dialog = GettingStartedDialog(window)
    qtbot.addWidget(dialog)
    items = [dialog.list.item(i) for i in range(dialog.list.count())]
    assert [Path(i.data(Qt.ItemDataRole.UserRole)).name for i in items] == \
        sorted(p.name for p in EXAMPLES.glob("[0-9]*.py"))
    lines = {Path(i.data(Qt.ItemDataRole.UserRole)).name: i.text() for i in items}
    assert lines["07_grad_accumulation.py"] == \
        "07_grad_accumulation.py — .grad accumulates across backward calls until it is zeroed."
    assert all(" — " in text and "`" not in text for text in lines.values())
    dialog.list.itemActivated.emit(items[0])
    assert opened == [str(EXAMPLES / "01_multiply.py")]


def test_title_texts():
    from app.window.title import compose_title

    assert compose_title(None) == "Backprop Studio"
    assert compose_title("A.py", "B.py", "running") == "running B.py — showing A.py — Backprop Studio"
    assert compose_title("A.py", "A.py", "running") == "running A.py — showing the previous run — Backprop Studio"
    assert compose_title("B.py", "B.py", "debugging", shown_is_the_run=True) == "debugging B.py — Backprop Studio"
    assert compose_title("A.py", "B.py", failed="B.py") == "A.py — the run of B.py failed — Backprop Studio"
    assert compose_title(None, "B.py", "running") == "running B.py — Backprop Studio"


@pytest.mark.qt_log_ignore("This plugin does not support")  # offscreen: no raise() nor size hints
def test_a_saved_trace_is_titled_by_its_file_and_a_sent_one_by_its_caller(qtbot, window, tmp_path):
    from app.session.open_trace import open_trace

    path = tmp_path / "shared.json"
    Trace(calls=[mlp_call()], script="/elsewhere/train.py", call_count=1).save(path)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=20_000):
        assert open_trace(window, str(path))
    assert window.windowTitle() == "shared.json — Backprop Studio"
    sent = tmp_path / "show-k2j4h1.json"  # show()'s private file: its name means nothing
    Trace(calls=[mlp_call()], script="/home/me/loss.py", call_count=1).save(sent)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=20_000):
        window.open_sent_trace(str(sent), "loss.py:10")
    assert window.windowTitle() == "loss.py:10 — Backprop Studio"


def test_the_show_link_carries_the_callers_title(qtbot):
    from app.session.show_server import ShowServer
    from core.client.show_link import send_open

    short = Path(tempfile.mkdtemp(prefix="bps-"))  # Unix socket paths must stay under ~100 bytes
    server = ShowServer(name=str(short / "show.sock"))
    try:
        assert server.listening
        replies = []
        os.environ["BACKPROP_STUDIO_SOCKET"] = server.name
        try:
            with qtbot.waitSignal(server.sig_show, timeout=20_000) as blocker:
                sender = threading.Thread(target=lambda: replies.append(send_open("/x/t.json", title="nb.py:3")))
                sender.start()
            sender.join(10)
        finally:
            del os.environ["BACKPROP_STUDIO_SOCKET"]
        assert blocker.args == ["/x/t.json", "nb.py:3"] and replies == [True]
    finally:
        server.close()
        Path(server.name).unlink(missing_ok=True)
        short.rmdir()


@pytest.mark.slow
def test_show_sends_its_callers_file_and_line(qtbot, tmp_path):
    pytest.importorskip("torch")
    from app.session.show_server import ShowServer

    short = Path(tempfile.mkdtemp(prefix="bps-"))
    server = ShowServer(name=str(short / "show.sock"))
    script = tmp_path / "loss.py"
    script.write_text(textwrap.dedent("""\
        import os
        import torch
        from backprop_studio import show
        w = torch.ones(3, requires_grad=True)
        loss = (w * 2).sum()
        show(loss, save=os.environ["SHOW_OUT"])
        """), encoding="utf-8")
    out = tmp_path / "sent.json"
    proc = subprocess.Popen([sys.executable, str(script)], cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), BACKPROP_STUDIO_SOCKET=server.name,
                                     SHOW_OUT=str(out)))
    try:
        with qtbot.waitSignal(server.sig_show, timeout=120_000) as blocker:
            pass
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
        Path(server.name).unlink(missing_ok=True)
        short.rmdir()
    assert proc.returncode == 0, stderr
    assert blocker.args == [str(out.resolve()), 'loss.py:6 — show(loss, save=os.environ["SHOW_OUT"])']


@pytest.mark.slow
def test_title_names_the_graph_shown_while_a_new_run_goes_and_after_it_fails(qtbot, window, tmp_path):
    with qtbot.waitSignal(window.sig_trace_shown, timeout=120_000):
        window.open_script(str(EXAMPLES / "01_multiply.py"))
    assert window.windowTitle() == "01_multiply.py — Backprop Studio"
    go = tmp_path / "go"
    broken = tmp_path / "broken.py"
    broken.write_text(textwrap.dedent(f"""\
        import pathlib, time
        deadline = time.monotonic() + 100
        while not pathlib.Path({str(go)!r}).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise ValueError("no graph today")
        """), encoding="utf-8")
    window.open_script(str(broken))
    qtbot.waitUntil(lambda: window.windowTitle() == "running broken.py — showing 01_multiply.py — Backprop Studio",
                    timeout=60_000)
    with qtbot.waitSignal(window.sig_trace_shown, timeout=120_000):
        go.write_text("")
    assert window.call is not None and window.trace.script.endswith("01_multiply.py")  # the graph stayed
    assert window.windowTitle() == "01_multiply.py — the run of broken.py failed — Backprop Studio"


def test_a_new_window_for_show_is_titled_by_its_caller(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import backprop_studio
    from app.gui import build_parser

    started = []
    monkeypatch.delenv("BACKPROP_STUDIO_WORKER", raising=False)
    monkeypatch.setattr(backprop_studio, "send_open", lambda path, timeout=3.0, title=None: False)
    monkeypatch.setattr(backprop_studio.subprocess, "Popen", lambda args, **kw: started.append(args))
    a = torch.tensor([2.0], requires_grad=True)
    line = sys._getframe().f_lineno + 1
    path = backprop_studio.show(a * 3, save=tmp_path / "c.json")
    ((args),) = started
    title = f"test_window_texts.py:{line} — backprop_studio.show(a * 3, …)"
    assert args[-3:] == ["--title", title, path]
    parsed = build_parser().parse_args(args[-3:])
    assert (parsed.title, parsed.script) == (title, path)
