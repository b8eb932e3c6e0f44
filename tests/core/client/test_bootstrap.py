"""The worker travels: a command that ends in a bare interpreter gets the worker's code down its
stdin, so a host with only Python and torch runs it. Here that host is a fresh venv holding
torch and its own dependencies and nothing else (no PySide6, no NumPy, not the app): it traces,
steps and stops like an installed worker, and leaves no process and no folder behind."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from app.cli.hosts import check_host
from core.client import bootstrap
from core.client.handle import WorkerClient
from core.client.launchers import from_command, from_host
from core.client.process import ROOT
from tests.core.client.test_launchers import assert_no_process, marked_processes, write

pytestmark = pytest.mark.slow

SCRIPT = "import torch\na = torch.tensor([2.0, 3.0], requires_grad=True)\nb = a * a\nb.sum().backward()\n"


# -- which commands get the code -----------------------------------------------------------------
@pytest.mark.parametrize("command", ["/work/venv/bin/python", "python3", "python3.11", "ssh gpu-box python3",
                                     "docker exec -i box python", "/path/to/python3.11",
                                     "kubectl exec -i pod -- python"])
def test_a_bare_interpreter_gets_the_code(command):
    launcher = from_command(command)
    assert launcher.send_code
    assert launcher.argv[:-2] == tuple(shlex.split(command))
    ssh = command.startswith("ssh ")
    assert launcher.argv[-2:] == ("-c", shlex.quote(bootstrap.BOOTSTRAP) if ssh else bootstrap.BOOTSTRAP)
    if ssh:  # the remote shell splits the joined words back into python3, -c and the program
        assert shlex.split(" ".join(launcher.argv[2:])) == ["python3", "-c", bootstrap.BOOTSTRAP]
    assert launcher.describe() == f"{os.path.basename(launcher.argv[0])} ({command}, the worker's code sent)"


@pytest.mark.parametrize("command", ["python -m core.worker", "ssh gpu-box python3 -m core.worker",
                                     "docker exec -i box python -m core.worker", "python worker.py",
                                     "sh -c 'exec python3 -m core.worker'", "sh -c 'exec /usr/bin/python3'",
                                     "pythonista", "ipython"])
def test_a_command_that_names_the_module_is_kept(command):
    launcher = from_command(command)
    assert not launcher.send_code
    assert launcher.argv == tuple(shlex.split(command))


def test_a_saved_ssh_host_sends_the_code_for_its_python():
    sent = from_host({"name": "gpu", "kind": "ssh", "dest": "me@gpu", "python": "/opt/venv/bin/python3"})
    assert sent.send_code
    assert sent.argv[-2:] == ("me@gpu", f"/opt/venv/bin/python3 -c {shlex.quote(bootstrap.BOOTSTRAP)}")
    assert shlex.split(sent.argv[-1]) == ["/opt/venv/bin/python3", "-c", bootstrap.BOOTSTRAP]
    kept = from_host({"name": "gpu", "kind": "ssh", "dest": "me@gpu", "python": "python3 -X dev"})
    assert not kept.send_code and kept.argv[-1] == "python3 -X dev -m core.worker"
    command = from_host({"name": "box", "kind": "command", "command": "docker exec -i box python"})
    assert command.send_code and command.argv[-1] == bootstrap.BOOTSTRAP


def test_the_program_survives_any_shell_and_stays_short():
    assert len(bootstrap.BOOTSTRAP) < 700
    assert not set(bootstrap.BOOTSTRAP) & set("'!\n")


def test_the_packed_code_holds_the_worker_side_only():
    message = bootstrap.code_message()
    head, code = message.split(b"\n", 1)
    assert int(head) == len(code) == len(bootstrap.worker_code())
    names = zipfile.ZipFile(io.BytesIO(code)).namelist()
    tops = {"/".join(n.split("/")[:2]) if n.startswith("core/") else n for n in names}
    assert tops == {"backprop_studio.py", "core/__init__.py", "core/worker", "core/protocol", "core/model",
                    "core/programs"}
    for name in ("core/worker/main.py", "core/worker/__main__.py", "core/worker/capture/recorder.py",
                 "core/protocol/wire.py", "core/model/trace.py", "core/programs/program.py"):
        assert name in names
    assert not [n for n in names if n.startswith(("core/client", "core/layout", "app/", "widgets/"))]
    assert all(n.endswith(".py") for n in names)
    assert bootstrap.worker_code() == bootstrap.worker_code.__wrapped__(ROOT)  # the same tree packs the same


# -- a host with only Python and torch -------------------------------------------------------------
def _closure(name: str, seen: set[str]) -> None:
    """The installed distributions ``name`` needs, itself included (extras left out)."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return  # a requirement for another platform or Python
    key = dist.metadata["Name"].lower()
    if key in seen:
        return
    seen.add(key)
    for req in dist.requires or []:
        if "extra ==" not in req:
            _closure(re.match(r"[A-Za-z0-9._-]+", req).group(0), seen)


def _top_levels(name: str) -> set[str]:
    """The entries of site-packages a distribution installed (its packages, modules, dist-info)."""
    return {Path(f).parts[0] for f in metadata.distribution(name).files or []
            if not Path(f).parts[0].startswith("..") and Path(f).parts[0] != "__pycache__"}


def bare(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run([str(python), "-c", code], cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="session")
def torch_only(tmp_path_factory) -> Path:
    """A fresh venv whose site-packages holds torch and its dependencies (links to this one's):
    its interpreter."""
    where = tmp_path_factory.mktemp("torch-only")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(bare(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])", where).stdout.strip())
    source = Path(metadata.distribution("torch").locate_file(""))
    needed: set[str] = set()
    _closure("torch", needed)
    for name in needed:
        for top in _top_levels(name):
            if (source / top).exists() and not (site / top).exists():
                (site / top).symlink_to(source / top)
    assert "torch" in needed and "numpy" not in needed and "pyside6" not in needed
    said = bare(python, "import torch; print(torch.__version__)", where)
    assert said.returncode == 0, said.stderr
    for module in ("PySide6", "numpy", "core", "backprop_studio"):
        said = bare(python, f"import {module}", where)
        assert f"No module named '{module}'" in said.stderr, (module, said.stderr)
    return python


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", *args], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=300)


def test_trace_on_a_host_with_only_torch_equals_a_local_one(torch_only, tmp_path):
    script = write(tmp_path, "square.py", SCRIPT)
    runs = {}
    for where, extra in (("bare", ("--worker-command", str(torch_only))), ("local", ())):
        out = tmp_path / f"{where}.json"
        done = cli("trace", str(script), *extra, "--json", str(out))
        assert done.returncode == 0, done.stderr + done.stdout
        runs[where] = json.loads(out.read_text())
    for run in runs.values():
        (call,) = run["calls"]
        assert call["leaf_grads"]["a"]["data"] == [4.0, 6.0]
    names = [[n["name"] for n in run["calls"][0]["nodes"]] for run in (runs["bare"], runs["local"])]
    assert names[0] == names[1] and set(names[0]) == {"SumBackward0", "MulBackward0", "AccumulateGrad"}
    assert runs["bare"]["error"] is None and runs["bare"]["script"] == str(script.resolve())


def test_step_on_a_host_with_only_torch(torch_only, tmp_path):
    script = write(tmp_path, "square.py", SCRIPT)
    out = tmp_path / "steps.json"
    done = cli("step", str(script), "--worker-command", str(torch_only), "--json", str(out))
    assert done.returncode == 0, done.stderr + done.stdout
    steps = json.loads(out.read_text())
    assert steps["state"] == "finished"
    assert [s["name"] for s in steps["steps"]] == ["SumBackward0", "MulBackward0", "AccumulateGrad"]
    assert steps["leaf_grads"]["a"]["data"] == [4.0, 6.0]
    assert steps["steps"][1]["grad_inputs"][0]["data"] == [2.0, 3.0]  # d(a*a)/da from the first input: a


def test_stop_on_a_host_with_only_torch_leaves_nothing(torch_only, tmp_path):
    mark = uuid.uuid4().hex
    temp = tmp_path / "temp"
    temp.mkdir()
    launcher = from_command(str(torch_only), name="bare", env={"BPS_TEST_MARK": mark, "TMPDIR": str(temp)})
    script = write(tmp_path, "forever.py", "import torch\nx = torch.ones(2)\nprint('looping', flush=True)\n"
                                           "while True:\n    x = x + 1\n")
    events, box = [], {}

    def on_event(e):
        events.append(e)
        if e.get("type") == "finished":
            box["result"] = e["result"]

    client = WorkerClient(on_event, prestart=False, launcher=launcher)
    try:
        client.run(str(script), timeout=120)
        deadline = time.monotonic() + 60
        while not any("looping" in e.get("text", "") for e in events if e.get("type") == "output"):
            assert time.monotonic() < deadline, "the script never started"
            time.sleep(0.05)
        assert len(marked_processes(mark)) == 1
        assert any(p.name.startswith("backprop-studio-worker-") for p in temp.iterdir())  # the unpacked code
        stopped = time.monotonic()
        client.cancel()
        while "result" not in box:
            assert time.monotonic() - stopped < 10, "the run did not end after Stop"
            time.sleep(0.05)
    finally:
        client.close()
    err = box["result"].trace.error
    # The interrupt lands on one of the loop's two lines.
    assert err.kind == "cancelled" and err.message in ("stopped by you at line 4", "stopped by you at line 5")
    hello = next(e for e in events if e.get("type") == "hello")
    assert hello["sent_code"] is True
    assert_no_process(mark)
    assert list(temp.iterdir()) == []  # the folder the code was unpacked in went with the worker


def test_hosts_check_says_the_code_was_sent(torch_only):
    ok, lines = check_host(from_command(str(torch_only), name="bare"))
    assert ok, lines
    assert lines[0].startswith("bare: ready in ") and lines[0].endswith(", runs the worker code the app sent")
    assert "  bare: cpu (CPU)" in lines[1:]
    ok, lines = check_host(from_command(f"{sys.executable} -m core.worker", name="installed"))
    assert ok and "sent" not in lines[0]


DDP = ("import torch, torch.distributed as dist, torch.nn as nn\n"
       "from torch.nn.parallel import DistributedDataParallel as DDP\n"
       "dist.init_process_group('gloo')\ntorch.manual_seed(0)\nmodel = DDP(nn.Linear(3, 2))\n"
       "x = torch.ones(4, 3) * (1 + dist.get_rank())\nmodel(x).sum().backward()\ndist.destroy_process_group()\n")


def test_a_ddp_run_on_a_host_with_only_torch(torch_only, tmp_path):
    """torchrun's ranks import the worker from the folder the code was unpacked in."""
    script = write(tmp_path, "ddp.py", DDP)
    out = tmp_path / "ddp.json"
    done = cli("trace", str(script), "--worker-command", str(torch_only), "--nproc", "2", "--rank", "1",
               "--json", str(out))
    assert done.returncode == 0, done.stderr + done.stdout
    run = json.loads(out.read_text())
    assert run["error"] is None
    (call,) = run["calls"]
    # the weight's grad sums the 4 rows of x: 4 on rank 0, 8 on rank 1; DDP averages them to 6
    assert call["leaf_grads"]["module.weight"]["data"] == [6.0] * 6
    params = call["options"]["all_reduce"]["params"]["module.weight"]
    assert params["local"]["data"] == [8.0] * 6 and params["reduced"]["data"] == [6.0] * 6
