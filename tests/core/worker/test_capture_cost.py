"""What keeps capture cheap must not change what it captures or how the script ends."""

import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from core.worker.capture.recorder import Capture, capture_script  # noqa: E402


def _capture(tmp_path, source: str):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    return capture_script(str(script))


def test_locals_are_named_after_an_import_inside_the_function(tmp_path):
    # Imports run without the name tracer; it must be back for the rest of the function, whose
    # locals are remembered when it returns (those the graph keeps alive: saved for backward).
    (tmp_path / "scale_mod.py").write_text("SCALE = 3.0\n")
    trace = _capture(tmp_path, """\
        import torch
        def build(x):
            import json
            from scale_mod import SCALE
            hidden = x * SCALE
            squashed = hidden.sigmoid()
            return (squashed * hidden).sum()
        x = torch.ones(2, requires_grad=True)
        loss = build(x)
        loss.backward()
        """)
    nodes = sorted((n.line or 0, n.name, n.label or "") for n in trace.calls[0].nodes)
    assert nodes == [(0, "AccumulateGrad", "x"), (5, "MulBackward0", "hidden"), (6, "SigmoidBackward0", "squashed"),
                     (7, "MulBackward0", ""), (7, "SumBackward0", "loss")]


def test_the_tracer_is_off_inside_imports_and_back_after(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nimport seen_mod\nafter = sys.gettrace()\n")
    (tmp_path / "seen_mod.py").write_text("import sys\nduring = sys.gettrace()\n")
    capture = Capture(str(script))
    capture.run()
    assert sys.modules["seen_mod"].during is None
    assert capture.namespace["after"] == capture.names.tracer
    assert sys.gettrace() is None
    del sys.modules["seen_mod"]


def test_cut_notes_are_kept_where_a_node_has_a_none_input(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        x = torch.ones(3, requires_grad=True)
        frozen = x.detach()
        scaled = x * 20
        mixed = scaled * frozen
        out = mixed.exp().sum()
        out.backward()
        """)
    cuts = {n.name: [(c["input"], c["cause"], c["name"], c["value"]) for c in n.cuts or ()]
            for n in trace.calls[0].nodes}
    assert cuts["ExpBackward0"] == [] and cuts["SumBackward0"] == []
    mul = [n for n in trace.calls[0].nodes if n.name == "MulBackward0"]
    assert sorted(cuts_of for n in mul for cuts_of in ([(c["cause"], c["name"], c["value"]) for c in n.cuts],)) == [
        [("detach", "frozen", "[3] tensor")], [("number", None, "20")]]


def test_backward_errors_show_no_capture_frames(tmp_path):
    trace = _capture(tmp_path, """\
        import torch
        a = torch.ones(2, requires_grad=True)
        y = (a * a).sum()
        y.backward()
        y.backward()
        """)
    assert trace.error.type == "RuntimeError" and trace.error.line == 5
    frames = [ln.strip() for ln in trace.error.traceback.splitlines() if ln.strip().startswith("File ")]
    assert frames[0] == f'File "{tmp_path / "script.py"}", line 5, in <module>'
    capture_files = ("recorder.py", "call_record.py", "creation.py")
    assert not [f for f in frames if any(f'{name}"' in f and "/core/" in f for name in capture_files)]


@pytest.mark.slow
def test_the_worker_runs_the_scripts_atexit_functions_in_its_folder(tmp_path):
    from core.client.handle import run_capture

    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""\
        import atexit, os, threading, time
        import torch
        HERE = os.path.dirname(os.path.abspath(__file__))
        def late():
            time.sleep(0.2)
            open(HERE + "/thread.txt", "w").write("joined")
        threading.Thread(target=late).start()
        atexit.register(lambda: open(HERE + "/atexit.txt", "w").write("ran"))
        atexit.register(lambda: open("beside.txt", "w").write("here"))  # relative: the script's folder
        x = torch.ones(2, requires_grad=True)
        (x * 2).sum().backward()
        """))
    result = run_capture(str(script), timeout=60)
    assert result.trace.error is None and len(result.trace.calls) == 1
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "thread.txt").read_text() == "joined"
    assert (tmp_path / "beside.txt").read_text() == "here"
