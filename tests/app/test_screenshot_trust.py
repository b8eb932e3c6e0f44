"""--screenshot never waits on a dialog: a pickled model is refused, shown, and the process ends."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MAKE = textwrap.dedent("""\
    import sys
    import torch
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x)

    class Planted:
        def __reduce__(self):  # runs when the file is unpickled
            return (open, (sys.argv[2], "w"))

    torch.save({"model": Net(), "planted": Planted()}, sys.argv[1])
    """)


@pytest.mark.slow
def test_screenshot_of_a_pickled_model_shows_the_refusal_and_ends(tmp_path):
    pytest.importorskip("torch")
    model, ran, shot = tmp_path / "net.pt", tmp_path / "ran.txt", tmp_path / "shot.png"
    maker = tmp_path / "make.py"
    maker.write_text(MAKE, encoding="utf-8")
    subprocess.run([sys.executable, str(maker), str(model), str(tmp_path / "made.txt")], check=True, timeout=120)
    proc = subprocess.Popen([sys.executable, str(ROOT / "main.py"), str(model), "--screenshot", str(shot),
                             "--size", "1000x700"],
                            env=dict(os.environ, QT_QPA_PLATFORM="offscreen",
                                     BACKPROP_STUDIO_SETTINGS=str(tmp_path / "settings.ini")),
                            cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=120)  # a modal dialog would wait forever
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 1, stderr
    assert "net.pt is a whole pickled model" in stderr and "pass --trust-pickle" in stderr
    assert shot.stat().st_size > 10_000  # the window, with the refusal in Problems
    assert not ran.exists()


def test_a_window_that_is_not_interactive_asks_nothing(qtbot, tmp_path, monkeypatch):
    """A refusal with a fix (trust a pickle, type shapes) is shown, not asked, when nobody can answer."""
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.session import open_files
    from app.window.window import MainWindow
    from core.client.handle import RunResult
    from core.model.trace import ErrorInfo, Trace

    asked = []
    monkeypatch.setattr(open_files, "ask_fix", lambda *a, **k: asked.append(a) or None)
    w = MainWindow(timeout=60)
    qtbot.addWidget(w)
    w.interactive = False
    error = ErrorInfo("OpenError", "net.pt is a whole pickled model; pass --trust-pickle", kind="load",
                      reason="unsafe_pickle")
    try:
        with qtbot.waitSignal(w.sig_trace_shown, timeout=30_000):
            w._on_finished(RunResult(Trace(calls=[], error=error), "", 0, 0.5))
        assert asked == [] and w.last_error is error
        assert w.problems.problems()[0].summary == "OpenError: net.pt is a whole pickled model; pass --trust-pickle"
    finally:
        w.handle.close()
