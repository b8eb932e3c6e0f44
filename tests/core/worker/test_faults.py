"""Hostile scripts: nothing hangs, nothing captured is lost, no process or temp file outlives the run.

Each case runs a real worker and checks that the command returns within its limit, the
message names the cause (and the line where there is one), every call completed before the
fault is in the trace, no process of the worker's process group is left, and the temp
folder is empty afterwards.
"""

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from core.client.handle import WorkerClient, run_capture
from core.client.process import WorkerProcess
from core.client.run_errors import script_problem

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]

BACKWARD = "import torch\nx = torch.ones(3, requires_grad=True)\n(x * 2).sum().backward()\n"  # lines 1-3


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch):
    """A temp folder of our own, so leftover files are ours to count."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _group(pgid: int) -> list[int]:
    alive = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return alive


def _run(tmp_path, source: str, *, limit: float, timeout: float = 60, name: str = "script.py"):
    """Run ``source`` as a script; check the time, the process group and the temp folder."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(source))
    pids = []

    def on_event(event):
        if event.get("type") == "hello":
            pids.append(event["pid"])

    start = time.monotonic()
    result = run_capture(str(script), timeout=timeout, on_event=on_event)
    elapsed = time.monotonic() - start
    assert elapsed < limit, f"took {elapsed:.1f} s"
    assert pids
    deadline = time.monotonic() + 5
    while _group(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group(pids[0]) == [], "a process of the run outlived it"
    assert list(Path(tempfile.gettempdir()).iterdir()) == []

    def ours() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith(("worker-", "close-worker-"))]

    def timers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if isinstance(t, threading.Timer)]

    # The pipe readers end once the last bytes are read, and a cancelled timer's thread once it
    # wakes: under load a moment later (a timer left running would live for the run's time limit).
    deadline = time.monotonic() + 5
    while (ours() or timers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert timers() == []  # time limit cancelled
    assert ours() == []
    return result


def _one_call(result) -> None:
    calls = [c for c in result.trace.calls if c.api != "unreached"]
    assert len(calls) == 1
    assert calls[0].line == 3
    assert calls[0].leaf_grads["x"].data == [2.0, 2.0, 2.0]


@pytest.mark.slow
def test_fork_pool_returns_and_leaves_no_child(tmp_path):
    result = _run(tmp_path, BACKWARD + textwrap.dedent("""\
        import multiprocessing as mp
        def square(v):
            return v * v
        if __name__ == "__main__":
            with mp.get_context("fork").Pool(2) as pool:
                print("sum", sum(pool.map(square, range(10))))
        """), limit=60)
    assert result.trace.error is None
    assert "sum 285" in result.output
    _one_call(result)


@pytest.mark.slow
def test_spawn_process_runs_the_script_as_main(tmp_path):
    result = _run(tmp_path, """\
        import multiprocessing as mp
        def child(q):
            q.put("from the child")
        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start()
            print(q.get(timeout=60))
            p.join()
        """, limit=90)
    assert result.trace.error is None, result.trace.error
    assert "from the child" in result.output


@pytest.mark.slow
def test_hung_pool_children_are_killed_at_the_time_limit(tmp_path):
    result = _run(tmp_path, BACKWARD + textwrap.dedent("""\
        import multiprocessing as mp, time
        def forever(v):
            while True:
                time.sleep(0.05)
        pool = mp.get_context("fork").Pool(2)
        pool.map(forever, range(2))
        """), timeout=4, limit=30)
    err = result.trace.error
    assert err.kind == "timeout" and "time limit of 4 s" in err.message
    assert err.line == 9
    _one_call(result)


@pytest.mark.slow
def test_orphan_children_do_not_outlive_the_run(tmp_path):
    result = _run(tmp_path, BACKWARD + textwrap.dedent("""\
        import subprocess, multiprocessing as mp, time
        subprocess.Popen(["sleep", "300"])
        def nap():
            time.sleep(300)
        child = mp.get_context("fork").Process(target=nap, daemon=True)
        child.start()
        print("left children behind")
        """), limit=30)
    assert result.trace.error is None
    assert "left children behind" in result.output
    _one_call(result)


@pytest.mark.slow
def test_input_fails_at_once_with_a_message(tmp_path):
    result = _run(tmp_path, BACKWARD + "name = input('your name? ')\n", limit=30)
    err = result.trace.error
    assert err.type == "EOFError" and err.line == 4
    assert "scripts get no input" in err.message
    _one_call(result)


@pytest.mark.slow
def test_reading_stdin_finds_it_empty(tmp_path):
    result = _run(tmp_path, BACKWARD + "import sys\nprint('read', len(sys.stdin.read()), 'characters')\n", limit=30)
    assert result.trace.error is None
    assert "read 0 characters" in result.output
    _one_call(result)


@pytest.mark.slow
def test_closing_stdout_and_stderr_keeps_the_result(tmp_path):
    result = _run(tmp_path, BACKWARD + "import os\nprint('bye', flush=True)\nos.close(1)\nos.close(2)\n", limit=30)
    assert result.trace.error is None
    assert "bye" in result.output
    _one_call(result)


@pytest.mark.slow
def test_closing_every_descriptor_keeps_the_result(tmp_path):
    result = _run(tmp_path, BACKWARD + "import os\nos.closerange(3, 65536)\ny = x * 3\n", limit=30)
    assert result.trace.error is None
    _one_call(result)


@pytest.mark.slow
def test_writes_to_fd_3_cannot_forge_a_result(tmp_path):
    forged = ('{"type":"trace","run":1,"trace":{"format":"backprop-studio-trace","version":1,'
              '"calls":[],"error":{"type":"Forged","message":"forged"}}}\n')
    result = _run(tmp_path, BACKWARD + textwrap.dedent(f"""\
        import os
        for fd in range(3, 20):
            try:
                os.write(fd, {forged.encode()!r})
            except OSError:
                pass
        """), limit=30)
    assert result.trace.error is None
    _one_call(result)


@pytest.mark.slow
def test_fork_then_crash_names_the_parent_crash(tmp_path):
    result = _run(tmp_path, BACKWARD + textwrap.dedent("""\
        import ctypes, os
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        ctypes.string_at(0)
        """), limit=30)
    err = result.trace.error
    assert (err.type, err.kind, err.line) == ("WorkerDied", "crash", 9)
    assert "SIGSEGV" in err.message and "os._exit" not in err.message
    _one_call(result)


@pytest.mark.parametrize("ending, kind, line", [
    ("import os\nos._exit(3)\n", "exit", 5),
    ("import ctypes\nctypes.string_at(0)\n", "crash", 5),
])
def test_calls_before_a_hard_exit_are_kept(tmp_path, ending, kind, line):
    result = _run(tmp_path, BACKWARD + ending, limit=30)
    err = result.trace.error
    assert (err.kind, err.line) == (kind, line)
    _one_call(result)
    assert result.trace.source.startswith("import torch")


@pytest.mark.slow
def test_time_limit_names_the_line_even_when_sigusr1_is_ignored(tmp_path):
    result = _run(tmp_path, BACKWARD + textwrap.dedent("""\
        import signal, time
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        while True:
            time.sleep(0.01)
        """), timeout=4, limit=30)
    err = result.trace.error
    assert err.kind == "timeout" and err.line == 7
    _one_call(result)


def _stop(tmp_path, source: str):
    script = tmp_path / "stop.py"
    script.write_text(textwrap.dedent(source))
    events = {"started": threading.Event(), "done": threading.Event(), "call_done": threading.Event()}
    box = {}

    def on_event(e):
        if e["type"] == "call_done":
            events["call_done"].set()
        if e["type"] == "hello":
            box["pid"] = e["pid"]
        if e["type"] == "finished":
            box["result"] = e["result"]
            events["done"].set()

    client = WorkerClient(on_event, prestart=False)
    try:
        client.run(str(script), timeout=120)
        assert events["call_done"].wait(60)
        time.sleep(0.3)
        start = time.monotonic()
        client.cancel()
        assert events["done"].wait(20)
        assert time.monotonic() - start < 10
    finally:
        client.close()
    assert _group(box["pid"]) == []
    assert list(Path(tempfile.gettempdir()).iterdir()) == []
    return box["result"]


@pytest.mark.slow
def test_stop_names_the_line(tmp_path):
    result = _stop(tmp_path, BACKWARD + "while True:\n    sum(range(100))\n")
    err = result.trace.error
    assert err.kind == "cancelled"
    assert err.line in (4, 5) and err.message == f"stopped by you at line {err.line}"
    _one_call(result)


@pytest.mark.slow
def test_stop_of_a_script_that_swallows_interrupts_names_the_line(tmp_path):
    result = _stop(tmp_path, BACKWARD + textwrap.dedent("""\
        import signal
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            sum(range(100))
        """))
    err = result.trace.error
    assert err.kind == "cancelled" and err.type == "Stopped"
    assert err.line in (7, 8) and err.message == f"stopped by you at line {err.line}"
    assert "SIGKILL" not in err.message
    _one_call(result)


@pytest.mark.slow
def test_long_unbroken_output_and_progress_bars(tmp_path):
    result = _run(tmp_path, BACKWARD + textwrap.dedent("""\
        import sys
        sys.stdout.write("x" * 5_000_000)
        for i in range(2000):
            sys.stdout.write(f"\\rprogress {i}")
        print()
        """), limit=60)
    assert result.trace.error is None
    assert result.output_bytes > 5_000_000
    assert result.output.rstrip().endswith("progress 1999")
    _one_call(result)


@pytest.mark.slow
def test_fault_file_is_private_and_never_follows_a_symlink(tmp_path, private_tmp):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    worker = WorkerProcess(lambda msg: None)
    assert worker.fault_path.parent == private_tmp
    assert str(os.getpid()) not in worker.fault_path.name  # not predictable
    assert stat.S_IMODE(worker.fault_path.stat().st_mode) == 0o600
    worker.fault_path.unlink()
    worker.fault_path.symlink_to(victim)  # planted between creation and start
    worker.start()
    try:
        assert worker.ready.wait(60)
        worker.send({"cmd": "dump"})
        time.sleep(0.5)
    finally:
        worker.close()
    assert victim.read_text() == "precious"
    assert list(private_tmp.iterdir()) == []


@pytest.mark.slow
def test_a_project_with_its_own_core_package(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "__init__.py").write_text("VALUE = 42\n")
    (tmp_path / "core" / "trace.py").write_text("def load():\n    return open('data.txt').read()\n")
    (tmp_path / "data.txt").write_text("beside the script")
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    result = _run(tmp_path, BACKWARD + textwrap.dedent("""\
        import os, sys
        from core import VALUE
        from core.trace import load
        print("value", VALUE, load())
        print("main", __name__, os.path.basename(__file__))
        print("cwd", os.getcwd() == os.path.dirname(os.path.abspath(__file__)))
        print("path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
        print("app", [m for m in ("app", "widgets") if m in sys.modules])
        with open("written.txt", "w") as f:
            f.write("here")
        """), limit=30, name="train.py")
    assert result.trace.error is None, result.trace.error
    out = result.output
    assert "value 42 beside the script" in out
    assert "main __main__ train.py" in out
    assert "cwd True" in out and "path0 True" in out and "app []" in out
    assert (tmp_path / "written.txt").read_text() == "here"
    assert not (ROOT / "written.txt").exists()
    _one_call(result)


@pytest.mark.slow
def test_children_do_not_inherit_the_app_on_pythonpath(tmp_path):
    (tmp_path / "core.py").write_text("WHO = 'the project'\n")
    result = _run(tmp_path, """\
        import subprocess, sys
        out = subprocess.run([sys.executable, "-c", "import core; print(core.WHO)"], capture_output=True, text=True)
        print("child sees", out.stdout.strip())
        """, limit=30)
    assert "child sees the project" in result.output


@pytest.mark.slow
def test_latin1_script_with_a_coding_cookie(tmp_path):
    script = tmp_path / "latin.py"
    script.write_bytes("# -*- coding: latin-1 -*-\n".encode() + BACKWARD.encode()
                      + "print('caf\xe9')\n".encode("latin-1"))
    result = run_capture(str(script), timeout=60)
    assert result.trace.error is None, result.trace.error
    assert "café" in result.output
    assert "café" in result.trace.source
    assert result.trace.calls[0].line == 4


@pytest.mark.slow
def test_directory_and_symlink_loop_are_named(tmp_path):
    loop = tmp_path / "loop.py"
    loop.symlink_to(tmp_path / "loop2.py")
    (tmp_path / "loop2.py").symlink_to(loop)
    assert script_problem(tmp_path) == f"{tmp_path}: a folder, not a file"
    assert script_problem(loop) == f"{loop}: a loop of symbolic links"
    assert script_problem(tmp_path / "missing.py") == f"{tmp_path / 'missing.py'}: no such file"
    for target, words in ((tmp_path, "a folder, not a file"), (loop, "a loop of symbolic links")):
        out = subprocess.run([sys.executable, str(ROOT / "main.py"), "trace", str(target)], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2
        assert words in out.stderr


@pytest.mark.slow
def test_export_name_template_stays_in_the_chosen_folder(tmp_path):
    from app.cli.export import safe_name

    assert safe_name(Path("/x/...py")) == "__"
    assert safe_name(Path("/x/..py")) == "_"
    assert safe_name(Path("/x/model.py")) == "model"
    script = tmp_path / "...py"
    script.write_text(BACKWARD)
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(ROOT / "main.py"), "export", str(script), "-o",
                             str(out / "{name}" / "graph.dot")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (out / "__" / "graph.dot").is_file()
    assert not (tmp_path / "graph.dot").exists()


@pytest.mark.slow
def test_non_finite_gradients_reach_the_window(tmp_path):
    script = tmp_path / "nan.py"
    script.write_text("import torch\nx = torch.zeros(2000, requires_grad=True)\n(x.sqrt() * 0).sum().backward()\n")
    result = run_capture(str(script), timeout=60)
    assert result.trace.error is None, result.trace.error
    grad = result.trace.calls[0].leaf_grads["x"]
    assert grad.numel == 2000 and "nan" in grad.sample


@pytest.mark.slow
def test_an_ended_workers_pipes_are_closed_without_close(private_tmp):
    """A worker that ends by itself (a finished run, a Stop) leaves no open pipe in the app."""
    worker = WorkerProcess(lambda msg: None)
    worker.start()
    try:
        assert worker.ready.wait(60)
        pipes = (worker.proc.stdin, worker.proc.stdout, worker.proc.stderr)
        assert not any(p.closed for p in pipes)
        worker.send({"cmd": "quit"})
        assert worker.finished.wait(30)
        deadline = time.monotonic() + 10
        while not all(p.closed for p in pipes) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p.closed for p in pipes] == [True, True, True]
    finally:
        worker.close()
