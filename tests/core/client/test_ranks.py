"""DDP in the window: Run with torchrun on 2 gloo ranks, then the rank picker over the Calls list
switches the shown trace to rank 1, whose grads equal rank 0's after the all-reduce and whose
parameters carry the all-reduce mark with rank 1's own local gradient."""

import pytest
import torch

from app.session.session import SessionState

DDP_SCRIPT = (
    "import torch, torch.distributed as dist, torch.nn as nn\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "dist.init_process_group('gloo')\nrank = dist.get_rank()\ntorch.manual_seed(0)\n"
    "model = DDP(nn.Linear(3, 2))\ntorch.manual_seed(100 + rank)\nx = torch.randn(4, 3)\n"
    "loss = model(x).pow(2).mean()\nloss.backward()\ndist.destroy_process_group()\n")


WINDOW_TIMEOUT = 120  # torchrun starts two ranks: the window's run time limit (the conftest window)


def local_grads() -> dict:
    """Each rank's gradient of the script's loss, computed here."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    out = {}
    for r in (0, 1):
        torch.manual_seed(100 + r)
        gw, gb = torch.autograd.grad(ref(torch.randn(4, 3)).pow(2).mean(), (ref.weight, ref.bias))
        out[r] = {"module.weight": gw.reshape(-1), "module.bias": gb.reshape(-1)}
    return out


@pytest.mark.slow
def test_torchrun_dialog_and_switching_ranks(qtbot, window, tmp_path):
    from app.session.ranks import TorchrunDialog, set_torchrun

    w = window
    dialog = TorchrunDialog(w, nproc=2, rank=0)
    qtbot.addWidget(dialog)
    dialog.grab().save(str(tmp_path / "torchrun-dialog.png"))
    dialog.nproc.setValue(3)
    assert dialog.rank.maximum() == 2  # the rank follows the number of processes
    dialog.rank.setValue(2)
    assert dialog.options() == {"nproc": 3, "rank": 2}
    dialog.use.setChecked(False)
    assert dialog.options() is None
    assert w.act_torchrun.text() == "Run with &torchrun…"

    script = tmp_path / "ddp_linear.py"
    script.write_text(DDP_SCRIPT)
    w.open_script(str(script), run=False)
    set_torchrun(w, {"nproc": 2, "rank": 0})
    with qtbot.waitSignal(w.sig_trace_shown, timeout=180_000):
        w.run_script()
    assert w.trace.error is None, (w.trace.error, w.trace.output[-2000:])
    picker = w.ranks
    assert picker.row.isVisible()
    assert [picker.combo.itemText(i) for i in range(picker.combo.count())] == ["Rank 0 of 2", "Rank 1 of 2"]
    assert picker.combo.currentData() == 0
    rank0 = w.trace
    (call0,) = rank0.calls
    assert call0.options["all_reduce"]["rank"] == 0
    w.grab().save(str(tmp_path / "ranks.png"))

    with qtbot.waitSignal(picker.sig_rank, timeout=10_000):
        picker.combo.activated.emit(1)  # the user picks rank 1
    assert picker.combo.currentData() == 1
    rank1 = w.trace
    assert rank1 is not rank0 and rank1.script == str(script.resolve())
    (call1,) = rank1.calls
    assert w.calls.call_ids() == [call1.id] and w.call is call1  # rank 1's call is the one shown
    ar = call1.options["all_reduce"]
    assert ar["rank"] == 1 and ar["world_size"] == 2
    local = local_grads()
    for name in ("module.weight", "module.bias"):
        # After the all-reduce both ranks hold the mean of the two local gradients.
        assert call1.leaf_grads[name].data == call0.leaf_grads[name].data
        mean = (local[0][name] + local[1][name]) / 2
        assert torch.allclose(torch.tensor(call1.leaf_grads[name].data), mean, atol=1e-6)
        # Rank 1's record holds its own local gradient, not rank 0's.
        got = torch.tensor(ar["params"][name]["local"]["data"])
        assert torch.allclose(got, local[1][name], atol=1e-6)
        assert not torch.allclose(got, local[0][name], atol=1e-3)
    def marked_rank_1() -> bool:  # the graph is laid out off the GUI thread
        tags = [t for t in w.graph.marks.tags if t.kind == "allreduce"]
        return len(tags) == 2 and all("on rank 1 was" in t.toolTip() for t in tags)

    qtbot.waitUntil(marked_rank_1, timeout=10_000)
    assert not any(getattr(t, "hooks", None) for t in call1.tensors)  # the app's own hook is not the script's
    w.grab().save(str(tmp_path / "rank1.png"))

    with qtbot.waitSignal(picker.sig_rank, timeout=10_000):
        picker.show_rank(0)
    assert w.trace is rank0
    # Debug pauses the script in the worker itself: it runs as one process, rank 0 of a world of 1,
    # its process group starts, and the grads after Continue are rank 0's own.
    said = []
    w.session.sig_status.connect(said.append)
    with qtbot.waitSignal(w.session.sig_paused, timeout=120_000):
        w.debug_script()
        # While it starts, and on the ticking status after: the same words.
        assert w.state_label.text().startswith("Debugging ddp_linear.py as one process, rank 0 of 1 (Run starts "
                                               "all 2 ranks with torchrun)")
        qtbot.waitUntil(lambda: w.state_label.text().startswith(
            "Debugging ddp_linear.py as one process, rank 0 of 1 (Run starts all 2 ranks with torchrun)… ")
            or w.session.state is SessionState.PAUSED, timeout=60_000)
    assert any("ddp_linear.py as one process, rank 0 of 1" in text for text in said), said
    w.session.continue_()
    qtbot.waitUntil(lambda: w.session.state is SessionState.IDLE and not w.handle.running and bool(w.trace.calls)
                    and bool(w.trace.calls[0].leaf_grads), timeout=120_000)
    assert w.trace.error is None, (w.trace.error, w.trace.output[-2000:])
    (debugged,) = w.trace.calls
    assert "all_reduce" not in debugged.options  # no other rank to average with
    for name in ("module.weight", "module.bias"):
        assert torch.allclose(torch.tensor(debugged.leaf_grads[name].data), local[0][name], atol=1e-6)
    # Without torchrun set for it, a plain run of the DDP script fails in init_process_group: the
    # status says what to do.
    set_torchrun(w, None)
    w.run_script()
    qtbot.waitUntil(lambda: w.last_error is not None and "RANK expected" in w.last_error.message, timeout=120_000)
    qtbot.waitUntil(lambda: "Run with torchrun" in w.state_label.text(), timeout=10_000)
    # A plain script afterwards: no torchrun, no picker.
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * 3).sum().backward()\n")
    w.open_script(str(plain))
    qtbot.waitUntil(lambda: w.trace.script == str(plain.resolve()) and w.session.state is SessionState.IDLE, timeout=120_000)
    assert w.trace.calls[0].leaf_grads["x"].data == [3.0, 3.0]
    assert not picker.row.isVisible()


@pytest.mark.slow
def test_saved_ranks_open_together_and_export_together(qtbot, window, tmp_path, capsys):
    """``trace --nproc 2 --json run.json`` writes run.json (rank 0) and run.rank1.json; opening
    either brings back the picker over both ranks (a stray or broken file beside them left out);
    Export > JSON writes every rank again; a plain saved trace then hides the picker."""
    from app.cli.commands import main
    from app.window.export_dialog import run_export
    from app.session.open_trace import open_trace
    from core.model.rank_files import rank_of, rank_path, sibling_ranks
    from core.model.trace_json import load_trace

    script = tmp_path / "ddp_linear.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / "run.json"
    assert main(["trace", str(script), "--nproc", "2", "--json", str(out), "--quiet"]) == 0
    assert rank_path(out, 1) == tmp_path / "run.rank1.json" and rank_path(out, 1).is_file()
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * 3).sum().backward()\n")
    assert main(["trace", str(plain), "--json", str(tmp_path / "run.rank7.json"), "--quiet"]) == 0  # no rank
    (tmp_path / "run.rank5.json").write_text("{not json")
    capsys.readouterr()

    w = window
    picker = w.ranks
    assert open_trace(w, str(tmp_path / "run.rank1.json"))
    assert picker.row.isVisible() and picker.combo.currentData() == 1
    assert [picker.combo.itemText(i) for i in range(picker.combo.count())] == ["Rank 0 of 2", "Rank 1 of 2"]
    assert rank_of(w.trace) == 1
    assert w.state_label.text() == (
        "Opened the saved trace run.rank1.json of ddp_linear.py (recorded on cpu, torch "
        f"{torch.__version__}): rank 1 of 2, the other ranks' files beside it (pick one above the Calls list)")
    rank1 = w.trace.calls[0]
    with qtbot.waitSignal(picker.sig_rank, timeout=10_000):
        picker.combo.activated.emit(0)
    rank0 = w.trace.calls[0]
    assert rank_of(w.trace) == 0 and w.call is rank0
    local = local_grads()
    for name in ("module.weight", "module.bias"):
        assert rank0.leaf_grads[name].data == rank1.leaf_grads[name].data  # equal after the all-reduce
        assert torch.allclose(torch.tensor(rank0.options["all_reduce"]["params"][name]["local"]["data"]),
                              local[0][name], atol=1e-6)
        assert torch.allclose(torch.tensor(rank1.options["all_reduce"]["params"][name]["local"]["data"]),
                              local[1][name], atol=1e-6)

    again = tmp_path / "export" / "again.json"
    written = run_export(w, path=str(again))
    assert written == [again, again.with_name("again.rank1.json")]
    by_rank = {rank_of(load_trace(p)): load_trace(p) for p in written}
    assert sorted(by_rank) == [0, 1] and rank_of(load_trace(again)) == 0  # the shown rank at the path
    assert by_rank[1].calls[0].leaf_grads == rank1.leaf_grads
    assert sorted(sibling_ranks(again, by_rank[0])) == [0, 1]
    only = tmp_path / "export" / "only.json"
    assert run_export(w, path=str(only), only_call=True) == [only]  # one call of one rank: one file

    assert open_trace(w, str(tmp_path / "run.rank7.json"))  # not a DDP run: no picker
    assert not picker.row.isVisible() and picker.traces == {}
    assert w.trace.calls[0].leaf_grads["x"].data == [3.0, 3.0]
