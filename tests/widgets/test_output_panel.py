"""The output console stays smooth at any shape: long lines, terminal ``\\r``, bursts of appends."""

import time

from widgets.panels.output import LINE_CHARS, OutputPanel


def test_carriage_return_rewrites_the_line_like_a_terminal(qtbot):
    panel = OutputPanel()
    qtbot.addWidget(panel)
    for i in range(0, 101, 10):
        panel.append(f"\r{i:3d}% |{'#' * (i // 10):<10}|")
    panel.append("\ndone\n")
    assert panel.text() == "100% |##########|\ndone\n"
    panel.append("abcdef\rXY")
    assert panel.text().endswith("done\nXYcdef")
    panel.append("\r\n")  # \r\n ends the line without erasing it
    assert panel.text().endswith("done\nXYcdef\n")


def test_a_long_line_is_cut_into_blocks_and_shown_fast(qtbot):
    panel = OutputPanel()
    qtbot.addWidget(panel)
    panel.resize(600, 400)
    panel.show()
    start = time.process_time()  # CPU time: other processes on the machine do not count
    for _ in range(80):  # 5 MB on one line, in 64 KB chunks as the worker reads them
        panel.append("x" * 65536)
        panel.flush()
        qtbot.wait(0)
    elapsed = time.process_time() - start
    assert elapsed < 5, f"{elapsed:.1f} s for 5 MB on one line"
    doc = panel.view.document()
    longest = max(doc.findBlockByNumber(i).length() - 1 for i in range(doc.blockCount()))
    assert longest <= LINE_CHARS
    text = panel.text()
    assert set(text.replace("\n", "").replace("… earlier output trimmed …", "")) == {"x"}
    assert len(text) <= panel.max_chars + panel.max_chars // 10 + LINE_CHARS


def test_appends_in_one_frame_reach_the_document_once(qtbot):
    panel = OutputPanel()
    qtbot.addWidget(panel)
    changes = []
    panel.view.document().contentsChange.connect(lambda *a: changes.append(a))
    for i in range(500):
        panel.append(f"line {i}\n")
    assert changes == []  # nothing drawn yet: coalesced until the next frame
    qtbot.waitUntil(lambda: len(changes) > 0, timeout=2000)
    assert len(changes) == 1
    assert panel.text().count("\n") == 500 and panel.text().endswith("line 499\n")


def test_a_flood_bigger_than_kept_is_dropped_before_drawing(qtbot):
    panel = OutputPanel(max_chars=10_000)
    qtbot.addWidget(panel)
    for i in range(20_000):
        panel.append(f"row {i}\n")
    text = panel.text()
    assert text.endswith("row 19999\n") and len(text) <= 12_000
    assert panel.view.toPlainText().startswith("… earlier output trimmed …")
