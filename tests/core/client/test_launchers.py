"""Workers behind a command: a local ``sh -c 'exec python -m core.worker'`` and a real ``ssh``
to an sshd started here with a throwaway key (skipped where sshd cannot run). Each launcher
traces, steps, stops, reports a crash and a time-out, and leaves no process behind."""

from __future__ import annotations

import os
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
from core.client.launchers import LauncherError, from_command, from_host, resolve

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
    # The remote command is what a host's "python" field holds, words the remote shell gets
    # quoted: here the venv's interpreter, run in the source tree by env -C (an installed
    # package needs no folder). The mark travels in the env.
    python = f"env -C {shlex.quote(str(ROOT))} BPS_TEST_MARK={mark} {shlex.quote(PY)}"
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


@pytest.mark.slow
def test_time_limit_names_the_line(launcher, tmp_path):
    launcher, _ = launcher
    script = write(tmp_path, "spin.py", "import time\nn = 0\nwhile True:\n    n += 1\n")
    result = run_capture(str(script), launcher=launcher, timeout=4)
    err = result.trace.error
    assert err.kind == "timeout", err
    assert "time limit of 4 s" in err.message
    assert err.line in (3, 4)


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
    python = f"env -C {shlex.quote(str(ROOT))} BPS_TEST_MARK={mark} {shlex.quote(PY)}"
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


