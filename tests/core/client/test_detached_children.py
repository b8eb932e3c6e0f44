"""Children that leave the worker's process group with setsid still end with the run."""

import json
import shlex
import sys
import textwrap
import threading
import time

from pathlib import Path

import psutil
import pytest

from core.client.handle import WorkerClient
from core.client.launchers import from_command
from core.protocol import events

# A child started in a session of its own, and a grandchild whose parent called setsid and
# exited (a daemon's double fork): neither is in the worker's process group.
DETACHED = """\
    import json
    import os
    import subprocess
    import time

    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            os.execvp("sleep", ["sleep", "301"])
        os.write(write, str(grandchild).encode())
        os._exit(0)
    os.waitpid(middle, 0)
    grandchild = int(os.read(read, 32))
    here = os.path.dirname(__file__)
    with open(os.path.join(here, "pids.part"), "w") as f:
        json.dump([child.pid, grandchild], f)
    os.replace(os.path.join(here, "pids.part"), os.path.join(here, "pids.json"))  # whole when it appears
    print("detached", flush=True)
    while True:
        time.sleep(0.05)
    """


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _run_detached(tmp_path, end, timeout: float = 120, launcher=None):
    """Run the script, end it with ``end(client)`` once both pids are written; return them and
    how long after the end they were gone."""
    script = tmp_path / "detached.py"
    # Behind a launcher the script runs from the host's copy: the pids come here all the same.
    script.write_text(textwrap.dedent(DETACHED).replace("os.path.dirname(__file__)", repr(str(tmp_path))))
    pids_file = tmp_path / "pids.json"
    done = threading.Event()
    client = WorkerClient(lambda e: done.set() if isinstance(e, events.Finished) else None, prestart=False,
                          launcher=launcher)
    pids = []
    try:
        client.run(str(script), timeout=timeout)
        deadline = time.monotonic() + 60
        while not pids_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = json.loads(pids_file.read_text())
        assert all(_running(p) for p in pids)
        start = time.monotonic()
        end(client)
        assert done.wait(30)
        while any(_running(p) for p in pids) and time.monotonic() - start < 20:
            time.sleep(0.05)
        return pids, time.monotonic() - start
    finally:
        client.close()
        _kill(pids)


def _kill(pids: list[int]) -> None:
    """Not to leave them behind where a test fails."""
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


@pytest.mark.slow
def test_stop_ends_children_that_called_setsid(tmp_path):
    pids, took = _run_detached(tmp_path, lambda client: client.cancel())
    assert [p for p in pids if _running(p)] == []
    assert took < 10


@pytest.mark.slow
def test_the_time_limit_ends_children_that_called_setsid(tmp_path):
    pids, took = _run_detached(tmp_path, lambda client: None, timeout=8)
    assert [p for p in pids if _running(p)] == []
    assert took < 8 + 10


@pytest.mark.slow
def test_children_that_called_setsid_end_when_the_script_does(tmp_path):
    script = tmp_path / "detached.py"
    script.write_text(textwrap.dedent(DETACHED).replace("while True:\n    time.sleep(0.05)\n", ""))
    done = threading.Event()
    client = WorkerClient(lambda e: done.set() if isinstance(e, events.Finished) else None, prestart=False)
    pids = []
    try:
        client.run(str(script), timeout=60)
        assert done.wait(60)
        pids = json.loads((tmp_path / "pids.json").read_text())
        start = time.monotonic()
        while any(_running(p) for p in pids) and time.monotonic() - start < 10:
            time.sleep(0.05)
        assert [p for p in pids if _running(p)] == []
    finally:
        client.close()
        _kill(pids)


ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stop", "time limit"])
def test_a_worker_behind_a_launcher_ends_children_that_called_setsid(tmp_path, how):
    """A host's worker (here behind ``sh -c``, as behind ssh) ends its own tree: the app
    leaves the far side's processes to it."""
    launcher = from_command(f"sh -c 'cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m core.worker'",
                            name="host")
    end = (lambda client: client.cancel()) if how == "stop" else (lambda client: None)
    pids, took = _run_detached(tmp_path, end, timeout=120 if how == "stop" else 10, launcher=launcher)
    assert [p for p in pids if _running(p)] == []
    assert took < 20
