"""Saved models travel to a host: a ``.pt2`` program, a safetensors checkpoint with its model
script, a notebook and a Hugging Face folder run behind a local ``sh -c`` launcher (and a real
``ssh localhost`` where sshd starts) with the same leaf grads as a local run, and the host's
temporary folder is empty afterwards."""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import uuid
from pathlib import Path

import pytest
import torch

from core.protocol import uploads
from core.client.handle import run_capture
from core.client.process import ROOT
from core.client.launchers import from_command, from_host
from tests.core.client.test_launchers import assert_no_process, sshd  # noqa: F401  (the sshd fixture)
from tests.core.programs.test_model_files import NET_PY, traced_grads

PY = sys.executable


@pytest.fixture(params=["local", "ssh"])
def host(request, tmp_path):
    """(launcher, the host's temporary folder): the worker's TMPDIR is a folder the test watches."""
    remote_tmp = tmp_path / "host-tmp"
    remote_tmp.mkdir()
    mark = uuid.uuid4().hex
    env = f"env TMPDIR={shlex.quote(str(remote_tmp))} BPS_TEST_MARK={mark}"
    if request.param == "local":
        launcher = from_command(f"sh -c 'cd {shlex.quote(str(ROOT))} && exec {env} {shlex.quote(PY)} -m core.worker'",
                                name="local")
    else:
        options = request.getfixturevalue("sshd")
        launcher = from_host({"name": "localhost", "kind": "ssh", "dest": "127.0.0.1", "ssh_options": options,
                              "python": f"env -C {shlex.quote(str(ROOT))} {env} {shlex.quote(PY)}"})
    yield launcher, remote_tmp
    assert_no_process(mark)


def assert_empty(folder: Path) -> None:
    # torch keeps its own compile cache there (torchinductor_USER), as it does for any program.
    left = sorted(p.name for p in folder.iterdir() if not p.name.startswith("torchinductor_"))
    assert left == [], "files left on the host"


@pytest.mark.slow
def test_export_program_travels(host, tmp_path):
    launcher, remote_tmp = host
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(5, 4),)), str(path))
    remote = run_capture(str(path), launcher=launcher, timeout=120)
    # The same forward, sum and backward run here on the inputs the program's specs give.
    from core.programs.model_files import example_inputs

    model(example_inputs([([5, 4], "float32")])).sum().backward()
    assert traced_grads(remote.trace) == {name: p.grad.flatten().tolist() for name, p in model.named_parameters()}
    assert sorted(traced_grads(remote.trace)) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert remote.trace.script == str(path.resolve())
    assert f"open_export({str(path.resolve())!r})" in remote.trace.source  # the host's path mapped back
    assert_empty(remote_tmp)


@pytest.mark.slow
def test_safetensors_weights_travel_with_their_script(host, tmp_path):
    from safetensors.torch import save_file

    launcher, remote_tmp = host
    script = tmp_path / "net.py"
    script.write_text(NET_PY, encoding="utf-8")
    ns: dict = {}
    exec(compile(NET_PY, str(script), "exec"), ns)
    torch.manual_seed(11)
    trained = ns["Net"]()  # other weights than the script's own
    weights = tmp_path / "net.safetensors"
    save_file(trained.state_dict(), str(weights))
    load = {"weights": str(weights)}
    remote = run_capture(str(script), launcher=launcher, timeout=120, load=load)
    trained(ns["example_input"]).sum().backward()  # the run, here, with the trained weights
    assert traced_grads(remote.trace) == {name: p.grad.flatten().tolist() for name, p in trained.named_parameters()}
    # Weights of another model: the error names the app's file, not the host's copy.
    other = tmp_path / "other.safetensors"
    save_file({"fc1.weight": torch.zeros(3, 4)}, str(other))
    err = run_capture(str(script), launcher=launcher, timeout=120, load={"weights": str(other)}).trace.error
    assert "other.safetensors does not match the model's parameters" in err.message
    assert str(remote_tmp) not in err.message + err.traceback
    assert_empty(remote_tmp)


@pytest.mark.slow
def test_notebook_and_model_folder_travel(tmp_path):
    remote_tmp = tmp_path / "host-tmp"
    remote_tmp.mkdir()
    launcher = from_command(f"sh -c 'cd {shlex.quote(str(ROOT))} && exec env TMPDIR={shlex.quote(str(remote_tmp))} "
                            f"{shlex.quote(PY)} -m core.worker'", name="local")
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": src}
             for src in ("import torch\nx = torch.tensor([3.0], requires_grad=True)\n", "y = x ** 3\ny.backward()\n")]
    nb = tmp_path / "cube.ipynb"
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    trace = run_capture(str(nb), launcher=launcher, timeout=120).trace
    assert traced_grads(trace) == {"x": [27.0]} and trace.script == str(nb.resolve())
    assert_empty(remote_tmp)
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, vocab_size=40, max_position_embeddings=16)
    folder = tmp_path / "tiny-bert"
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(str(folder))
    remote = run_capture(str(folder), launcher=launcher, timeout=300).trace  # every file of the folder sent
    assert remote.error is None, remote.error
    assert {"pooler.dense.bias", "embeddings.word_embeddings.weight"} <= set(remote.calls[0].leaf_grads)
    assert_empty(remote_tmp)


def test_pieces_are_compressed_when_it_pays_and_commands_pass_between_them(tmp_path):
    """The file protocol in process: a compressible config and an incompressible weights file of
    3 MiB, a Stop sent between two pieces, progress per MiB, and the bytes as they were."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden": [0] * 100_000}))
    weights = tmp_path / "w.bin"
    weights.write_bytes(os.urandom(3 * 2**20 + 5))
    files = [(config, "m/config.json"), (weights, "m/w.bin")]
    stream, events = [], []

    def write(data: bytes) -> None:
        stream.append(data)
        if data.startswith(b'{"cmd": "file_chunk", "bytes": ') and b'"cancel"' not in b"".join(stream):
            stream.append(b'{"cmd": "cancel"}\n')  # what a Stop pressed meanwhile looks like

    assert uploads.send_files(write, files, "zlib", events.append)
    raw = b"".join(stream)
    assert len(raw) < config.stat().st_size // 20 + weights.stat().st_size + 2048  # config shrank, weights raw
    read, write_fd = os.pipe()
    threading.Thread(target=lambda: (os.write(write_fd, raw), os.close(write_fd)), daemon=True).start()
    reader, inbox, other = uploads.CommandReader(read), uploads.Inbox(), []
    for line in reader:
        cmd = json.loads(line)
        if cmd["cmd"].startswith("file"):
            inbox.receive(cmd, reader.read_exact(cmd.get("bytes") or 0) if cmd["cmd"] == "file_chunk" else b"")
        else:
            other.append(cmd["cmd"])
    os.close(read)
    assert other == ["cancel"]
    folder, error = inbox.take()
    try:
        assert error == ""
        assert (Path(folder) / "m" / "config.json").read_bytes() == config.read_bytes()
        assert (Path(folder) / "m" / "w.bin").read_bytes() == weights.read_bytes()
    finally:
        uploads.remove_folder(folder)
    total = config.stat().st_size + weights.stat().st_size
    assert [e["sent"] for e in events] == sorted(e["sent"] for e in events) and events[-1]["sent"] == total
    assert len(events) >= 3 and all(e["of"] == "upload" and e["raw"] == total for e in events)
    # A name that would leave the inbox is refused, and the run says so.
    bad = uploads.Inbox()
    bad.receive({"cmd": "file", "name": "../escape.py", "size": 1})
    assert "not a plain relative file name" in bad.take()[1]
    short = uploads.Inbox()
    short.receive({"cmd": "file", "name": "w.bin", "size": 10})
    short.receive({"cmd": "file_chunk", "bytes": 4, "codec": None}, b"abcd")
    short.receive({"cmd": "file_chunk", "bytes": 0, "end": True})
    folder, error = short.take()
    uploads.remove_folder(folder)
    assert error == "w.bin: 6 bytes short of its size"


THROTTLE = ("import sys, time\n"
            "while True:\n"
            "    b = sys.stdin.buffer.read1(32768)\n"
            "    if not b:\n"
            "        break\n"
            "    sys.stdout.buffer.write(b)\n"
            "    sys.stdout.buffer.flush()\n"
            "    time.sleep(0.02)\n")


@pytest.mark.slow
def test_stop_during_an_upload_leaves_nothing_on_the_host(tmp_path):
    """A slow link (about 1.5 MB/s): Stop while the weights are on their way ends the run, and the
    half-received file, the worker and the link are gone."""
    from safetensors.torch import save_file

    from core.client.handle import WorkerClient

    remote_tmp = tmp_path / "host-tmp"
    remote_tmp.mkdir()
    throttle = tmp_path / "throttle.py"
    throttle.write_text(THROTTLE)
    mark = uuid.uuid4().hex
    launcher = from_command(
        f"sh -c 'cd {shlex.quote(str(ROOT))} && {shlex.quote(PY)} {shlex.quote(str(throttle))} | "
        f"env TMPDIR={shlex.quote(str(remote_tmp))} {shlex.quote(PY)} -m core.worker'",
        name="slow", env={"BPS_TEST_MARK": mark})
    script = tmp_path / "net.py"
    script.write_text(NET_PY, encoding="utf-8")
    weights = tmp_path / "big.safetensors"
    save_file({"w": torch.randn(2048, 1024)}, str(weights))  # 8 MB: several seconds on this link
    box, done = {}, threading.Event()

    def on_event(e):
        if e.get("type") == "transfer" and e.get("of") == "upload":
            box.setdefault("progress", e)
        if e.get("type") == "finished":
            box["result"] = e["result"]
            done.set()

    client = WorkerClient(on_event, prestart=False, launcher=launcher)
    try:
        client.run(str(script), timeout=60, load={"weights": str(weights)})
        deadline = threading.Event()
        for _ in range(600):
            if "progress" in box:
                break
            deadline.wait(0.05)
        assert "progress" in box, "no upload progress"
        assert box["progress"]["sent"] < box["progress"]["raw"]  # stopped in the middle
        assert any(p.name.startswith("backprop-studio-") for p in remote_tmp.iterdir())  # the file was arriving
        client.cancel()
        assert done.wait(30)
    finally:
        client.close()
    assert box["result"].trace.error is not None
    assert_no_process(mark)
    assert_empty(remote_tmp)
