"""show(loss) captures in the caller's process the same call a traced run gives, and reaches a window."""

import json
from dataclasses import replace
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""\
    import os
    import torch
    from backprop_studio import record, show

    with record():
        w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
        b = torch.tensor(0.5, requires_grad=True)
        x = torch.tensor([0.5, 1.0, 2.0])
        y = (w * x).sum() + b
        loss = torch.relu(y) ** 2
    print(show(loss, save=os.environ.get("SHOW_OUT"), open_window=bool(os.environ.get("SHOW_WINDOW"))))
    """)


def _run_show(script: Path, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **env_extra)
    env.pop("BACKPROP_STUDIO_WORKER", None)
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(script.parent))


@pytest.mark.slow
def test_show_gives_the_call_of_a_traced_run(tmp_path):
    pytest.importorskip("torch")
    from core.client.handle import run_capture
    from core.model.trace_json import load_trace

    script = tmp_path / "loss.py"
    script.write_text(SCRIPT, encoding="utf-8")
    out = tmp_path / "shown.json"
    proc = _run_show(script, {"SHOW_OUT": str(out)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out.resolve())
    shown = load_trace(out)
    traced = run_capture(str(script), timeout=300).trace  # show() does nothing inside a traced run
    assert traced.error is None and traced.output.strip() == "None"
    assert len(shown.calls) == len(traced.calls) == 1
    # nodes, names, lines, saved tensors, values: all equal; only a traced run times each node's creation
    untimed = replace(traced.calls[0], nodes=[replace(n, created=None) for n in traced.calls[0].nodes])
    assert all(n.created is not None for n in traced.calls[0].nodes if n.seq is not None)
    assert shown.calls[0] == untimed
    call = shown.calls[0]
    assert [(n.name, n.label, n.line) for n in call.nodes[:3]] == [
        ("PowBackward0", "loss", 10), ("ReluBackward0", None, 10), ("AddBackward0", "y", 9)]
    assert {t.name for t in shown.tensors} == {t.name for t in traced.tensors} >= {"w", "b", "x", "y", "loss"}
    assert shown.source == SCRIPT
    # Backward did not run in the caller: its leaves have no grad.
    leaves = [call.tensor(n.variable) for n in call.nodes if n.name == "AccumulateGrad"]
    assert sorted(t.name for t in leaves) == ["b", "w"] and all(t.grad is None for t in leaves)


@pytest.mark.slow
def test_show_reaches_a_running_window(qtbot, tmp_path):
    pytest.importorskip("torch")
    from app.session.show_server import ShowServer

    import tempfile

    short = Path(tempfile.mkdtemp(prefix="bps-"))  # Unix socket paths must stay under ~100 bytes
    sock = str(short / "show.sock")
    server = ShowServer(name=sock)
    assert server.listening
    script = tmp_path / "loss.py"
    script.write_text(SCRIPT, encoding="utf-8")
    out = tmp_path / "sent.json"
    proc = subprocess.Popen([sys.executable, str(script)], cwd=str(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), BACKPROP_STUDIO_SOCKET=sock,
                                     SHOW_OUT=str(out), SHOW_WINDOW="1"))
    try:
        with qtbot.waitSignal(server.sig_open, timeout=60_000) as blocker:
            pass
        assert blocker.args == [str(out.resolve())]
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
        Path(sock).unlink(missing_ok=True)
        short.rmdir()
    assert proc.returncode == 0, stderr
    assert "PyQt" not in stderr and json.loads(out.read_text())["calls"][0]["api"] == "unreached"


@pytest.mark.slow
def test_caller_needs_no_qt(tmp_path):
    """show() imports no Qt in the caller, with or without a window to reach."""
    pytest.importorskip("torch")
    script = tmp_path / "noqt.py"
    script.write_text(textwrap.dedent("""\
        import sys
        import torch
        from backprop_studio import show
        x = torch.ones(2, requires_grad=True)
        show((x * 3).sum(), save=sys.argv[1], open_window=False)
        from core.client.show_link import send_open
        assert not send_open(sys.argv[1], timeout=0.5)  # nobody listens
        assert not any(m.startswith("PySide6") for m in sys.modules), sorted(m for m in sys.modules if "Qt" in m)
        """), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), BACKPROP_STUDIO_SOCKET=str(tmp_path / "none.sock"))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "t.json")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
@pytest.mark.qt_log_ignore("This plugin does not support raise", "This plugin does not support activateWindow")
def test_window_opens_a_sent_trace(qtbot, tmp_path, monkeypatch):
    """The window shows a trace file, as show() sends it: graph, source and no run."""
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    from app.window.window import MainWindow
    from core.model.trace import CallInfo, Edge, NodeInfo, Trace

    nodes = [NodeInfo(id="n0", name="SumBackward0", kind="backward", next=[Edge("n1", 0)], label="loss", line=2),
             NodeInfo(id="n1", name="AccumulateGrad", kind="accumulate_grad", next=[])]
    trace = Trace(calls=[CallInfo(id="c0", index=0, api="unreached", line=None, roots=["n0"], nodes=nodes,
                                  tensors=[], node_count=2, edge_count=1)],
                  script="/somewhere/loss.py", source="import torch\nloss = x.sum()\n")
    path = tmp_path / "t.json"
    trace.save(path)
    w = MainWindow(timeout=60)
    qtbot.addWidget(w)
    w.show()
    try:
        with qtbot.waitSignal(w.sig_trace_shown, timeout=30_000):
            w.open_sent_trace(str(path))
        assert w.call is not None and {n.id for n in w.call.nodes} == {"n0", "n1"}
        assert set(w.graph.node_items) == {"n0", "n1"}
        assert w.source.editor.toPlainText() == "import torch\nloss = x.sum()\n"
    finally:
        w.handle.close()


def test_show_opens_a_new_window_when_none_listens(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import backprop_studio
    import core.client.show_link

    started = []
    monkeypatch.delenv("BACKPROP_STUDIO_WORKER", raising=False)
    monkeypatch.setattr(core.client.show_link, "send_open", lambda path, timeout=3.0: False)
    monkeypatch.setattr(backprop_studio.subprocess, "Popen", lambda args, **kw: started.append((args, kw)))
    a = torch.tensor([2.0], requires_grad=True)
    c = a * 3
    path = backprop_studio.show(c, save=tmp_path / "c.json")
    ((args, kw),) = started
    assert args[0] == sys.executable and args[-1] == path == str((tmp_path / "c.json").resolve())
    assert "from app.main import main" in args[2] and kw["stdin"] == subprocess.DEVNULL
    assert str(ROOT) in kw["env"]["PYTHONPATH"].split(os.pathsep)
    call = json.loads((tmp_path / "c.json").read_text())["calls"][0]
    assert [n["name"] for n in call["nodes"]] == ["MulBackward0", "AccumulateGrad"]
    assert call["nodes"][0]["label"] == "c"


def _run_file(path: Path, code: str) -> dict:
    """Run ``code`` as the file ``path``, as python runs a script (its lines readable by linecache)."""
    import runpy

    path.write_text(code, encoding="utf-8")
    return runpy.run_path(str(path))


def test_the_title_names_the_callers_file_line_and_call(tmp_path):
    code = ("import sys\nfrom core.client.show_link import caller_title\n"
            "def show(*args, **kwargs):\n    return caller_title(sys._getframe(1))\n"
            + "\n" * 36 + "loss = 1\n"
            "shown = show(loss)\n"  # line 42
            "long = show(loss, save='runs/2024-05-01/epoch-17/loss-graph.json', open_window=False)\n"
            "over = show(\n    loss,\n    open_window=False,\n)\n"
            "spaced = show( loss )\n")
    names = _run_file(tmp_path / "train.py", code)
    assert names["shown"] == "train.py:42 — show(loss)"
    assert names["long"] == "train.py:43 — show(loss, …)"
    assert names["over"] == "train.py:44 — show(loss, open_window=False,)"
    assert names["spaced"] == "train.py:48 — show(loss)"


def test_the_title_is_the_file_and_line_without_source():
    from core.client.show_link import caller_title

    namespace = {"caller_title": caller_title, "sys": sys}
    exec(compile("title = caller_title(sys._getframe(0))", "<typed>", "exec"), namespace)
    assert namespace["title"] == "<typed>:1"


SHOWN = """\
import torch
import backprop_studio
w = torch.tensor([1.0, 2.0], requires_grad=True)
scale = torch.tensor([3.0, 4.0])
d = w.detach()
loss = (w * scale).sum() + (w / d).sum() + (w + scale).sum()
backprop_studio.show(loss, save=OUT)
"""


def test_show_titles_the_window_and_names_its_cut_inputs(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import backprop_studio
    from core.model.causes import cut_text

    started = []
    monkeypatch.delenv("BACKPROP_STUDIO_WORKER", raising=False)
    monkeypatch.setattr(backprop_studio, "send_open", lambda path, timeout=3.0, title=None: False)
    monkeypatch.setattr(backprop_studio.subprocess, "Popen", lambda args, **kw: started.append(args))
    out = tmp_path / "loss.json"
    _run_file(tmp_path / "train.py", SHOWN.replace("OUT", repr(str(out))))
    ((args),) = started
    assert args[-3:] == ["--title", "train.py:7 — backprop_studio.show(loss, …)", str(out)]
    nodes = json.loads(out.read_text())["calls"][0]["nodes"]
    cuts = {n["name"]: [(c["input"], c["cause"], c["name"]) for c in n["cuts"]] for n in nodes if n.get("cuts")}
    # the div's cut is d: a tensor detach() made; the mul's is scale, a constant; the add saved nothing
    assert cuts == {"MulBackward0": [(1, "constant", "scale")], "DivBackward0": [(1, "detach", "d")],
                    "AddBackward0": [(1, "constant", None)]}
    said = {n["name"]: cut_text(n["cuts"][0], short=True) for n in nodes if n.get("cuts")}
    assert said == {"MulBackward0": "scale: requires_grad=False", "DivBackward0": "d: made by .detach()",
                    "AddBackward0": "requires_grad=False"}


def test_a_kernel_cell_is_titled_by_its_execution_count(tmp_path, monkeypatch):
    import types

    shell = types.SimpleNamespace(execution_count=5)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    cell = tmp_path / "ipykernel_4242" / "2815521436.py"  # the file a kernel compiles a cell as
    cell.parent.mkdir()
    names = _run_file(cell, "import sys\nfrom core.client.show_link import caller_title\n"
                            "def show(t):\n    return caller_title(sys._getframe(1))\nloss = 1\nshown = show(loss)\n")
    assert names["shown"] == "cell [5], line 6 — show(loss)"
    shell.execution_count = None  # no count: the file's name and line
    assert _run_file(cell, cell.read_text())["shown"] == "2815521436.py:6 — show(loss)"
