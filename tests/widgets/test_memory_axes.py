"""The memory chart's axes: each y axis has a least span, so small wiggles look small, and a
finished run opens on its first call rather than on the worker starting."""

import pytest

from core.model.trace import MemorySample
from widgets.memory.chart import MB, SPAN_FLOOR, MemoryChart
from widgets.memory.panel import MemoryPanel


def _flat_rss(n: int = 40) -> list[MemorySample]:
    """RSS between 307.996 and 308.000 MB: a 4 KB wiggle, with saved tensors rising and freed."""
    low = int(307.996 * MB)
    return [MemorySample(t=i / 10, device="cpu", rss=low + (i % 5) * 1024, saved_bytes=(i % 4) << 20,
                         phase="forward" if i % 4 < 2 else "backward") for i in range(n)]


def test_a_4_kb_wiggle_on_308_mb_spans_at_least_the_rss_floor(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.resize(800, 300)
    chart.set_samples(_flat_rss())
    chart.show()
    qtbot.waitExposed(chart)
    assert chart.units["left"] == ("MB", 1 << 20)
    floor = max(SPAN_FLOOR[("cpu", "left")], 0.10 * 308.0 * MB) / MB  # 30.8 MB: 10 % of the top value
    qtbot.waitUntil(lambda: chart.view.viewRange()[1][0] < 307.996 < 308.0 < chart.view.viewRange()[1][1] < 400,
                    timeout=5000)  # the range fitted to the data
    y0, y1 = chart.view.viewRange()[1]
    assert y1 - y0 == pytest.approx(floor, rel=0.05)  # not 0.004 MB high
    assert y0 < 307.996 and y1 > 308.000  # the data stays in view, near the middle
    assert abs((y0 + y1) / 2 - 307.998) < 1.0


def test_small_cuda_allocations_keep_zero_in_view_with_a_1_mb_floor(qtbot):
    chart = MemoryChart(theme="light")
    qtbot.addWidget(chart)
    chart.resize(800, 300)
    chart.set_samples([MemorySample(t=i / 10, device="cuda:0", allocated=512 * (i % 3), reserved=2048,
                                    phase="forward") for i in range(20)])
    chart.show()
    qtbot.waitExposed(chart)
    unit = chart.units["left"][1]
    qtbot.waitUntil(lambda: chart.view.viewRange()[1][1] < 2 * MB / unit, timeout=5000)  # fitted to the data
    y0, y1 = chart.view.viewRange()[1]
    assert y1 - y0 == pytest.approx(MB / unit, rel=0.05)
    assert -0.10 * MB / unit <= y0 <= 0 and y1 >= 2048 / unit  # zero near the bottom, not mid-plot


def _slow_start() -> list[MemorySample]:
    """17 s of the worker starting, then 2.7 s of forward and backward calls."""
    samples = [MemorySample(t=float(i), device="cpu", rss=(100 + 10 * i) << 20, phase="starting") for i in range(17)]
    for j in range(28):
        samples.append(MemorySample(t=17.0 + j / 10, device="cpu", rss=300 << 20, saved_bytes=(j % 4) << 20,
                                    phase="forward" if j % 4 < 2 else "backward"))
    return samples


def test_a_finished_run_opens_on_its_first_call_and_whole_run_shows_all(qtbot):
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.resize(1000, 400)
    panel.set_run(_slow_start(), "slow.py", 7)
    panel.show()
    qtbot.waitExposed(panel)
    chart = panel.chart
    assert chart.band_items()[0] == ("starting", 0.0, 17.0)
    x0, x1 = chart.view.viewRange()[0]
    assert 17.0 - 0.02 * 2.7 - 1e-6 <= x0 <= 17.0 and x1 == pytest.approx(19.7, abs=0.01)
    panel.whole_button.click()
    qtbot.waitUntil(lambda: chart.view.viewRange()[0][0] <= 0.0, timeout=5000)
    x0, x1 = chart.view.viewRange()[0]
    assert x0 <= 0.0 and x1 >= 19.7
    chart.clear()  # a new live run follows its samples from the start
    chart.append_samples(_slow_start()[:5])
    chart.flush()
    qtbot.waitUntil(lambda: chart.view.viewRange()[0][0] <= 0.0 and chart.view.viewRange()[0][1] >= 4.0,
                    timeout=5000)


def test_a_run_without_a_starting_band_opens_whole():
    chart = MemoryChart(theme="light")
    samples = [MemorySample(t=i / 10, device="cpu", rss=300 << 20, phase="forward") for i in range(10)]
    chart.set_samples(samples)
    assert chart.opening_range() is None
    assert chart.view.autoRangeEnabled()[0]
