"""Saved hosts in the window: their devices in the picker under the host's name, a run on a
host device goes through that host's worker, and a host that cannot start says why."""

import shlex
import sys

import pytest

from app.cli.hosts import load_hosts, save_hosts
from core.client.process import ROOT

PY = sys.executable
EXAMPLES = ROOT / "resources" / "examples"

MB = 2**20  # the app's byte unit (core.model.memory.format_bytes)


@pytest.fixture
def hosts_window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    worker = f"sh -c 'cd {shlex.quote(str(ROOT))} && exec {shlex.quote(PY)} -m core.worker'"
    save_hosts([{"name": "lab", "kind": "command", "command": worker},
                {"name": "gone", "kind": "command", "command": "sh -c 'echo no route to gone >&2; exit 255'"}])
    assert [h["name"] for h in load_hosts()] == ["lab", "gone"]
    from app.window.window import MainWindow

    w = MainWindow(timeout=60)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    yield w
    w.handle.close()


def _items(box):
    return [(box.itemText(i), box.itemData(i)) for i in range(box.count())]


@pytest.mark.slow
def test_host_devices_listed_and_used(qtbot, hosts_window, tmp_path):
    w = hosts_window
    box = w.device_box
    qtbot.waitUntil(lambda: ("lab: cpu (CPU)", "lab::cpu") in _items(box), timeout=60_000)
    qtbot.waitUntil(lambda: any(t == "gone: unavailable" for t, _ in _items(box)), timeout=30_000)
    gone = next(i for i in range(box.count()) if box.itemText(i) == "gone: unavailable")
    assert not box.model().item(gone).isEnabled()
    assert "the worker on gone did not start" in box.itemData(gone, 3)  # the tooltip says why
    assert "no route to gone" in box.itemData(gone, 3)
    assert box.itemData(0) == "cpu"  # the local devices stay first
    w.grab().save(str(tmp_path / "hosts.png"))
    box.setCurrentIndex(box.findData("lab::cpu"))
    with qtbot.waitSignal(w.sig_trace_shown, timeout=60_000):
        w.open_script(str(EXAMPLES / "01_multiply.py"))
    assert w.trace.error is None
    assert w.trace.script == str((EXAMPLES / "01_multiply.py").resolve())
    assert w.handle.client is w.handle.hosts.client_for("lab")  # the run went through the host
    assert w.call is not None and w.call.api == "Tensor.backward"
    assert w.state_label.text().endswith(" s on lab: cpu")


@pytest.mark.slow
def test_a_host_still_connecting_is_listed_as_such_and_left_running_nowhere(qtbot, tmp_path, monkeypatch):
    import psutil

    monkeypatch.setenv("BACKPROP_STUDIO_SETTINGS", str(tmp_path / "settings.ini"))
    save_hosts([{"name": "slow", "kind": "command", "command": "sh -c 'exec sleep 613.37'"}])
    from app.window.window import MainWindow

    w = MainWindow(timeout=60)
    qtbot.addWidget(w)
    box = w.device_box
    slow = box.findText("slow: connecting…")
    assert slow > 0 and box.itemData(slow) == "slow::" and not box.model().item(slow).isEnabled()
    assert box.itemData(slow, 3) == "Starting a worker: slow (sh -c 'exec sleep 613.37')"
    assert box.itemData(0) == "cpu" and box.currentData() == "cpu"  # the local CPU stays picked

    def sleeping():
        return [p for p in psutil.process_iter(["cmdline"]) if "613.37" in (p.info["cmdline"] or [])]

    qtbot.waitUntil(lambda: bool(sleeping()), timeout=10_000)
    w.handle.close()
    qtbot.waitUntil(lambda: not sleeping(), timeout=10_000)  # closing the window ends the host's command


@pytest.mark.slow
def test_a_host_device_picked_before_its_host_said_hello_stays_picked(qtbot, hosts_window):
    """``--device lab::cpu`` on the command line: the local worker's devices come first and must
    not take the pick back to the local CPU; the host's own entry replaces it when it comes."""
    w = hosts_window
    box = w.device_box
    if box.findData("lab::cpu") < 0:
        box.addItem("lab::cpu", "lab::cpu")
    box.setCurrentIndex(box.findData("lab::cpu"))
    w.handle.sig_devices.emit([{"id": "cpu", "name": "CPU", "kind": "cpu"}])  # the local worker's hello
    assert box.currentData() == "lab::cpu" and box.currentText() in ("lab: cpu", "lab: cpu (CPU)")
    assert box.itemData(0) == "cpu"
    qtbot.waitUntil(lambda: box.currentText() == "lab: cpu (CPU)", timeout=60_000)
    assert box.currentData() == "lab::cpu" and box.findData("lab::cpu") == box.currentIndex()


def test_all_reduce_is_marked_on_the_parameters(qtbot):
    from dataclasses import replace

    from tests.fixtures_graphs import mul_call
    from widgets.graph.view import GraphView

    ar = {"backend": "gloo", "world_size": 2, "rank": 1, "op": "average", "nodes": ["n1"],
          "params": {"a": {"local": {"numel": 3, "data": [1.0, 2.0, 3.0]},
                           "reduced": {"numel": 3, "data": [2.0, 2.0, 2.0]}}}}
    call = replace(mul_call(), options={"all_reduce": ar})
    view = GraphView()
    qtbot.addWidget(view)
    view.resize(800, 600)
    view.show()
    view.set_call(call, sync=True)
    tags = {t.target: t for t in view.marks.tags if t.kind == "allreduce"}
    assert set(tags) == {"n1"}  # a's AccumulateGrad, not b's
    assert tags["n1"].text == "\u21c4 all-reduce \u00d72"
    assert tags["n1"].toolTip() == ("DDP all-reduce (gloo, 2 ranks, average): a.grad on rank 1 was [1, 2, 3] "
                                    "after this node, and [2, 2, 2] once averaged over the ranks.")


@pytest.mark.slow
def test_hosts_dialog_checks_saves_and_restarts(qtbot, hosts_window, tmp_path):
    from PySide6.QtCore import Qt

    from app.window.hosts_dialog import HostsDialog

    w = hosts_window
    dialog = HostsDialog(w)
    qtbot.addWidget(dialog)
    table = dialog.table
    assert [table.item(r, 0).text() for r in range(table.rowCount())] == ["lab", "gone"]
    dialog.add_row(["gpu-box", "me@gpu box", "", "/opt/venv/bin/python", "/data"])
    dialog.save()
    assert "row 3: host 'gpu-box': 'dest' 'me@gpu box' is not an ssh destination" in dialog.error.text()
    assert dialog.result() == 0 and [h["name"] for h in load_hosts()] == ["lab", "gone"]  # nothing lost
    table.item(2, 1).setText("me@gpu-box")
    table.item(0, 5).setCheckState(Qt.CheckState.Checked)  # lab: send the files beside each script
    table.removeRow(1)
    dialog.grab().save(str(tmp_path / "hosts-dialog.png"))
    dialog.save()
    assert dialog.result() == 1
    assert load_hosts()[1] == {"name": "gpu-box", "remote_cwd": "/data", "send_folder": False, "kind": "ssh",
                               "dest": "me@gpu-box", "python": "/opt/venv/bin/python"}
    assert load_hosts()[0]["send_folder"] is True
    w.restart_hosts()
    assert set(w.handle.hosts.clients) == {"lab", "gpu-box"}
    box = w.device_box
    assert not any(str(box.itemData(i)).startswith("gone::") for i in range(box.count()))


@pytest.mark.slow
def test_hosts_dialog_tests_the_selected_host(qtbot, hosts_window, tmp_path):
    from app.window.hosts_dialog import HostsDialog

    dialog = HostsDialog(hosts_window)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.table.selectRow(0)  # lab
    dialog.test.click()
    assert not dialog.test.isEnabled() and dialog.report.text().startswith("Starting a worker on lab: lab (sh -c ")
    qtbot.waitUntil(dialog.test.isEnabled, timeout=60_000)
    lines = dialog.report.text().splitlines()
    assert lines[0].startswith("lab: ready in ") and "protocol 5" in lines[0]
    assert "lab: cpu (CPU)" in lines[1:] and "#1b5e20" in dialog.report.styleSheet()
    dialog.grab().save(str(tmp_path / "hosts-test.png"))
    dialog.table.selectRow(1)  # gone
    dialog.test.click()
    qtbot.waitUntil(dialog.test.isEnabled, timeout=60_000)
    assert dialog.report.text().startswith("gone: failed after ") and "no route to gone" in dialog.report.text()
    assert "#b00020" in dialog.report.styleSheet()
    dialog.add_row(["bad", "me@bad host", "", "python3", ""])
    dialog.table.selectRow(2)
    dialog.test.click()  # a row that cannot start anything says which field, at once
    assert dialog.test.isEnabled()
    assert dialog.report.text() == "row 3: host 'bad': 'dest' 'me@bad host' is not an ssh destination (user@host, ssh://user@host:port or a ~/.ssh/config alias)"


@pytest.mark.slow
def test_reconnect_hosts_starts_their_workers_again(qtbot, hosts_window, tmp_path):
    w = hosts_window
    box = w.device_box
    qtbot.waitUntil(lambda: box.findText("gone: unavailable") > 0 and box.findData("lab::cpu") > 0, timeout=60_000)
    before = w.handle.hosts
    # The route to 'gone' is back: its command now starts a worker.
    worker = f"sh -c 'cd {shlex.quote(str(ROOT))} && exec {shlex.quote(PY)} -m core.worker'"
    save_hosts([{"name": "lab", "kind": "command", "command": worker},
                {"name": "gone", "kind": "command", "command": worker}])
    assert w.act_reconnect_hosts.text() == "Rec&onnect Hosts"
    w.act_reconnect_hosts.trigger()
    assert w.handle.hosts is not before and set(w.handle.hosts.clients) == {"lab", "gone"}
    assert box.findText("gone: connecting…") > 0 and box.findText("gone: unavailable") < 0
    qtbot.waitUntil(lambda: box.findData("gone::cpu") > 0, timeout=60_000)
    assert box.itemText(box.findData("gone::cpu")) == "gone: cpu (CPU)"


@pytest.mark.slow
def test_transfer_progress_in_the_status_bar(hosts_window):
    from app.session.host_devices import end_transfer, show_transfer
    from core.protocol.events import Transfer

    w = hosts_window
    show_transfer(w, Transfer(received=2 * MB, decoded=int(12.5 * MB), raw=50 * MB, codec="zlib"))
    assert (w.busy.minimum(), w.busy.maximum(), w.busy.value()) == (0, 1000, 250)
    assert w.busy.text() == "trace 25%"
    assert w.busy.toolTip() == "Receiving the trace: 2.0 MB received (zlib), 12.5 MB of 50.0 MB decoded"
    end_transfer(w)
    assert w.busy.maximum() == 0 and not w.busy.isTextVisible()
    # The local worker's traces come in raw columns: a small one flashes no bar, a big one has its bar.
    show_transfer(w, Transfer(received=1_000_004, decoded=1_000_000, raw=3_000_000, codec="raw"))
    assert w.busy.maximum() == 0 and not w.busy.isTextVisible()
    show_transfer(w, Transfer(received=6 * MB + 12, decoded=6 * MB, raw=12 * MB, codec="raw"))
    assert (w.busy.maximum(), w.busy.value(), w.busy.text()) == (1000, 500, "trace 50%")
    assert w.busy.toolTip() == "Receiving the trace: 6.0 MB received (uncompressed), 6.0 MB of 12.0 MB decoded"
    end_transfer(w)


def test_device_labels():
    from app.session.host_devices import device_label, split_device

    h100 = {"id": "cuda:0", "name": "NVIDIA H100", "kind": "cuda", "total_memory": 80 * 2**30}
    assert device_label("gpu-box", h100) == "gpu-box: cuda:0 (NVIDIA H100, 80 GB)"
    assert device_label("gpu-box", {"id": "cpu", "name": "CPU", "kind": "cpu"}) == "gpu-box: cpu (CPU)"
    assert split_device("gpu-box::cuda:1") == ("gpu-box", "cuda:1")
    assert split_device("cuda:1") == (None, "cuda:1")


def test_upload_progress_in_the_status_bar(qtbot):
    from dataclasses import replace
    from types import SimpleNamespace

    from PySide6.QtWidgets import QProgressBar

    from app.session.host_devices import show_transfer
    from core.protocol.events import Transfer

    bar = QProgressBar()
    qtbot.addWidget(bar)
    window = SimpleNamespace(busy=bar)
    event = Transfer(of="upload", name="tiny-bert/model.safetensors", sent=30 * MB, raw=120 * MB, codec="zlib")
    show_transfer(window, event)
    assert (bar.maximum(), bar.value(), bar.text()) == (1000, 250, "sending model.safetensors 25%")
    assert bar.toolTip() == "Sending model.safetensors to the host: 30.0 MB of 120.0 MB (zlib)"
    show_transfer(window, replace(event, sent=120 * MB))  # all sent: busy again while the run starts
    assert bar.maximum() == 0 and not bar.isTextVisible()


@pytest.mark.slow
def test_a_host_run_whose_script_closes_the_pipe_says_so_and_the_host_runs_again(qtbot, hosts_window, tmp_path):
    """The script closes the worker's pipe on a host: the run ends within seconds (not at the
    time limit), the Problems panel says why and the streamed call stays, and the next run on
    that host starts a worker again."""
    w = hosts_window
    box = w.device_box
    qtbot.waitUntil(lambda: ("lab: cpu (CPU)", "lab::cpu") in _items(box), timeout=60_000)
    box.setCurrentIndex(box.findData("lab::cpu"))
    closer = tmp_path / "closer.py"
    closer.write_text("import os, time, torch\nx = torch.ones(2, requires_grad=True)\n(x * 3).sum().backward()\n"
                      "os.closerange(3, 65536)\nos.close(1)\ntime.sleep(120)\n")
    with qtbot.waitSignal(w.sig_trace_shown, timeout=40_000):  # the window's time limit is 60 s
        w.open_script(str(closer))
    err = w.last_error
    assert (err.type, err.kind) == ("PipeClosed", "disconnected")
    assert err.message == ("the script closed the worker's pipe to the app, so nothing more could come back from "
                           "lab: the worker ended the run")
    problem = w.problems.problems()[0]
    assert problem.summary == f"PipeClosed: {err.message}"
    assert "The connection to the worker&#x27;s host closed" in problem.details
    assert w.call is not None and w.call.leaf_grads["x"].data == [3.0, 3.0]  # the streamed call is kept
    w.grab().save(str(tmp_path / "hung-up.png"))
    with qtbot.waitSignal(w.sig_trace_shown, timeout=60_000):
        w.open_script(str(EXAMPLES / "01_multiply.py"))
    assert w.last_error is None and {n.name for n in w.call.nodes} == {"MulBackward0", "AccumulateGrad"}
    assert w.state_label.text().endswith(" s on lab: cpu")


@pytest.mark.slow
def test_a_host_whose_waiting_worker_died_runs_the_next_script_on_a_fresh_one(qtbot, hosts_window):
    """The host's worker, started with the window, dies while it waits (a dropped connection):
    the next run on that host starts a fresh worker instead of waiting on the dead one."""
    import psutil

    w = hosts_window
    box = w.device_box
    qtbot.waitUntil(lambda: ("lab: cpu (CPU)", "lab::cpu") in _items(box), timeout=60_000)
    (lab,) = [p for p in psutil.Process().children(recursive=True) if p.cmdline()[-2:] == ["-m", "core.worker"]]
    lab.kill()  # the local worker, started with --fault-file, is left alone
    qtbot.waitUntil(lambda: not w.handle.hosts.client_for("lab")._spare.alive, timeout=10_000)
    box.setCurrentIndex(box.findData("lab::cpu"))
    with qtbot.waitSignal(w.sig_trace_shown, timeout=60_000):
        w.open_script(str(EXAMPLES / "01_multiply.py"))
    assert w.last_error is None and {n.name for n in w.call.nodes} == {"MulBackward0", "AccumulateGrad"}
    assert w.state_label.text().endswith(" s on lab: cpu")
