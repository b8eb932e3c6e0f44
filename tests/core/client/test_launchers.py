"""Workers behind a command: a local ``sh -c 'exec python -m core.worker'`` and a real ``ssh``
to an sshd started here with a throwaway key (skipped where sshd cannot run). Each launcher
traces, steps, stops, reports a crash and a time-out, and leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from core.client import bootstrap, launchers
from core.protocol import wire
from core.client.handle import ClientState, WorkerClient, run_capture
from core.client.process import ROOT
from core.model.memory import format_bytes
from core.client.launchers import LauncherError, from_command, from_host, resolve
from core.model.trace import Trace

PY = sys.executable


def local_launcher(mark: str) -> launchers.Launcher:
    cmd = f"sh -c 'cd {shlex.quote(str(ROOT))} && exec {shlex.quote(PY)} -m core.worker'"
    return from_command(cmd, name="local", env={"BPS_TEST_MARK": mark})


# -- sshd on localhost ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    sshd_exe = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd_exe) or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        pytest.skip("openssh-server / ssh not installed")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "userkey.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/hostkey\nAuthorizedKeysFile {d}/authorized_keys\n"
        f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        f"PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile {d}/sshd.pid\n")
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        try:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        except OSError:
            pass
    if subprocess.run([sshd_exe, "-t", "-f", str(d / "sshd_config")], capture_output=True).returncode != 0:
        pytest.skip("sshd cannot run here")
    proc = subprocess.Popen([sshd_exe, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.DEVNULL)
    options = (f"-p {port} -i {d}/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
               f"-o LogLevel=ERROR")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe = subprocess.run(["ssh", "-T", "-o", "BatchMode=yes", *shlex.split(options), "127.0.0.1", "true"],
                               capture_output=True, timeout=10)
        if probe.returncode == 0:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.skip("sshd started but ssh localhost does not log in")
    yield options
    proc.kill()
    proc.wait()


def ssh_launcher(options: str, mark: str) -> launchers.Launcher:
    # The remote command is what a host's "python" field holds: here the venv's interpreter,
    # run in the source tree (an installed package needs no cd). The mark travels in the env.
    python = f"cd {shlex.quote(str(ROOT))} && BPS_TEST_MARK={mark} {shlex.quote(PY)}"
    return from_host({"name": "localhost", "kind": "ssh", "dest": "127.0.0.1", "python": python,
                      "ssh_options": options})


@pytest.fixture(params=["local", "ssh"])
def launcher(request):
    mark = uuid.uuid4().hex
    if request.param == "local":
        launcher = local_launcher(mark)
    else:
        launcher = ssh_launcher(request.getfixturevalue("sshd"), mark)
    yield launcher, mark
    assert_no_process(mark)


def marked_processes(mark: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("BPS_TEST_MARK") == mark:
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def assert_no_process(mark: str, wait: float = 5.0) -> None:
    deadline = time.monotonic() + wait
    while marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = marked_processes(mark)
    assert not left, f"processes left running: {[p.cmdline() for p in left]}"


# -- scripts -------------------------------------------------------------------------------------
def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


PRODUCT = "import torch\na = torch.tensor([2.0, 3.0], requires_grad=True)\n" \
          "b = torch.tensor([4.0, -1.0], requires_grad=True)\nc = (a * b).sum()\nprint('ran remotely')\nc.backward()\n"


@pytest.mark.slow
def test_trace_and_step_through_launcher(launcher, tmp_path):
    launcher, _ = launcher
    script = write(tmp_path, "product.py", PRODUCT)
    events = []
    result = run_capture(str(script), launcher=launcher, timeout=60, on_event=events.append,
                         step={"call": 0, "mode": "all"})
    trace = result.trace
    assert trace.error is None, trace.error
    assert trace.script == str(script.resolve())  # the remote temp path is mapped back
    assert "ran remotely" in result.output
    a = torch.tensor([2.0, 3.0], requires_grad=True)
    b = torch.tensor([4.0, -1.0], requires_grad=True)
    ga, gb = torch.autograd.grad((a * b).sum(), (a, b))
    (call,) = trace.calls
    assert call.leaf_grads["a"].data == ga.tolist()
    assert call.leaf_grads["b"].data == gb.tolist()
    assert [n.name for n in call.nodes][:2] == ["SumBackward0", "MulBackward0"]
    steps = [e["record"]["name"] for e in events if e.get("type") == "step"]
    assert steps == ["SumBackward0", "MulBackward0", "AccumulateGrad", "AccumulateGrad"]
    hello = next(e for e in events if e.get("type") == "hello")
    assert hello["protocol"] == wire.PROTOCOL_VERSION == 5 and "zlib" in hello["codecs"]


@pytest.mark.slow
def test_a_spare_worker_that_died_while_waiting_is_replaced(launcher, tmp_path):
    """The worker started ahead of the first run dies while it waits (the connection dropped, the
    out-of-memory killer): the run does not go to it and hang, it gets a fresh worker, with the
    right gradients."""
    launcher, mark = launcher
    script = write(tmp_path, "product.py", PRODUCT)
    done, box = threading.Event(), {}

    def on_event(e):
        if e.get("type") == "finished":
            box["result"] = e["result"]
            done.set()

    client = WorkerClient(on_event, prestart=True, launcher=launcher)
    try:
        deadline = time.monotonic() + 60
        while client.state is not ClientState.READY and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.state is ClientState.READY
        (spare,) = [p for p in marked_processes(mark) if "core.worker" in " ".join(p.cmdline())]
        spare.kill()
        while client._spare.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        client.run(str(script), timeout=60)
        assert done.wait(60), "the run went to the dead worker"
    finally:
        client.close()
    trace = box["result"].trace
    assert trace.error is None, trace.error
    a = torch.tensor([2.0, 3.0], requires_grad=True)
    b = torch.tensor([4.0, -1.0], requires_grad=True)
    ga, gb = torch.autograd.grad((a * b).sum(), (a, b))
    (call,) = trace.calls
    assert call.leaf_grads["a"].data == ga.tolist() and call.leaf_grads["b"].data == gb.tolist()


@pytest.mark.slow
def test_stop_ends_the_remote_process_group(launcher, tmp_path):
    """A script that ignores Stop and started a child: the connection is cut, the host cleans up."""
    launcher, mark = launcher
    script = write(tmp_path, "stubborn.py", (
        "import subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "print('child', child.pid, flush=True)\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(0.05)\n"
        "    except KeyboardInterrupt:\n"
        "        pass\n"))

    def stop(client):
        assert len(marked_processes(mark)) >= 2  # the worker and its `sleep` child
        client.cancel()

    err = run_then(launcher, script, "child", stop)
    assert err.kind == "cancelled" and err.message == "stopped by you at line 6"  # the loop's sleep


@pytest.mark.slow
@pytest.mark.parametrize("silenced", [False, True])
def test_fault_names_the_line(launcher, tmp_path, silenced):
    """A crash's dump comes back with the output and names the signal and the line, also when the
    script pointed its stderr at /dev/null first (as scripts do to quiet a library's logging)."""
    launcher, _ = launcher
    quiet = "import os\nos.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n" if silenced else "x = 0\nx = 1\n"
    script = write(tmp_path, "crash.py", f"import ctypes\n{quiet}ctypes.string_at(0)\n")
    result = run_capture(str(script), launcher=launcher, timeout=60)
    err = result.trace.error
    assert err.kind == "crash", err
    assert "SIGSEGV" in err.message
    assert err.line == 4


@pytest.mark.slow
def test_a_worker_that_exits_without_a_word_names_its_launchers_code(launcher, tmp_path):
    """The code a launcher run ends with is the launcher's (the worker's own where the launcher passes
    it on): the message names the program it came from, not "the worker"."""
    launcher, _ = launcher
    script = write(tmp_path, "quits.py", PRODUCT + "import ctypes\nctypes.CDLL(None)._exit(7)\n")
    result = run_capture(str(script), launcher=launcher, timeout=60)
    err = result.trace.error
    program = os.path.basename(launcher.argv[0])
    assert program in ("sh", "ssh")
    assert (err.type, err.kind) == ("WorkerExited", "exit"), err
    assert err.message == f"the worker on {launcher.name} ended before the run finished: {program} exited with code 7"
    (call,) = result.trace.calls  # streamed before the end
    assert call.leaf_grads["a"].data == [4.0, -1.0] and call.leaf_grads["b"].data == [2.0, 3.0]


LOOP = """import torch
from torch import nn
torch.manual_seed(0)
blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(100))
x = torch.randn(4, 8)
for step in range(6):
    h = x
    for block in blocks:
        h = h + torch.relu(block(h))
    h.pow(2).mean().backward()
"""


def _loop_grad() -> list:
    """blocks.0's weight gradient after LOOP's six calls (each adds the same one), by torch.autograd.grad."""
    scope: dict = {}
    exec(LOOP.split("for step")[0], scope)  # the same seed, blocks and input
    h = scope["x"]
    for block in scope["blocks"]:
        h = h + torch.relu(block(h))
    (g,) = torch.autograd.grad(h.pow(2).mean(), scope["blocks"][0].weight)
    return (6 * g).reshape(-1).tolist()


def through_link(link: Path, args: str, name: str, mark: str) -> launchers.Launcher:
    """A worker whose messages pass the Python program ``link`` (run with ``args``) on their way
    to the app: ``sh -c 'worker | link'``."""
    worker = f"cd {shlex.quote(str(ROOT))} && {shlex.quote(PY)} -m core.worker | " \
             f"{shlex.quote(PY)} {shlex.quote(str(link))} {args}"
    return from_command(f"sh -c {shlex.quote(worker)}", name=name, compress="zlib", env={"BPS_TEST_MARK": mark})


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["", "crash", "spin", "spin behind a launcher", "spin behind a slow link"])
def test_a_loops_repeated_calls_travel_as_summaries(tmp_path, ending):
    """A loop's calls past the first three are kept as summaries, but the last is kept in full:
    it is streamed as its summary (the full call would be dropped as soon as another came), and
    comes in full with the trace at the end. Over a slow link that is four graphs sent instead
    of one per step. A crash after the loop keeps the summary; a run the app ends at its time
    limit gets the last call whole when the app asks for the stacks."""
    crash, spin = ending == "crash", ending.startswith("spin")
    text = LOOP + ("import ctypes\nctypes.string_at(0)\n" if crash else "while True:\n    pass\n" if spin else "")
    mark = uuid.uuid4().hex
    events = []
    launcher = local_launcher(mark) if "launcher" in ending else \
        through_link(ROOT / "bench/slow_link.py", "100000", "slow", mark) if "slow" in ending \
        else None  # the last call, 63 KB in zlib, takes 0.6 s on that link: the app waits for it
    result = run_capture(str(write(tmp_path, "loop.py", text)), timeout=15 if spin else 120, on_event=events.append,
                         launcher=launcher)
    # The end of each frame, and of those the whole graphs (150 KB of columns each; a summary's are 24 KB).
    ends = [e for e in events if e.get("type") == "transfer" and e["decoded"] == e["raw"]]
    whole = ["call_trace"] * 4 if spin else ["call_trace"] * 3 + ([] if crash else ["trace"])
    assert [e["of"] for e in ends if e["raw"] > 100_000] == whole
    assert [e["of"] for e in ends if e["raw"] < 50_000] == ["call_trace"] * 3  # the summaries
    calls = result.trace.calls
    assert [c.snapshot for c in calls] == ["full"] * 3 + ["summary"] * (3 if crash else 2) + ([] if crash else ["full"])
    assert all(c.node_count == 602 and c.same_as == "c0" for c in calls[1:])
    last = calls[5]
    want = _loop_grad()
    assert len(last.leaf_grads) == 200

    def matches(values) -> bool:  # a preview: the first 8 of the 64 values, and their extremes
        return values.sample == pytest.approx(want[:8], rel=1e-5, abs=1e-9) and values.numel == 64 and \
            (values.min, values.max) == pytest.approx((min(want), max(want)), rel=1e-5)

    assert matches(last.leaf_grads["blocks.0.weight"])
    if crash:
        assert (result.trace.error.kind, result.trace.error.line) == ("crash", 12)
    elif spin:  # the stacks came first, and name the line the script was at
        assert (result.trace.error.kind, result.trace.error.line) in (("timeout", 11), ("timeout", 12))
    else:
        assert result.trace.error is None
    if not crash:
        assert len(last.nodes) == 602
        assert matches(next(t for t in last.tensors if t.name == "blocks.0.weight").grad.values)
    assert_no_process(mark)


@pytest.mark.slow
def test_time_limit_names_the_line(launcher, tmp_path):
    launcher, _ = launcher
    script = write(tmp_path, "spin.py", "import time\nn = 0\nwhile True:\n    n += 1\n")
    result = run_capture(str(script), launcher=launcher, timeout=4)
    err = result.trace.error
    assert err.kind == "timeout", err
    assert "time limit of 4 s" in err.message
    assert err.line in (3, 4)


def cut_link(spawn: bool) -> str:
    """A link process that passes the worker's messages on until a captured call's frame has
    begun, then that frame's header, first chunk and 100 bytes more. ``spawn``: it starts the
    worker itself (stdin and stderr are the link's), then carries nothing more while it keeps
    running: a connection gone dead. Otherwise it reads the worker's stdout on its stdin and
    exits: a link that closed its end."""
    head = ("import os, subprocess, sys, time\n"
            "worker = subprocess.Popen([sys.executable, '-m', 'core.worker'], stdout=subprocess.PIPE)\n"
            "src = worker.stdout.fileno()\n") if spawn else "import os\nsrc = 0\n"
    return head + ("buf, sent, end = b'', 0, None\n"
                   "while True:\n"
                   "    d = os.read(src, 65536)\n"
                   "    if not d: break\n"
                   "    buf += d\n"
                   "    at = buf.find(b'\"of\": \"call_trace\"')\n"
                   "    nl = buf.find(b'\\n', at) if at >= 0 else -1\n"
                   "    if nl >= 0 and len(buf) >= nl + 5:\n"
                   "        end = nl + 5 + int.from_bytes(buf[nl + 1:nl + 5], 'big') + 100\n"
                   "    if end is not None and len(buf) >= end:\n"
                   "        os.write(1, buf[sent:end]); break\n"
                   "    if at < 0:\n"
                   "        os.write(1, buf[sent:]); sent = len(buf)\n") + \
        ("os.close(1)\ntime.sleep(300)\n" if spawn else "os._exit(0)\n")


CHAIN = ("import torch\nx = torch.randn(64, requires_grad=True)\ny = x\n"
         "for _ in range(300):\n    y = torch.tanh(y) * 1.01\ny.sum().backward()\nprint('done', flush=True)\n")
CUT_CALL = r"; a captured call was cut off: \d+(\.\d)? (B|KB) of it had arrived \(about \d+%\), and it is lost"


@pytest.mark.slow
def test_a_link_cut_in_the_middle_of_a_trace_says_what_was_lost(tmp_path):
    """The link goes dead while a captured call travels, its command still running: the app ends
    it within seconds instead of at the time limit, and the error says the worker's messages
    stopped, which message was cut off, how much of it had come, and that it is lost; nothing
    is left running."""
    mark = uuid.uuid4().hex
    link = write(tmp_path, "cut_link.py", cut_link(spawn=True))
    launcher = from_command(f"{shlex.quote(PY)} {shlex.quote(str(link))}", name="cut", compress="zlib",
                            env={"BPS_TEST_MARK": mark})
    result = run_capture(str(write(tmp_path, "chain.py", CHAIN)), launcher=launcher, timeout=100)
    err = result.trace.error
    assert result.trace.calls == []  # the one call was in the frame cut off
    assert (err.type, err.kind) == ("ConnectionLost", "disconnected"), err
    assert re.fullmatch(rf"the worker's messages from cut stopped before the run finished, while "
                        rf"{re.escape(os.path.basename(PY))} still ran \(the link dropped, or the script closed the "
                        rf"worker's pipe\); the app ended it{CUT_CALL}", err.message), err
    assert result.elapsed < 60  # not the time limit of 100 s
    assert_no_process(mark)


@pytest.mark.slow
def test_a_link_that_closes_its_end_midway_ends_the_run_and_says_so(tmp_path):
    """The link on the way exits in the middle of a captured call: the worker's next message finds
    its pipe's far end closed, so the worker ends the run and says which end closed (not that the
    script closed it); the app names the call cut off; nothing is left running."""
    mark = uuid.uuid4().hex
    launcher = through_link(write(tmp_path, "cut_link.py", cut_link(spawn=False)), "", "cut", mark)
    result = run_capture(str(write(tmp_path, "chain.py", CHAIN)), launcher=launcher, timeout=100)
    err = result.trace.error
    assert result.trace.calls == []
    assert (err.type, err.kind) == ("ConnectionLost", "disconnected"), err
    assert re.fullmatch(r"the link from cut closed its end of the worker's pipe before the run finished, so nothing "
                        rf"more could come back: the worker ended the run{CUT_CALL}", err.message), err
    assert result.elapsed < 60
    assert_no_process(mark)


@pytest.mark.slow
def test_a_script_that_closes_the_workers_pipe_ends_its_run(launcher, tmp_path):
    """The script closes the worker's pipe and runs on: behind a launcher nothing more could come
    back (there is no fallback file there), so the worker ends the run at its next message, with
    a line on stderr the app reads: within seconds, not at the time limit, keeping the call
    streamed before; nothing is left running, over ssh too."""
    launcher, mark = launcher
    script = write(tmp_path, "closer.py", (
        "import os, time, torch\nx = torch.ones(2, requires_grad=True)\n(x * 3).sum().backward()\n"
        "print('closing', flush=True)\nos.closerange(3, 65536)\nos.close(1)\ntime.sleep(120)\n"))
    result = run_capture(str(script), launcher=launcher, timeout=100)
    err = result.trace.error
    assert (err.type, err.kind) == ("PipeClosed", "disconnected"), (err, result.elapsed)
    assert err.message == ("the script closed the worker's pipe to the app, so nothing more could come back from "
                           f"{launcher.name}: the worker ended the run")
    assert result.elapsed < 60  # not the time limit of 100 s
    (call,) = result.trace.calls
    assert call.leaf_grads["x"].data == [3.0, 3.0]  # d(sum(3x))/dx, streamed before the pipe closed


def run_then(launcher, script: Path, word: str, act, timeout: float = 90, **run_args):
    """Run ``script`` behind ``launcher``, call ``act(client)`` once it printed ``word``, and
    wait for the run to end: its error."""
    box, done = {}, threading.Event()

    def on_event(e):
        if e.get("type") == "output" and word in e.get("text", ""):
            box["said"] = True
        if e.get("type") == "finished":
            box["result"] = e["result"]
            done.set()

    client = WorkerClient(on_event, prestart=False, launcher=launcher)
    try:
        client.run(str(script), timeout=timeout, **run_args)
        deadline = time.monotonic() + 60
        while "said" not in box and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "said" in box, "the script never started"
        act(client)
        assert done.wait(30)
    finally:
        client.close()
    return box["result"].trace.error


def end_mid_run(sshd, tmp_path, end) -> tuple:
    """A script waiting on the ssh host, and ``end(worker)`` called once it runs: (error, mark)."""
    mark = uuid.uuid4().hex
    script = write(tmp_path, "slow.py", "import time\nprint('waiting', flush=True)\ntime.sleep(120)\n")

    def act(client):
        (worker,) = [p for p in marked_processes(mark) if "core.worker" in " ".join(p.cmdline())]
        end(worker)

    return run_then(ssh_launcher(sshd, mark), script, "waiting", act), mark


def test_a_dropped_ssh_connection_is_named_as_such(sshd, tmp_path):
    """sshd's side of the session is killed mid-run: ssh says so (code 255), and the error is the
    connection's, with ssh's own words, not "the worker exited"; the worker there is ended."""
    def drop(worker):  # the host's end of the connection goes away
        next(p for p in worker.parents() if p.name().startswith("sshd") and "-D" not in p.cmdline()).kill()

    err, mark = end_mid_run(sshd, tmp_path, drop)
    assert (err.type, err.kind) == ("ConnectionLost", "disconnected"), err
    assert err.message == ("the connection to localhost closed before the run finished (ssh exited with code 255: "
                           "Connection to 127.0.0.1 closed by remote host.); the worker there is ended with it")
    assert_no_process(mark)


def test_a_remote_worker_killed_without_a_word_is_named_a_crash(sshd, tmp_path):
    """The remote worker is SIGKILLed (as the out-of-memory killer does): ssh reports 255 and
    says nothing; the error is a crash that names the likely cause, not "the worker exited"."""
    err, mark = end_mid_run(sshd, tmp_path, lambda worker: worker.kill())
    assert (err.type, err.kind) == ("WorkerDied", "crash"), err
    assert err.message == ("the worker on localhost ended without a word: ssh exited with code 255, as it does when "
                           "the remote process is killed by a signal (the out-of-memory killer's SIGKILL, for one)")
    assert_no_process(mark)


def installed_copy(target: Path) -> Path | None:
    """The package installed with pip into ``target`` (no dependencies), or None where pip cannot build it."""
    try:
        import setuptools  # noqa: F401  (the build backend, used without network)
    except ImportError:
        return None
    src = target.parent / "src"  # built from a copy: pip leaves build/ and egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("app", "core", "widgets", "resources"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                           str(target), str(src)], capture_output=True, timeout=300)
    return target if done.returncode == 0 and (target / "core" / "worker" / "main.py").is_file() else None


@pytest.mark.slow
def test_worker_runs_with_only_torch_and_the_standard_library(tmp_path):
    """From an installed copy of the package, outside the source tree, with numpy, psutil and Qt
    blocked: trace, step and memory samples still work, and the trace comes back compressed."""
    mark = uuid.uuid4().hex
    bare = Path(__file__).resolve().parents[2] / "bare_worker.py"
    # Installed into a folder named like the real one: the script still imports its neighbours there.
    site = installed_copy(tmp_path / "site-packages") or ROOT
    if site != ROOT:
        (site / "neighbour_pkg.py").write_text("VALUE = 1.0\n")
    launcher = from_command(f"sh -c 'cd {shlex.quote(str(tmp_path))} && exec {shlex.quote(PY)} "
                            f"{shlex.quote(str(bare))}'", name="bare",
                            env={"BPS_TEST_MARK": mark, "PYTHONPATH": str(site)})
    # 800 multiplications: the captured call is over 64 KiB, so it travels compressed.
    neighbour = "from neighbour_pkg import VALUE\n" if site != ROOT else "VALUE = 1.0\n"
    script = write(tmp_path, "chain.py", neighbour + PRODUCT.replace(
        "c = (a * b).sum()", "c = a * b\nfor _ in range(800):\n    c = c * VALUE\nc = c.sum()"))
    events = []
    result = run_capture(str(script), launcher=launcher, timeout=60, on_event=events.append,
                         step={"call": 0, "mode": "all"})
    assert result.trace.error is None, (result.trace.error, result.output)
    assert "Failed to initialize NumPy" in result.output  # numpy really was missing
    if site != ROOT:
        assert f"{site}/core/worker/main.py" in result.output  # the installed copy ran, not the source tree
    assert result.trace.calls[0].leaf_grads["a"].data == [4.0, -1.0]
    assert len([e for e in events if e.get("type") == "step"]) == 804  # sum, 801 mul, 2 leaves
    assert result.trace.memory and all(s.rss > 0 for s in result.trace.memory)
    (transfer,) = [e for e in events if e.get("type") == "transfer" and e["of"] == "call_trace"]
    assert transfer["codec"] == "zlib"
    assert transfer["received"] * 5 < transfer["decoded"] == transfer["raw"]  # compressed on the way
    assert_no_process(mark)


def test_protocol_version_mismatch_is_refused(tmp_path):
    fake = ('{"type": "hello", "protocol": 999, "torch": "9.9", "python": "3.99", "devices": []}')
    launcher = from_command(f"sh -c {shlex.quote(f'echo {shlex.quote(fake)}; exec cat >/dev/null')}", name="old-box")
    script = write(tmp_path, "product.py", PRODUCT)
    events = []
    result = run_capture(str(script), launcher=launcher, timeout=20, on_event=events.append)
    err = result.trace.error
    assert err.type == "ProtocolMismatch"
    assert "the worker on old-box speaks protocol version 999, this app speaks version 5" in err.message
    assert any(e.get("type") == "refused" for e in events)


@pytest.mark.slow
def test_checking_a_host_reports_what_its_worker_says(launcher):
    from core.client.handle import check_worker

    launcher, mark = launcher
    hello = check_worker(launcher, timeout=60)
    assert hello.protocol == wire.PROTOCOL_VERSION and hello.torch == torch.__version__
    assert hello.python == sys.version.split()[0] and hello.host == socket.gethostname()
    assert {"id": "cpu", "name": "CPU", "kind": "cpu"} in [{k: d.get(k) for k in ("id", "name", "kind")}
                                                          for d in hello.devices]
    assert "zlib" in hello.codecs
    assert_no_process(mark)


def test_an_ssh_uri_reaches_a_host_off_port_22(sshd):
    """``ssh://host:PORT`` as the destination: the port travels in it, not in the ssh options."""
    from core.client.handle import check_worker

    args = shlex.split(sshd)
    at = args.index("-p")
    port, options = args[at + 1], shlex.join(args[:at] + args[at + 2:])
    mark = uuid.uuid4().hex
    python = f"cd {shlex.quote(str(ROOT))} && BPS_TEST_MARK={mark} {shlex.quote(PY)}"
    uri = from_host({"name": "uri", "kind": "ssh", "dest": f"ssh://127.0.0.1:{port}", "python": python,
                     "ssh_options": options})
    assert "-p" not in uri.argv and uri.argv[-2] == f"ssh://127.0.0.1:{port}"
    hello = check_worker(uri, timeout=60)
    assert hello.protocol == wire.PROTOCOL_VERSION and hello.host == socket.gethostname()
    assert_no_process(mark)


@pytest.mark.slow
def test_checking_a_host_that_does_not_come_up_says_why():
    from core.client.handle import CheckFailed, check_worker

    mark = uuid.uuid4().hex
    gone = from_command("sh -c 'echo ssh: connect to host gone port 22: No route to host >&2; exit 255'",
                        name="gone")
    with pytest.raises(CheckFailed, match="the worker on gone did not start: .*code 255: "
                                          "ssh: connect to host gone port 22: No route to host"):
        check_worker(gone, timeout=60)
    fake = '{"type": "hello", "protocol": 999, "torch": "9.9", "python": "3.99", "devices": []}'
    old = from_command(f"sh -c {shlex.quote(f'echo {shlex.quote(fake)}; exec cat >/dev/null')}", name="old-box")
    with pytest.raises(CheckFailed, match="the worker on old-box speaks protocol version 999, this app speaks "
                                          f"version {wire.PROTOCOL_VERSION}"):
        check_worker(old, timeout=60)
    silent = from_command("sh -c 'exec sleep 60'", name="silent", env={"BPS_TEST_MARK": mark})
    started = time.monotonic()
    with pytest.raises(CheckFailed, match="no answer from the worker within 1 s"):
        check_worker(silent, timeout=1)
    assert time.monotonic() - started < 15
    assert_no_process(mark)  # the silent command is ended, not left sleeping


@pytest.mark.slow
def test_script_folder_and_remote_cwd_travel(tmp_path):
    mark = uuid.uuid4().hex
    (tmp_path / "helper.py").write_text("SCALE = 3.0\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.txt").write_text("5.0")
    script = write(tmp_path, "uses_folder.py", (
        "import torch\nfrom helper import SCALE\n"
        "x = torch.tensor(float(open('x.txt').read()), requires_grad=True)\n"
        "y = SCALE * x * x\ny.backward()\n"))
    launcher = launchers.replace_options(local_launcher(mark), send_folder=True, remote_cwd=str(data),
                                         compress="none")
    events = []
    result = run_capture(str(script), launcher=launcher, timeout=60, on_event=events.append)
    assert result.trace.error is None, result.trace.error
    assert result.trace.calls[0].leaf_grads["x"].data == [30.0]
    # Uncompressed, as asked, and still in columns: the trace arrives read, in raw frames.
    assert {e["codec"] for e in events if e.get("type") == "transfer"} == {"raw"}
    missing = launchers.replace_options(launcher, remote_cwd=str(tmp_path / "nowhere"))
    err = run_capture(str(script), launcher=missing, timeout=60).trace.error
    assert err is not None and "nowhere: no such folder" in err.message
    assert_no_process(mark)


@pytest.mark.slow
def test_ddp_two_ranks_on_gloo(tmp_path):
    from tests.core.client.test_ranks import DDP_SCRIPT, local_grads

    script = write(tmp_path, "ddp_linear.py", DDP_SCRIPT)
    events = []
    result = run_capture(str(script), timeout=120, ddp={"nproc": 2, "rank": 1}, on_event=events.append)
    trace = result.trace
    assert trace.error is None, (trace.error, result.output[-2000:])
    (call,) = trace.calls
    (other,) = [e for e in events if e.get("type") == "rank_trace"]
    assert other.rank == 0 and isinstance(other.trace, Trace)  # sent in columns, read on arrival
    assert other.trace.calls[0].options["all_reduce"]["rank"] == 0
    assert other.trace.calls[0].leaf_grads == call.leaf_grads  # equal on every rank after the all-reduce
    ar = call.options["all_reduce"]
    assert ar["rank"] == 1 and ar["world_size"] == 2 and ar["backend"] == "gloo"
    assert sorted(ar["ranks"]) == ["0", "1"]  # both ranks captured
    local = local_grads()  # each rank's local gradient computed here
    for name in ("module.weight", "module.bias"):
        for r in ("0", "1"):
            got_local = torch.tensor(ar["ranks"][r][name]["local"]["data"])
            assert torch.allclose(got_local, local[int(r)][name], atol=1e-6)
        reduced0 = ar["ranks"]["0"][name]["reduced"]["data"]
        reduced1 = ar["ranks"]["1"][name]["reduced"]["data"]
        assert reduced0 == reduced1  # equal on every rank after the all-reduce
        mean = (local[0][name] + local[1][name]) / 2
        assert torch.allclose(torch.tensor(reduced1), mean, atol=1e-6)
        assert call.leaf_grads[name].data == reduced1
    # The all-reduce is marked on the AccumulateGrad nodes of both parameters.
    marked = {n.id for n in call.nodes if n.kind == "accumulate_grad"}
    assert set(ar["nodes"]) == marked and len(marked) == 2


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stop", "time limit"])
def test_ending_a_ddp_run_ends_torchrun_and_every_rank(launcher, tmp_path, how):
    """torchrun starts each rank in a session of its own, so no signal to a process group
    reaches them. Stop ends the worker's wait for torchrun at once and ends torchrun; a worker
    killed outright (what the time limit does after the stacks) takes torchrun with it; either
    way the ranks end with torchrun (``core.worker.ddp.die_with_parent``). Before, Stop waited in
    ``waitpid`` until the app killed the worker, and both left torchrun and its ranks running."""
    from tests.core.client.test_ranks import DDP_SCRIPT

    launcher, mark = launcher
    script = write(tmp_path, "ddp_loop.py", DDP_SCRIPT.replace(
        "dist.destroy_process_group()\n",
        "dist.barrier()\nif rank == 0:\n    print('both ranks looping', flush=True)\n"
        "import time\nwhile True:\n    time.sleep(0.05)\n"))
    started = []

    def end(client):
        started.extend(p for p in marked_processes(mark) if "ddp_rank" in " ".join(p.cmdline()))
        torchrun = [p for p in started if "torch.distributed.run" in " ".join(p.cmdline())]
        assert len(torchrun) == 1 and len(started) == 3  # torchrun and its 2 ranks
        if how == "stop":
            client.cancel()
        else:
            client._timed_out(client._run["id"], 120)

    err = run_then(launcher, script, "both ranks looping", end, timeout=120, ddp={"nproc": 2, "rank": 0})
    if how == "stop":  # the worker stopped the run itself, not the app's kill after the grace
        assert (err.type, err.kind, err.message) == ("KeyboardInterrupt", "cancelled", "stopped by you")
    else:
        assert err.kind == "timeout" and err.message.startswith("the run passed its time limit of 120 s")
    gone, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def test_host_records_and_bad_input():
    host = {"name": "gpu-box", "kind": "ssh", "dest": "me@gpu-box", "python": "/opt/venv/bin/python"}
    l = from_host(host)
    assert l.argv[-2] == "me@gpu-box" and l.send_code  # a bare interpreter: the app sends the worker's code
    assert shlex.split(l.argv[-1]) == ["/opt/venv/bin/python", "-c", bootstrap.BOOTSTRAP]
    assert "BatchMode=yes" in l.argv and "ConnectTimeout=20" in l.argv
    assert resolve("gpu-box", [host]).argv == l.argv
    direct = resolve("alice@10.0.0.7")
    assert direct.name == "alice@10.0.0.7" and direct.argv[-2] == "alice@10.0.0.7"
    for uri in ("ssh://alice@gpu-box:2222", "ssh://gpu-box", "ssh://bob@[fe80::1]:22"):
        assert resolve(uri).argv[-3:-1] == ("--", uri)  # a host off port 22, as ssh(1) takes it
    for bad in ("ssh://alice@gpu-box:port", "ssh://alice@gpu box", "sftp://gpu-box"):
        with pytest.raises(LauncherError, match=r"not an ssh destination \(user@host, ssh://user@host:port or"):
            resolve(bad)
    docker = from_command("docker exec -i box python -m core.worker")
    assert docker.argv[:3] == ("docker", "exec", "-i") and docker.name == "docker"
    with pytest.raises(LauncherError, match="'compress' must be one of"):
        from_host({"name": "x", "compress": "lz4"})
    with pytest.raises(LauncherError, match="host 'k8s': 'command' is empty"):
        from_host({"name": "k8s", "kind": "command", "command": ""})
    with pytest.raises(LauncherError, match="No closing quotation"):
        from_command("ssh 'box")
    with pytest.raises(LauncherError, match="not an ssh destination"):
        resolve("not a host; rm -rf /")


def test_frames_stream_in_chunks_and_report_progress():
    import json as _json

    msg = {"type": "trace", "trace": {"calls": [{"id": f"c{i}", "nodes": list(range(200))} for i in range(3000)]}}
    raw = _json.dumps(msg, separators=(",", ":")).encode()
    for codec in wire.available_codecs():
        header = (_json.dumps(wire.frame_header("trace", len(raw), codec)) + "\n").encode()
        body = b"".join(wire.frame_chunks(raw, codec))
        assert len(body) < len(raw) / 5
        stream = b'{"type":"call","index":0}\n' + header + body + b'{"type":"bye"}\n'
        lines, seen = [], []
        decoder = wire.StreamDecoder(lines.append, lambda h, got, dec: seen.append((h["of"], got, dec)))
        for at in range(0, len(stream), 7777):  # arbitrary cuts, as a pipe delivers them
            decoder.feed(stream[at:at + 7777])
        assert lines == [b'{"type":"call","index":0}', raw, b'{"type":"bye"}']
        assert len(seen) >= 2 and seen[-1] == ("trace", len(body), len(raw))  # progress to the end
        assert decoder.cut_off() == ""  # it ended between messages
        last = []
        cut = wire.StreamDecoder(lines.append, lambda h, got, dec: last.append((got, dec)))
        cut.feed(header + body[:-6])  # the last chunk and the end mark missing
        assert cut.partial  # a connection closed mid-frame is noticed, and said in words
        got, dec = last[-1] if last else (0, 0)
        share = f" (about {100 * dec // len(raw)}%)" if dec else ""  # none decoded: no share to tell
        assert dec < len(raw) and got > 0
        assert cut.cut_off() == f"the trace was cut off: {format_bytes(got)} of it had arrived{share}, and it is lost"
    with pytest.raises(wire.ProtocolMismatch, match="unknown codec 'lz4'"):
        wire.StreamDecoder(print).feed(b'{"type": "frame", "codec": "lz4", "raw": 1}\n')


@pytest.mark.slow
def test_ddp_model_file_with_weights(tmp_path):
    """``--weights`` reaches every rank: the reduced grads are those of the file's weights."""
    from safetensors.torch import save_file

    script = write(tmp_path, "ddp_model.py", (
        "import torch, torch.distributed as dist, torch.nn as nn\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo')\ntorch.manual_seed(0)\n"
        "model = DDP(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)))\n"
        "example_input = torch.ones(4, 3) * (1 + dist.get_rank())\n"))
    torch.manual_seed(5)
    ref = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    save_file({f"module.{k}": v for k, v in ref.state_dict().items()}, str(tmp_path / "w.safetensors"))
    result = run_capture(str(script), timeout=120, ddp={"nproc": 2, "rank": 1},
                         load={"weights": str(tmp_path / "w.safetensors")})
    assert result.trace.error is None, (result.trace.error, result.output[-2000:])
    got = {k: torch.tensor(v.data) for k, v in result.trace.calls[0].leaf_grads.items()}
    per_rank = []
    for rank in (0, 1):
        ref.zero_grad()
        ref(torch.ones(4, 3) * (1 + rank)).sum().backward()
        per_rank.append({f"module.{k}": p.grad.flatten().clone() for k, p in ref.named_parameters()})
    assert sorted(got) == ["module.0.bias", "module.0.weight", "module.1.bias", "module.1.weight"]
    for name, grad in got.items():
        assert torch.allclose(grad, (per_rank[0][name] + per_rank[1][name]) / 2, atol=1e-6), name


@pytest.mark.slow
def test_the_wait_for_a_frame_ends_when_its_bytes_stop_coming():
    """Before ending a run the app waits while a frame arrives (a loop's last call on a slow link),
    but not for a frame the worker stopped in the middle of: it waits while bytes keep coming
    (here 1.2 s of them), then ``stall`` s more, well short of the cap."""
    from core.client.process import WorkerProcess

    w = WorkerProcess(lambda msg: None)
    w.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        decoder = wire.StreamDecoder(lambda msg: None)
        decoder.feed((json.dumps(wire.frame_header("call_trace", 10_000_000, "zlib")) + "\n").encode())
        assert decoder.partial
        w._decoder = decoder
        for trickle in (0.0, 1.2):
            def arriving(until=time.monotonic() + trickle):
                while time.monotonic() < until:
                    w.bytes_at = time.monotonic()
                    time.sleep(0.05)

            feeder = threading.Thread(target=arriving)
            feeder.start()
            began = time.monotonic()
            w._let_frames_arrive(start=0.3, cap=30.0, stall=0.5)
            waited = time.monotonic() - began
            feeder.join()
            assert trickle + 0.4 <= waited < trickle + 5.0, (trickle, waited)
            w.feeding = True  # the decoder building what came also counts as arriving
            timer = threading.Timer(1.0, lambda: setattr(w, "feeding", False))
            timer.start()
            began = time.monotonic()
            w._let_frames_arrive(start=0.3, cap=30.0, stall=0.5)
            assert time.monotonic() - began >= 1.0
            timer.join()
    finally:
        w.proc.kill()
        w.proc.wait()
