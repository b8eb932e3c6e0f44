"""A very long error is shown cut, with a note of what was left out; Copy takes it whole."""

from PySide6.QtGui import QGuiApplication

from core.model.trace import CallInfo, ErrorInfo, Trace
from widgets.display_text import cut_text
from widgets.panels.problems import ProblemsPanel

MESSAGE = "x" * 10**6
TRACEBACK = f'Traceback (most recent call last):\n  File "big.py", line 1, in <module>\nRuntimeError: {MESSAGE}\n'


def test_a_one_megabyte_error_is_cut_for_display_and_copied_whole(qtbot):
    panel = ProblemsPanel()
    qtbot.addWidget(panel)
    panel.resize(1000, 400)
    panel.show()
    call = CallInfo(id="c0", index=0, api="backward", line=1, roots=[], nodes=[], tensors=[],
                    error=ErrorInfo("RuntimeError", "y" * 300_000))
    panel.set_trace(Trace(calls=[call], error=ErrorInfo("RuntimeError", MESSAGE, 1, TRACEBACK, file="big.py")))
    qtbot.waitExposed(panel)

    assert panel.count() == 2
    row = panel.tree.topLevelItem(0).text(0)
    assert row == "RuntimeError: " + "x" * 186 + "… (999,814 more characters; Copy takes all)"
    assert panel.tree.topLevelItem(1).text(0).endswith("… (299,817 more characters; Copy takes all)")
    shown = panel.details.toPlainText()
    assert "x" * 2000 + "… (998,000 more characters; Copy takes all)" in shown
    assert "RuntimeError: " + "x" * 1986 + "… (998,014 more characters; Copy takes all)" in shown  # traceback
    assert len(shown) < 10_000

    text = panel.current_text()
    assert f"RuntimeError: {MESSAGE}\n" in text and TRACEBACK.rstrip() in text  # nothing lost
    panel.copy_current()
    assert QGuiApplication.clipboard().text() == text
    assert panel.problems()[0].summary == f"RuntimeError: {MESSAGE}"


def test_many_lines_are_cut_to_the_text_limit():
    text = "line\n" * 100_000
    cut = cut_text(text)
    assert cut.endswith("\n… (480,000 more characters; Copy takes all)")
    assert cut.count("\n") == 4_000 and cut.startswith("line\nline\n")
    assert cut_text("short\ntext\n") == "short\ntext"


def test_rich_text_is_cut_between_tags_never_inside_one():
    from widgets.display_text import cut_markup

    big = "x" * 5_000
    markup = f"<p><a href='node:{big}'>{big}</a> &amp; tail</p>"
    assert cut_markup(markup) == (f"<p><a href='node:{big}'>" + "x" * 1_000
                                  + "… (4,000 more characters; Copy takes all)</a> &amp; tail</p>")
    assert cut_markup("<b>" + "a&amp;" * 400 + "</b>").endswith("&amp;a… (1,400 more characters; Copy takes all)</b>")
