"""Every way a script can fail leaves the parent alive with a structured error and the right line."""

import pytest

from core.client.handle import WorkerClient, run_capture

pytest.importorskip("torch")

CASES = {
    "raises": ("import torch\nx = torch.ones(2, requires_grad=True)\n(x * 2).sum().backward()\n"
               "raise ValueError('boom')\n", "ValueError", "exception", 4, "boom"),
    "syntax": ("import torch\nx = (\n", "SyntaxError", "syntax", 2, "never closed"),
    "sys_exit": ("import sys\nprint('leaving')\nsys.exit(3)\n", "SystemExit", "exit", 3, "sys.exit(3)"),
    "os_exit": ("import os\nprint('leaving')\nos._exit(7)\n", "WorkerExited", "exit", 3, "os._exit(7)"),
    "abort": ("import os\nimport torch\nos.abort()\n", "WorkerDied", "crash", 3, "signal 6"),
    "hang": ("import time\nwhile True:\n    time.sleep(0.01)\n", "WorkerDied", "timeout", 3, "time limit of 3 s"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_failure_modes(tmp_path, case):
    source, etype, kind, line, fragment = CASES[case]
    script = tmp_path / f"{case}.py"
    script.write_text(source)
    result = run_capture(str(script), timeout=3 if case == "hang" else 60)
    err = result.trace.error
    assert err is not None
    assert (err.type, err.kind, err.line) == (etype, kind, line)
    assert fragment in err.message
    if case == "abort":
        assert "Fatal Python error: Aborted" in err.fault
    if case == "raises":
        assert "ValueError: boom" in err.traceback
        assert len(result.trace.calls) == 1  # the backward before the error is kept
    if case in ("sys_exit", "os_exit"):
        assert "leaving" in result.output


@pytest.mark.slow
def test_megabytes_of_output(tmp_path):
    script = tmp_path / "flood.py"
    script.write_text("for i in range(100000):\n    print('x' * 50)\nprint('done')\n")
    result = run_capture(str(script), timeout=60)
    assert result.trace.error is None
    assert result.output_bytes == 100000 * 51 + 5
    assert result.output.endswith("done\n")
    assert len(result.output) <= 64 * 1024


@pytest.mark.slow
def test_devices_reported_and_bad_device(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("import os\nprint(os.environ['BACKPROP_STUDIO_DEVICE'])\n")
    events = []
    result = run_capture(str(script), device="cpu", on_event=events.append)
    hello = [e for e in events if e.get("type") == "hello"]
    assert hello and hello[0]["devices"][0] == {"id": "cpu", "name": "CPU", "kind": "cpu"}
    assert result.output.strip() == "cpu"
    bad = run_capture(str(script), device="cuda:7")
    assert bad.trace.error.type == "DeviceError"
    assert "cuda:7" in bad.trace.error.message


@pytest.mark.slow
def test_cancel_then_run_again(tmp_path):
    import threading

    hang = tmp_path / "hang.py"
    hang.write_text("import time\nwhile True:\n    time.sleep(0.01)\n")
    ok = tmp_path / "ok.py"
    ok.write_text("import torch\nx = torch.ones(3, requires_grad=True)\n(x * x).sum().backward()\n")
    results = {}
    done = threading.Event()

    def on_event(e):
        if e["type"] == "finished":
            results[e["run"]] = e["result"]
            done.set()
        if e["type"] == "started":
            started.set()

    started = threading.Event()
    client = WorkerClient(on_event)
    try:
        first = client.run(str(hang), timeout=120)
        assert started.wait(60)
        client.cancel()
        assert done.wait(30)
        assert results[first].trace.error.kind == "cancelled"
        done.clear()
        second = client.run(str(ok))
        assert done.wait(60)
        trace = results[second].trace
        assert trace.error is None
        assert trace.calls[0].leaf_grads["x"].data == [2.0, 2.0, 2.0]
    finally:
        client.close()


@pytest.mark.slow
def test_a_stop_that_comes_before_the_run_ends_it_before_the_first_line(tmp_path):
    """Stop pressed while the worker is still starting reaches it before the run command: the run
    ends before the script's first line, as "stopped by you". Before, the run forgot the Stop and
    the script ran until the app killed the worker after its grace."""
    import json
    import subprocess
    import sys

    from core.client.process import ROOT
    from core.protocol.messages import Cancel, Run

    script = tmp_path / "never.py"
    script.write_text("print('the script ran', flush=True)\nimport time\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-m", "core.worker", "--fallback-file", str(tmp_path / "result.jsonl")],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for cmd in (Cancel(), Run(run=1, path=str(script), device="cpu")):
            proc.stdin.write((json.dumps(cmd.to_dict()) + "\n").encode())
        proc.stdin.flush()
        for raw in proc.stdout:
            msg = json.loads(raw)
            if msg["type"] == "trace":
                break
        _, said = proc.communicate(b'{"cmd": "quit"}\n', timeout=30)
    finally:
        proc.kill()
    err = msg["trace"]["error"]
    assert (err["type"], err["kind"], err["message"]) == ("KeyboardInterrupt", "cancelled", "stopped by you")
    assert msg["trace"]["calls"] == [] and b"the script ran" not in said


def test_a_run_gets_one_keyboard_interrupt(sigint_gate):
    """A second Stop (a double click) is not raised inside the handlers still dealing with the
    first, where it would lose what they save; the next run can be stopped again."""
    import _thread

    def spin():  # the handler runs between two bytecodes of the main thread
        for _ in range(10_000):
            pass

    sigint_gate.start()
    seen = []
    try:
        _thread.interrupt_main()
        spin()
    except KeyboardInterrupt:
        seen.append("stopped")
        _thread.interrupt_main()  # the second Stop, while the first is handled
        spin()
        seen.append("handled")
    assert seen == ["stopped", "handled"]
    sigint_gate.start()
    with pytest.raises(KeyboardInterrupt):
        _thread.interrupt_main()
        spin()
