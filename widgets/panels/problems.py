"""Problems of a run: the script's error, errors raised by backward calls, stale saved tensors,
graphs a list keeps alive (one problem per list, the stale tensors of those graphs told in it), and
with the NaN/Inf check on, the first non-finite value and the first non-finite gradient.

Each problem is one row; the details pane shows the message, traceback and fault report, long
lines cut for display (Copy takes the full text). Activating a row asks the app to show the
line, call and node it is about.
"""

from __future__ import annotations

import html
import logging
import re
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QSize, Qt, QUrl, Signal
from PySide6.QtGui import QAction, QColor, QFontDatabase, QGuiApplication, QKeySequence, QPalette
from PySide6.QtWidgets import (
    QHeaderView, QSplitter, QStyle, QTextBrowser, QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget,
)

from core.model.forward_errors import failed_op
from core.model.memory_lessons import kept_graphs
from core.model.nan_check import backward_text, forward_text
from core.model.trace import CallInfo, ErrorInfo, NodeInfo, Trace
from widgets.display_text import cut_line, cut_text
from core.programs.notebook import where as line_where
from widgets.memory.lessons import folded_stale, leak_problems
from widgets.panels.inspector import stale_sentence

log = logging.getLogger(__name__)

KIND_HEADINGS = {
    "exception": "The script raised an exception",
    "exit": "The script exited early",
    "crash": "The worker process crashed",
    "disconnected": "The connection to the worker's host closed",
    "timeout": "The run timed out",
    "cancelled": "The run was stopped",
    "syntax": "The script has a syntax error",
    "load": "The file could not be opened",
}


@dataclass
class Problem:
    """One row: what went wrong and where it points."""

    severity: str  # "error" or "warning"
    summary: str
    details: str  # HTML
    line: int | None = None
    call: str | None = None
    node: str | None = None
    where: str = ""
    text: str = ""  # the whole problem as plain text, uncut: what Copy puts on the clipboard


class ProblemsPanel(QWidget):
    """A list of problems beside the details of the selected one."""

    sig_line_activated = Signal(int)
    """A problem with a script line was activated; carries the 1-based line."""
    sig_call_selected = Signal(str)
    """A problem inside a backward call was activated; carries the call id."""
    sig_node_selected = Signal(str)
    """A problem about one node was activated; carries the node id (after sig_call_selected)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._cells: list[dict] = []  # the trace's notebook cells (set_trace)
        self._calls: list[CallInfo] = []  # the trace's calls (set_trace): where a failed op is drawn
        self.tree = QTreeWidget(self)
        self.tree.setHeaderLabels(["Problem", "Where"])
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setIconSize(QSize(16, 16))
        self.tree.setWordWrap(False)
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.currentItemChanged.connect(self._on_current)
        self.tree.itemActivated.connect(self._on_activated)
        copy = QAction("Copy", self.tree)
        copy.setShortcut(QKeySequence.StandardKey.Copy)
        copy.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        copy.triggered.connect(self.copy_current)
        self.tree.addAction(copy)
        self.tree.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
        self.details = QTextBrowser(self)
        self.details.setOpenLinks(False)
        self.details.anchorClicked.connect(self._on_anchor)
        self.details.document().setDocumentMargin(8)
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(self.tree)
        splitter.addWidget(self.details)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(splitter)
        self.setFocusProxy(self.tree)
        self._mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
        self._problems: list[Problem] = []
        self.clear()

    # public API

    def clear(self) -> None:
        """Remove every problem."""
        self._problems = []
        self._calls = []
        self.tree.clear()
        self._show_details(None)

    def count(self) -> int:
        """How many problems are listed."""
        return len(self._problems)

    def problems(self) -> list[Problem]:
        """The listed problems, in row order."""
        return list(self._problems)

    def current_text(self) -> str:
        """The selected problem in full, as plain text ("" when none is selected)."""
        problem = self._problem_for(self.tree.currentItem())
        return problem.text if problem is not None else ""

    def copy_current(self) -> None:
        """Put the selected problem, uncut, on the clipboard."""
        text = self.current_text()
        if text:
            QGuiApplication.clipboard().setText(text)

    def set_trace(self, trace: Trace | None) -> None:
        """List the trace's error, every call's error and every stale saved tensor."""
        self.clear()
        self._cells = trace.cells if trace is not None else []  # a notebook's: lines read "cell 4, line 2"
        if trace is None:
            return
        self._calls = list(trace.calls)
        problems = []
        kept = kept_graphs(trace)  # graphs a list keeps alive: one problem each, their stale tensors in it
        folded = folded_stale(kept)
        if trace.error is not None:
            problems.append(self._error_problem(trace.error, None, None))
        for call in trace.calls:
            if call.error is not None:
                if trace.error is not None and _same_error(call.error, trace.error):
                    problems[0].call = problems[0].call or call.id
                    problems[0].where = _where(problems[0].line, call, self._cells)
                else:
                    problems.append(self._error_problem(call.error, call, None))
            for node in call.nodes:
                if node.stale is not None and (call.id, node.id) not in folded:
                    problems.append(self._stale_problem(call, node))
        problems.extend(Problem(**fields) for fields in leak_problems(trace, kept))
        problems += self._nonfinite_problems(trace)
        for problem in problems:
            self._add(problem)
        if self._problems:
            self.tree.setCurrentItem(self.tree.topLevelItem(0))

    def show_error(self, error: ErrorInfo, title: str | None = None) -> None:
        """Put ``error`` at the top of the list and show it; ``title`` replaces the heading.

        An error already listed (the trace's own, listed by ``set_trace``) is selected, not added twice.
        """
        problem = self._error_problem(error, None, title)
        for row, listed in enumerate(self._problems):
            if listed.summary == problem.summary and listed.line == problem.line and title is None:
                self.tree.setCurrentItem(self.tree.topLevelItem(row))
                return
        self._add(problem, at=0)
        self.tree.setCurrentItem(self.tree.topLevelItem(0))

    # rows

    def _add(self, problem: Problem, at: int | None = None) -> None:
        item = QTreeWidgetItem([cut_line(problem.summary), cut_line(problem.where)])
        icon = (QStyle.StandardPixmap.SP_MessageBoxCritical if problem.severity == "error"
                else QStyle.StandardPixmap.SP_MessageBoxWarning)
        item.setIcon(0, self.style().standardIcon(icon))
        item.setToolTip(0, cut_line(problem.summary, 1_000))
        if at is None:
            self._problems.append(problem)
            self.tree.addTopLevelItem(item)
        else:
            self._problems.insert(at, problem)
            self.tree.insertTopLevelItem(at, item)

    def _problem_for(self, item: QTreeWidgetItem | None) -> Problem | None:
        if item is None:
            return None
        row = self.tree.indexOfTopLevelItem(item)
        return self._problems[row] if 0 <= row < len(self._problems) else None

    def _error_problem(self, error: ErrorInfo, call: CallInfo | None, title: str | None) -> Problem:
        heading = title or KIND_HEADINGS.get(error.kind, "Error")
        if call is not None and title is None:
            heading = f"Backward call #{call.index} ({call.api}) raised"
        message = _first_line(error.message)
        summary = f"{error.type}: {message}" if message else error.type
        if call is not None:
            summary = f"#{call.index} {summary}"
        parts = [f"<p class='title'>{html.escape(heading)} <a class='muted' href='copy:'>Copy</a></p>",
                 f"<p><b>{html.escape(cut_line(error.type))}</b>: "
                 f"{html.escape(cut_text(error.message))}</p>"]
        text = [heading, f"{error.type}: {error.message}"]
        if error.line:
            where = f"<a href='line:{error.line}'>{html.escape(cut_line(error.where or f'line {error.line}'))}</a>"
            text.append(f"at {error.where or f'line {error.line}'}" + (f" of {error.file}" if error.file else ""))
            if error.file:
                where += f" <span class='muted'>of {html.escape(cut_line(error.file, 1_000))}</span>"
            parts.append(f"<p>at {where}</p>")
        if error.traceback:
            parts.append(f"<p class='section'>Traceback</p>{_code(error.traceback)}")
            text += ["", error.traceback.rstrip()]
        if error.fault:
            parts.append("<p class='section'>Fault report <span class='muted'>(faulthandler: where each "
                         f"thread was when the process died)</span></p>{_code(error.fault)}")
            text += ["", "Fault report:", error.fault.rstrip()]
        drawn, node = (self._drawn_at(error) if call is None else (None, None))
        if drawn is not None:
            where_html, where_text = self._drawn_text(error.failed_op, drawn)
            parts.insert(3 if error.line else 2, f"<p>{where_html}</p>")
            text.insert(3 if error.line else 2, where_text)
            call = drawn
        line = error.line if error.line else (call.line if call is not None else None)
        located = _where(line, call, self._cells)
        if error.where:  # a notebook: "cell 4, line 2"
            located = " · ".join([error.where] + ([f"call #{call.index}"] if call is not None else []))
        return Problem("error", summary, "".join(parts), line, call.id if call else None, node, located,
                       "\n".join(text))

    def _drawn_at(self, error: ErrorInfo) -> tuple[CallInfo | None, str | None]:
        """The graph the op ``error`` was raised in is drawn on, and the node of its first input
        there: (None, None) when the error has no failed op or the listed trace has not that graph."""
        op = error.failed_op or {}
        drawn = next((c for c in self._calls if op.get("call") and c.id == op["call"]), None)
        held = failed_op(drawn)
        if held is None or held.get("text") != op.get("text"):
            return None, None
        node = next((e["node"] for e in held.get("inputs") or () if e.get("node") and drawn.node(e["node"])), None)
        return drawn, node

    @staticmethod
    def _drawn_text(op: dict, call: CallInfo) -> tuple[str, str]:
        """``Drawn on graph #1 at x``, as HTML (names link to their nodes) and as plain text."""
        seen, links, names = set(), [], []
        for entry in op.get("inputs") or ():
            nid, name = entry.get("node"), entry.get("name") or f"input {entry.get('position', 0)}"
            if nid and nid not in seen and call.node(nid) is not None:
                seen.add(nid)
                names.append(name)
                links.append(f"<a href='node:{html.escape(nid)}'>{html.escape(cut_line(name))}</a>")
        head = f"Drawn on graph #{call.index}"
        if not names:
            return f"{head}, above the graph the script had built.", f"{head}, above the graph the script had built."
        return (f"{head} at {_and(links)} <span class='muted'>(Enter or double-click opens it)</span>",
                f"{head} at {_and(names)}")

    def _stale_problem(self, call: CallInfo, node: NodeInfo) -> Problem:
        stale = node.stale
        label = f" for {node.label}" if node.label else ""
        summary = (f"{node.name}{label}: saved '{stale.saved}' changed in place "
                   f"(version {stale.saved_version} → {stale.version})")
        node_link = f"<a href='node:{html.escape(node.id)}'>{html.escape(node.name)}</a>"
        details = (f"<p class='title'>Stale saved tensor</p><p>{node_link}{html.escape(label)} "
                   f"{stale_sentence(stale, self._cells)}</p>")
        if node.line:
            details += (f"<p>The node was created at <a href='line:{node.line}'>"
                        f"{html.escape(line_where(self._cells, node.line))}</a>.</p>")
        line = stale.op_line or node.line
        return Problem("warning", summary, details, line, call.id, node.id, _where(line, call, self._cells),
                       f"{summary}\n{node.name}{label} {_plain(stale_sentence(stale, self._cells))}")

    def _nonfinite_problems(self, trace: Trace) -> list[Problem]:
        """The NaN/Inf check's findings (``Trace.nan_check``): the first op whose output was not
        finite, the first backward node whose gradient was not; each selects its node."""
        found = []
        calls = {c.id: c for c in trace.calls}
        for kind, heading, words in (("forward", "First non-finite value", forward_text),
                                     ("backward", "First non-finite gradient", backward_text)):
            record = (trace.nan_check or {}).get(kind)
            if record is None:
                continue
            summary = f"{heading.lower()}: {words(record)}"
            call = calls.get(record.get("call"))
            node = call.node(record["node"]) if call is not None and record.get("node") else None
            details = (f"<p class='title'>{html.escape(heading)} <a class='muted' href='copy:'>Copy</a></p>"
                       f"<p>{html.escape(words(record))}</p>")
            if node is not None:
                details += (f"<p>Its node on graph #{call.index}: <a href='node:{html.escape(node.id)}'>"
                            f"{html.escape(node.name)}</a> <span class='muted'>(Enter or double-click opens "
                            f"it)</span></p>")
            line = record.get("line")
            if line:
                details += (f"<p>at <a href='line:{line}'>{html.escape(line_where(self._cells, line))}</a></p>")
            found.append(Problem("warning", summary, details, line, call.id if call is not None else None,
                                 node.id if node is not None else None, _where(line, call, self._cells),
                                 f"{heading}: {words(record)}"))
        return found

    def show_selection(self, node_id: str | None) -> None:
        """Mark the problem about ``node_id`` (the app's selection), if one is listed; emits nothing."""
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            problem = self._problem_for(item)
            if node_id and problem is not None and problem.node == node_id:
                self.tree.setCurrentItem(item)
                return

    # events

    def _on_current(self, item: QTreeWidgetItem | None, _previous) -> None:
        self._show_details(self._problem_for(item))

    def _on_activated(self, item: QTreeWidgetItem, _column: int) -> None:
        problem = self._problem_for(item)
        if problem is None:
            return
        if problem.call is not None:
            self.sig_call_selected.emit(problem.call)
        if problem.node is not None:
            self.sig_node_selected.emit(problem.node)
        if problem.line is not None:
            self.sig_line_activated.emit(problem.line)

    def _on_anchor(self, url: QUrl) -> None:
        scheme, _, value = url.toString().partition(":")
        current = self._problem_for(self.tree.currentItem())
        if scheme == "copy":
            self.copy_current()
        elif scheme == "line" and value.isdigit():
            self.sig_line_activated.emit(int(value))
        elif scheme == "node":
            if current is not None and current.call is not None:
                self.sig_call_selected.emit(current.call)
            self.sig_node_selected.emit(value)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self._show_details(self._problem_for(self.tree.currentItem()))
        super().changeEvent(event)

    def _show_details(self, problem: Problem | None) -> None:
        pal = self.palette()
        text, base = pal.color(QPalette.ColorRole.Text), pal.color(QPalette.ColorRole.Base)
        muted = QColor.fromRgbF(*((t + b) / 2 for t, b in zip(text.getRgbF()[:3], base.getRgbF()[:3])))
        code_bg = QColor.fromRgbF(*(b * 0.94 + t * 0.06 for t, b in zip(text.getRgbF()[:3], base.getRgbF()[:3])))
        self.details.document().setDefaultStyleSheet(f"""
            body {{ color: {text.name()}; }}
            a {{ color: {pal.color(QPalette.ColorRole.Link).name()}; text-decoration: none; }}
            .title {{ font-size: large; font-weight: 600; }}
            .section {{ font-weight: 600; margin-top: 10px; }}
            .muted {{ color: {muted.name()}; font-weight: normal; }}
            pre, code {{ font-family: '{self._mono}', monospace; }}
            pre {{ white-space: pre-wrap; margin: 0px; }}
            .code {{ background-color: {code_bg.name()}; }}
        """)
        if problem is None:
            body = ("<p class='muted'>No problems: the script ran and every saved tensor was intact.</p>"
                    if self.tree.topLevelItemCount() == 0 else "<p class='muted'>Select a problem.</p>")
        else:
            body = problem.details
        self.details.setHtml(f"<html><body>{body}</body></html>")


def _code(text: str) -> str:
    return (f"<table class='code' width='100%' cellspacing='0' cellpadding='6'><tr><td>"
            f"<pre>{html.escape(cut_text(text.rstrip()))}</pre></td></tr></table>")


def _and(names: list[str]) -> str:
    """``x``; ``h and w``; ``a, b and c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _first_line(text: str) -> str:
    """The first non-blank line of ``text``, found without splitting the whole of it."""
    start = len(text) - len(text.lstrip())
    end = text.find("\n", start)
    head = text[start:end if end >= 0 else len(text)].strip()
    return head.splitlines()[0] if head else ""


def _plain(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment.replace("<br>", "\n")))


def _same_error(a: ErrorInfo, b: ErrorInfo) -> bool:
    return a.type == b.type and a.message == b.message


def _where(line: int | None, call: CallInfo | None, cells: list[dict] | None = None) -> str:
    parts = []
    if line:
        parts.append(line_where(cells or [], line))
    if call is not None:
        parts.append(f"call #{call.index}")
    return " · ".join(parts)
