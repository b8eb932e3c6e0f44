"""Memory sampling, saved-tensor accounting and the memory chart."""

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from PySide6.QtCore import QPointF, Qt  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402

from core.worker.memory import MemorySampler  # noqa: E402
from core.worker.memory_sources import CpuSource, CudaSource, FakeCudaSource  # noqa: E402
from core.worker.saved_bytes import held_by_nodes, memory_report, saved_tensor_bytes  # noqa: E402
from core.model.trace import MemorySample  # noqa: E402
from widgets.memory.chart import MB, MemoryChart  # noqa: E402


def _wait(predicate, timeout=5.0):
    """Wait for the sampler thread (the machine may be busy) without a fixed sleep."""
    deadline = time.perf_counter() + timeout
    while not predicate():
        assert time.perf_counter() < deadline, "timed out waiting for samples"
        time.sleep(0.005)


# -- saved tensors --------------------------------------------------------------------------------


def test_saved_bytes_count_each_storage_once_and_drop_to_zero_after_backward():
    a = torch.randn(1000, requires_grad=True)
    b = a.sigmoid()  # saves its result: 4000 bytes
    assert saved_tensor_bytes([b]) == 4000
    c = b * b  # saves b twice: the same storage
    assert saved_tensor_bytes([c]) == 4000
    assert saved_tensor_bytes([c.grad_fn]) == 4000  # nodes work as roots too
    c.sum().backward()
    assert saved_tensor_bytes([c]) == 0


def test_saved_bytes_of_custom_functions_and_tensors_modified_in_place():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 2

    x = torch.randn(250, requires_grad=True)
    y = Double.apply(x)
    assert saved_tensor_bytes([y]) == 1000
    y.sum().backward()
    assert saved_tensor_bytes([y]) == 0
    h = x.clone()
    s = h.sin()  # saves h
    h.add_(1)  # stale, but still held until the graph dies
    assert saved_tensor_bytes([s]) == 1000


def _epochs(keep_graph: bool, epochs: int = 4) -> list[int]:
    torch.manual_seed(0)
    w = torch.randn(1000, requires_grad=True)
    kept, sizes = [], []
    for _ in range(epochs):
        x = torch.randn(1000)
        train = (x * w).sigmoid().sum()
        train.backward()  # frees this graph's saved tensors
        val = (torch.randn(1000) * w).sigmoid().sum()  # mul saves x, sigmoid its result
        kept.append(val if keep_graph else val.item())
        roots = [v for v in kept if isinstance(v, torch.Tensor)] + [train, val]
        sizes.append(saved_tensor_bytes(roots))
    return sizes


def test_keeping_loss_tensors_grows_saved_bytes_linearly_and_item_stays_flat():
    assert _epochs(keep_graph=True) == [8000, 16000, 24000, 32000]
    assert _epochs(keep_graph=False) == [8000, 8000, 8000, 8000]


def test_held_by_nodes_ranks_nodes_by_their_saved_bytes():
    from core.worker.capture.snapshot import Snapshotter

    a = torch.randn(1000, requires_grad=True)
    b = a.sigmoid()  # SigmoidBackward0 saves b
    c = b.exp()  # ExpBackward0 saves c
    d = c * a  # MulBackward0 saves c and a
    rows = held_by_nodes([d])
    assert [(r["name"], r["bytes"], r["tensors"]) for r in rows] == [
        ("MulBackward0", 8000, 2), ("ExpBackward0", 4000, 1), ("SigmoidBackward0", 4000, 1)]
    nodes, _, _ = Snapshotter(lambda t: None).walk([d.grad_fn])
    for r in rows:  # node_index is the trace's n<i>
        assert nodes[r["node_index"]].id == f"n{r['node_index']}"
        assert nodes[r["node_index"]].name == r["name"]
    report = memory_report([d])
    assert report["total"] == 12000  # a, b and c once each
    assert report["node_count"] == 4
    assert report["nodes"] == rows


# -- the sampler ----------------------------------------------------------------------------------


def test_cpu_source_reads_this_process_rss():
    psutil = pytest.importorskip("psutil")
    source = CpuSource()
    rss = source.read()["rss"]
    assert abs(rss - psutil.Process().memory_info().rss) < 64 << 20


def test_cpu_sampler_records_phases_around_forward_and_backward():
    roots: list = []
    sampler = MemorySampler(CpuSource(), rate_hz=200, saved_bytes_fn=lambda: saved_tensor_bytes(roots))
    sampler.start()
    sampler.mark("forward")
    a = torch.randn(1000, requires_grad=True)
    h = a
    for _ in range(4):
        h = h.sigmoid()  # each saves its 4000-byte result
    loss = h.sum()
    roots.append(loss)
    _wait(lambda: len(sampler.samples) >= 4)
    call_t = time.perf_counter() - sampler.origin
    start = sampler.mark("backward", {"type": "call", "index": 0, "t": call_t})
    _wait(lambda: sampler.samples[-1].phase == "backward" and sampler.samples[-1] is not start)
    loss.backward()
    after = sampler.mark("between")
    _wait(lambda: sampler.samples[-1].phase == "between" and sampler.samples[-1] is not after)
    sampler.stop()
    samples = sampler.samples
    phases = [s.phase for s in samples]
    assert {"forward", "backward", "between"} <= set(phases)
    assert phases.index("forward") < phases.index("backward") < phases.index("between")
    times = np.array([s.t for s in samples])
    assert np.all(np.diff(times) >= 0) and times[-1] > times[0]
    assert all(s.rss > 0 and s.device == "cpu" for s in samples)
    assert start.saved_bytes == 16000  # four sigmoid results
    assert after.saved_bytes == 0 and samples[-1].saved_bytes == 0
    assert all(s.saved_bytes == 16000 for s in samples if s.phase == "backward")
    assert sampler.calls == [{"index": 0, "t": call_t}]
    # The event dates the mark, or the sample just before when the sampler thread recorded one
    # between the event and the mark (the series stays in time order).
    before = samples[next(i for i, s in enumerate(samples) if s is start) - 1]
    assert start.t == max(call_t, before.t)
    assert sampler.overhead()["samples"] >= 3


def test_samples_stream_in_batches_and_drain_once():
    batches: list[list[dict]] = []
    sampler = MemorySampler(FakeCudaSource([(1, 2)]), rate_hz=200, on_batch=batches.append, batch_interval=0.02)
    with sampler:
        _wait(lambda: sum(len(b) for b in batches) >= 10)
        first = sampler.drain()
    rest = sampler.drain()
    assert sampler.drain() == []
    assert len(first) + len(rest) == len(sampler.samples)
    streamed = [d for b in batches for d in b]
    assert len(streamed) == len(sampler.samples)  # stop() sends what was left
    assert [MemorySample(**d) for d in streamed] == sampler.samples
    assert set(streamed[0]) >= {"t", "device", "allocated", "reserved", "rss", "saved_bytes", "phase"}


def test_marks_survive_thinning_and_failures_do_not_stop_sampling():
    def broken():
        raise RuntimeError("graph mutated")

    sampler = MemorySampler(FakeCudaSource([(1, 2)]), rate_hz=1000, saved_bytes_fn=broken, max_samples=16)
    sampler.start()
    for i in range(5):
        sampler.handle_event({"type": "call", "index": i, "t": time.perf_counter() - sampler.origin})
        _wait(lambda: sampler.samples[-1].phase == "backward" and len(sampler.drain()) > 2)
        sampler.handle_event({"type": "call_done", "index": i, "t": time.perf_counter() - sampler.origin})
        time.sleep(0.01)
    sampler.stop()
    samples = sampler.samples
    # Each thinning drops every other unmarked sample of the older half, so with the 10 marks
    # kept the series never holds more than 4 * 10 + 3 samples, however the ticks fall.
    assert len(samples) <= 43
    phases = ["start"] + [s.phase for s in samples]
    starts = [i for i in range(len(samples)) if phases[i + 1] == "backward" and phases[i] != "backward"]
    assert len(starts) == 5 and [c["index"] for c in sampler.calls] == list(range(5))


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.is_initialized(), reason="reads real counters")
def test_cuda_source_reads_zeros_without_initialising_cuda():
    source = CudaSource("cuda:1")
    assert source.device == "cuda:1"
    values = source.read()
    assert {k: values[k] for k in ("allocated", "reserved", "max_allocated")} == {
        "allocated": 0, "reserved": 0, "max_allocated": 0}
    assert values["rss"] > 0  # host memory is read on CUDA too
    assert not torch.cuda.is_initialized()


def test_fake_cuda_sampler_feeds_the_chart_allocated_and_reserved(qtbot):
    script = [(10 << 20, 32 << 20), (50 << 20, 64 << 20), (120 << 20, 128 << 20), (80 << 20, 128 << 20)]
    source = FakeCudaSource(script)
    sampler = MemorySampler(source, rate_hz=200)
    with sampler:
        sampler.mark("forward")
        _wait(lambda: source.reads >= 6)
    samples = sampler.samples
    assert all(s.device == "cuda:0" for s in samples)
    assert [(s.allocated, s.reserved) for s in samples[:4]] == script
    assert samples[-1].allocated == 80 << 20 and samples[-1].max_allocated == 120 << 20
    chart = MemoryChart()
    qtbot.addWidget(chart)
    chart.set_samples(samples)
    lines = chart.line_items()
    assert set(lines) == {"allocated", "reserved", "saved_bytes"}
    assert chart.units["left"] == ("MB", 1 << 20)  # 128 MB at most
    assert np.allclose(lines["allocated"].yData * MB, [s.allocated for s in samples])
    assert np.allclose(lines["reserved"].yData * MB, [s.reserved for s in samples])
    # The cache (reserved - allocated) is shaded between the two lines and explained on hover.
    assert chart.gap is not None and chart.gap.curves == [lines["allocated"], lines["reserved"]]
    assert "empty_cache" in chart.plot_widget.toolTip() and "reserved" in chart.plot_widget.toolTip()
    assert "cache (reserved − allocated): 48.0 MB" in chart.readout_html(3)  # 128 MB reserved, 80 allocated


# -- the chart ------------------------------------------------------------------------------------


def _series() -> list[MemorySample]:
    """3 phases, 2 backward calls: forward 0-0.9 s, #0 at 1.0 s, between, #1 at 2.0 s, between."""
    phases = ["forward"] * 10 + ["backward"] * 5 + ["between"] * 5 + ["backward"] * 5 + ["between"] * 5
    return [MemorySample(t=i / 10, device="cpu", rss=(300 + i) << 20, saved_bytes=(i % 7) << 20, phase=p)
            for i, p in enumerate(phases)]


def _points(item) -> int:
    return 0 if item.xData is None else len(item.xData)


def _click(qtbot, chart, t):
    scene = chart.view.mapViewToScene(QPointF(t, chart.view.viewRect().center().y()))
    pos = chart.plot_widget.mapFromScene(scene)
    qtbot.mouseClick(chart.plot_widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def test_chart_draws_lines_bands_and_call_markers(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.set_samples(_series())
    lines = chart.line_items()
    assert set(lines) == {"rss", "saved_bytes"}
    assert all(len(item.xData) == 30 for item in lines.values())
    assert lines["rss"].yData[0] == 300 and lines["saved_bytes"].yData[3] == 3
    bands = chart.band_items()
    assert [b[0] for b in bands] == ["forward", "backward", "between", "backward", "between"]
    assert bands[1][1:] == (1.0, 1.5) and bands[-1][2] == 2.9
    assert chart.marker_items() == [(0, 1.0), (1, 2.0)]
    chart.set_calls([{"index": 7, "t": 1.0}, {"index": 8, "t": 2.0}])  # the capture's own indices
    assert [m[0] for m in chart.marker_items()] == [7, 8]


def test_clicking_a_time_selects_the_call_running_then(qtbot):
    chart = MemoryChart()
    qtbot.addWidget(chart)
    chart.resize(800, 300)
    chart.set_samples(_series())
    chart.show()
    qtbot.waitExposed(chart)
    chart.view.setXRange(0, 3, padding=0)
    clicked: list[float] = []
    chart.sig_time_clicked.connect(clicked.append)
    with qtbot.waitSignal(chart.sig_call_selected, timeout=2000) as blocker:
        _click(qtbot, chart, 2.2)  # inside call #1's band
    assert blocker.args == [1]
    assert clicked == [pytest.approx(2.2, abs=0.02)]
    with qtbot.waitSignal(chart.sig_call_selected, timeout=2000) as blocker:
        _click(qtbot, chart, 1.7)  # between: the last call started
    assert blocker.args == [0]
    with qtbot.assertNotEmitted(chart.sig_call_selected, wait=50):
        _click(qtbot, chart, 0.5)  # forward, before any call


def test_hover_readout_and_freed_markers(qtbot):
    chart = MemoryChart()
    qtbot.addWidget(chart)
    chart.set_samples(_series())
    html = chart.readout_html(12)
    assert "1.200 s" in html and "backward #0" in html and "312.0 MB" in html and "5.0 MB" in html
    chart.mark_freed(1.3, 3 << 20)
    chart.add_marker(2.5, "note")
    assert len(chart.note_items()) == 2 and "3.00 MB" in chart.note_items()[0].label.toPlainText()
    chart.clear_markers()
    assert chart.note_items() == []


def test_streamed_samples_match_a_full_set(qtbot):
    chart = MemoryChart()
    qtbot.addWidget(chart)
    series = _series()
    for i in range(0, 30, 4):
        chart.append_samples([vars(s) for s in series[i:i + 4]])  # dicts, as in memory messages
    assert _points(chart.line_items()["rss"]) < 30  # drawn by the refresh timer, not per batch
    qtbot.waitUntil(lambda: _points(chart.line_items()["rss"]) == 30, timeout=2000)
    assert len(chart.band_items()) == 5 and len(chart.marker_items()) == 2
    chart.clear()
    assert chart.band_items() == [] and _points(chart.line_items()["rss"]) == 0


@pytest.mark.parametrize("theme", ["light", "dark", "print"])
def test_chart_renders_something(qtbot, theme):
    chart = MemoryChart(theme=theme)
    qtbot.addWidget(chart)
    chart.resize(700, 260)
    chart.set_samples(_series())
    chart.show()
    qtbot.waitExposed(chart)
    image = chart.grab().toImage()
    background = QColor(chart.theme().background).rgb()
    pixels = [image.pixel(x, y) for x in range(0, image.width(), 3) for y in range(0, image.height(), 3)]
    assert sum(p != background for p in pixels) > len(pixels) // 10
    assert len(set(pixels)) > 20


# -- forward accounting, markers, units, time tools, reference runs, export ------------------------


def test_forward_ops_add_their_saved_tensors_as_they_are_made():
    sampler = MemorySampler(FakeCudaSource([(0, 0)]), rate_hz=1, origin=time.perf_counter() - 60)  # 3 s budget
    sampler.op_interval = 0.0  # a sample per op
    sampler.mark("forward")
    a = torch.randn(1000, requires_grad=True)
    h = a
    for _ in range(3):
        h = h.sigmoid()  # saves its 4000-byte result
        sampler.on_node(h.grad_fn, "SigmoidBackward0 · line 1")
    b = h * h  # saves h twice: the storage counted once already by the last sigmoid
    sampler.on_node(b.grad_fn, "MulBackward0")
    saved = [s.saved_bytes for s in sampler.samples[1:]]
    assert saved == [4000, 8000, 12000, 12000]
    assert [s.where for s in sampler.samples[1:3]] == ["SigmoidBackward0 · line 1"] * 2
    sampler.op_interval = 60.0  # rate-limited: the bytes still count, the next sample waits a minute
    c = b.exp()  # saves its result: 4000 more
    assert sampler.on_node(c.grad_fn).saved_bytes == 16000
    d = c.exp()
    assert sampler.on_node(d.grad_fn) is None and len(sampler.samples) == 6
    assert sampler.note("zero_grad", "line 9").saved_bytes == 20000
    sampler._op_busy = 10.0  # past 5% of the run's minute: nodes wait for the next full walk
    e = d.exp()
    assert sampler.on_node(e.grad_fn) is None and sampler._saved == 20000


def test_the_sampler_starts_in_the_starting_phase():
    sampler = MemorySampler(FakeCudaSource([(0, 0)]), rate_hz=1)
    assert sampler._record(0.0).phase == "starting"
    assert sampler.mark("forward").phase == "forward"
    with pytest.raises(ValueError, match="unknown phase"):
        sampler.mark("warming up")


def test_markers_for_zero_grad_optimizer_step_and_empty_cache():
    from core.worker.memory_marks import describe_node, install_marks

    noted: list[tuple[str, str]] = []
    remove = install_marks(lambda kind, where: noted.append((kind, where)), lambda: 12)
    try:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        model.zero_grad()
        torch.cuda.empty_cache()
    finally:
        remove()
    assert noted == [("zero_grad", "line 12"), ("optimizer.step", "line 12"), ("zero_grad", "line 12"),
                     ("empty_cache", "line 12")]
    opt.step()
    opt.zero_grad()
    assert len(noted) == 4  # removed: nothing more is noted
    y = torch.ones(2, requires_grad=True).exp()
    assert describe_node(y.grad_fn, 7, "fc1") == "ExpBackward0 · line 7 · fc1"


@pytest.mark.parametrize("nbytes, unit", [(1 << 10, "KB"), (50 << 20, "MB"), (3 << 30, "GB"), (300, "KB")])
def test_axis_units_follow_the_magnitude(qtbot, nbytes, unit):
    from core.model.memory import byte_unit

    assert byte_unit(nbytes)[0] == unit
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.set_samples([MemorySample(t=i, device="cpu", rss=nbytes * i // 2, saved_bytes=nbytes * i // 2)
                       for i in range(3)])
    size = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[unit]
    assert chart.units == {"left": (unit, size), "right": (unit, size)}
    assert chart.line_items()["saved_bytes"].yData[2] == pytest.approx(nbytes / size)
    for side in ("left", "right"):
        axis = chart.plot.getAxis(side)
        assert f"({unit})" in axis.labelString() and "x1" not in axis.labelString()
        assert axis.autoSIPrefixScale == 1.0


def _loop(offset=0.0, saved=4 << 10) -> list[MemorySample]:
    """Three iterations of forward (saved rises), backward (falls), between; starting before."""
    out = [MemorySample(t=offset, device="cpu", rss=100 << 20, phase="starting")]
    for k in range(3):
        t0 = offset + 1 + k
        out += [MemorySample(t=t0 + 0.1 * j, device="cpu", rss=100 << 20, saved_bytes=saved * j // 4,
                             phase="forward", where=f"op{j}") for j in range(5)]
        out += [MemorySample(t=t0 + 0.5, device="cpu", rss=100 << 20, saved_bytes=saved, phase="backward"),
                MemorySample(t=t0 + 0.7, device="cpu", rss=100 << 20, phase="between", mark="optimizer.step")]
    return out


def test_fit_call_zooms_to_one_iteration_and_overlay_aligns_them(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.resize(800, 300)
    chart.set_samples(_loop())
    assert [b[0] for b in chart.band_items()][:3] == ["starting", "forward", "backward"]
    assert chart.iterations() == [(1.0, 2.0), (2.0, 3.0), (3.0, 3.7)]
    assert chart.fit_call(1) == (2.0, 3.0)
    x0, x1 = chart.view.viewRange()[0]
    assert 1.9 < x0 < 2.0 and 3.0 < x1 < 3.1
    assert chart.fit_call(9) is None
    assert chart.events.kinds == ["optimizer.step"] * 3 and list(chart.events.t0) == [1.7, 2.7, 3.7]
    t, nbytes, where = chart.peak()
    assert (t, nbytes, where) == (1.4, 4 << 10, "op4")
    assert chart.peak_label.toPlainText() == "peak 4.0 KB · op4"
    chart.set_overlay(True)
    assert chart.overlay_count() == 3 and not chart.line_items()["rss"].isVisible()
    xs = chart.overlay_item.xData
    starts = [0] + [i + 1 for i in np.nonzero(np.isnan(xs))[0][:-1]]
    assert [xs[i] for i in starts] == [0.0, 0.0, 0.0]  # each iteration from its own start
    assert np.nanmax(chart.overlay_item.yData) == 4.0  # KB
    assert chart.plot.getAxis("left").labelString().count("saved (KB)") == 1
    chart.set_overlay(False)
    assert chart.line_items()["rss"].isVisible() and not chart.overlay_item.isVisible()


def test_a_reference_run_shares_the_scale(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.resize(800, 300)
    chart.set_samples(_loop(saved=1 << 20))  # the fix: 1 MB at most
    chart.set_reference(_loop(saved=10 << 20), "leak")  # the leak: 10 MB
    chart.show()
    qtbot.waitExposed(chart)
    ours, ref = chart.line_items()["saved_bytes"], chart._ref_lines["saved_bytes"]
    assert ours.getViewBox() is ref.getViewBox() is chart.view2  # one y scale for both
    assert chart.units["right"] == ("MB", 1 << 20)
    qtbot.waitUntil(lambda: chart.view2.viewRange()[1][1] >= 10)
    y0, y1 = chart.view2.viewRange()[1]
    assert y0 <= 0 and 10 <= y1 < 11 and max(ours.yData) == 1.0 and max(ref.yData) == 10.0
    chart.set_theme("print")  # switching theme keeps the reference
    assert set(chart._ref_lines) == {"rss", "saved_bytes"} and chart.reference_label() == "leak"
    chart.clear_reference()
    assert chart._ref_lines == {} and ref.getViewBox() is None


def test_memory_export_writes_a_valid_svg_and_a_png(qtbot, tmp_path):
    import xml.etree.ElementTree as ET

    from PySide6.QtGui import QImage

    from widgets.memory.export import MemoryExportError, export_samples

    svg = export_samples(_loop(), tmp_path / "m.svg", reference=_loop(saved=8 << 10), reference_label="leak")
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("viewBox") == "0 0 1000 380"
    text = svg.read_text()
    assert "leak: saved" in text and "saved (KB)" in text and "optimizer.step" not in text
    shapes = [e for e in root.iter() if e.tag.rsplit("}", 1)[-1] in ("path", "polyline", "line")]
    assert len(shapes) > 10  # lines, axes, ticks, markers: drawn as vectors
    png = export_samples(_loop(), tmp_path / "m.png", fit_call=0)
    image = QImage(str(png))
    assert (image.width(), image.height()) == (2000, 760)
    assert len({image.pixel(x, y) for x in range(0, 2000, 7) for y in range(0, 760, 7)}) > 8
    with pytest.raises(MemoryExportError, match="unknown memory export format"):
        export_samples(_loop(), tmp_path / "m.pdf")
    with pytest.raises(MemoryExportError, match="no memory samples"):
        export_samples([], tmp_path / "e.svg")


def test_memory_panel_keeps_a_reference_run_fits_a_call_and_exports(qtbot, tmp_path):
    from widgets.memory.panel import CPU_NOTE, CUDA_NOTE, MemoryPanel

    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 320)
    panel.set_run(_loop(saved=1 << 20), "/x/31_graph_leak_fixed.py", call_count=3)
    assert panel.note.text() == CPU_NOTE and panel.call_box.maximum() == 2
    panel.pin_reference()
    assert panel.unpin_button.isEnabled() and "31_graph_leak_fixed" in panel.pin_button.text()
    panel.set_run(_loop(saved=10 << 20), "/x/30_graph_leak.py", call_count=3)
    assert panel.chart.reference_label() == "31_graph_leak_fixed"
    assert max(panel.chart._ref_lines["saved_bytes"].yData) == 1.0  # MB, on the leak's scale
    panel.call_box.setValue(1)
    panel.fit_button.click()
    assert 1.9 < panel.chart.view.viewRange()[0][0] < 2.0
    panel.overlay_box.setChecked(True)
    assert panel.chart.overlay_count() == 3
    out = panel.export(tmp_path / "panel.svg")
    assert "31_graph_leak_fixed: saved" in out.read_text()
    panel.drop_reference()
    assert panel.chart.reference_label() == "" and not panel.unpin_button.isEnabled()
    cuda = [MemorySample(t=i, device="cuda:0", allocated=i << 20, reserved=2 * i << 20) for i in range(3)]
    panel.set_run(cuda, "c.py", call_count=0)
    assert panel.note.text() == CUDA_NOTE and panel.chart.gap is not None


def test_axis_labels_fit_a_short_chart(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.resize(600, 170)  # the memory panel's smallest plot
    chart.set_samples([MemorySample(t=i, device="cpu", rss=(300 + i) << 20, saved_bytes=i << 10) for i in range(5)])
    chart.show()
    qtbot.waitExposed(chart)
    visible = chart.plot_widget.mapToScene(chart.plot_widget.viewport().rect()).boundingRect()
    for side in ("left", "right", "bottom"):
        label = chart.plot.getAxis(side).label
        rect = label.mapRectToScene(label.boundingRect())
        assert visible.contains(rect), (side, rect, visible)
    assert "RSS (MB)" in chart.plot.getAxis("left").labelString()
    assert "saved (KB)" in chart.plot.getAxis("right").labelString()
