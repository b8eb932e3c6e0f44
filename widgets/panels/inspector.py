"""The inspector: everything the trace holds about one node or one tensor, as linked HTML.

Links use the schemes ``node:<id>``, ``tensor:<id>`` and ``line:<n>``; clicking one emits a
signal and leaves navigation to whoever owns the shared selection.
"""

from __future__ import annotations

import html
import logging
import math
import re
from collections.abc import Mapping

from PySide6.QtCore import QEvent, QUrl, Signal
from PySide6.QtGui import QColor, QFontDatabase, QPalette
from PySide6.QtWidgets import QTextBrowser, QVBoxLayout, QWidget

from core.model.attrs import decoded_text, script_names
from core.model.causes import cut_text, grad_none_cause, hook_tips
from core.model.edge_marks import edge_mark_tip, mark_text
from core.model.formulas import formula_for, formula_lines
from core.model.forward_errors import failed_op, short_reason
from core.model.grad_notes import RESULT_TIP, note_tip, notes_for, returned
from core.model.memory import format_bytes
from core.programs.notebook import where as line_where
from core.model.storage_map import contiguity as is_contiguous
from core.model.trace import CallInfo, NodeInfo, Stale, TensorInfo, Values
from core.model.values import dims_text, format_shape
from widgets.display_text import cut_line, cut_markup
from widgets.display_text import cut_text as cut_lines
from widgets.panels.calls import call_head

log = logging.getLogger(__name__)

LIST_LIMIT = 100  # a node's inputs, consumers, saved values or formula lines listed; the rest counted

KIND_WORDS = {
    "backward": "backward function: turns the gradient of its output into gradients of its inputs",
    "accumulate_grad": "AccumulateGrad: adds the incoming gradient into a leaf tensor's .grad",
    "custom": "custom autograd.Function written in Python",
    "other": "autograd node",
}
LINE_WIDTH = 72


# -- values as text ------------------------------------------------------------------------


def format_number(value, dtype: str = "float32") -> str:
    """One element as torch would show it: ints plainly, floats with up to 4 decimals."""
    dtype = dtype.removeprefix("torch.")
    if isinstance(value, bool) or dtype == "bool":
        return str(bool(value))
    if isinstance(value, int) and not dtype.startswith(("float", "bfloat", "complex")):
        return str(value)
    if isinstance(value, (list, tuple)) and len(value) == 2:  # complex as [re, im]
        return f"{format_number(value[0])}{'+' if value[1] >= 0 else '-'}{format_number(abs(value[1]))}j"
    if not isinstance(value, (int, float)):
        return str(value)
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v == 0 or 1e-4 <= abs(v) < 1e8:
        text = f"{v:.4f}".rstrip("0")
        return text + "0" if text.endswith(".") else text
    mantissa, exponent = f"{v:.4e}".split("e")
    mantissa = mantissa.rstrip("0")
    mantissa = mantissa + "0" if mantissa.endswith(".") else mantissa
    return f"{mantissa}e{exponent}"


def _join_row(cells: list[str], indent: int) -> str:
    """Join one innermost row, wrapping it at LINE_WIDTH like torch's linewidth."""
    lines, line = [], ""
    for i, cell in enumerate(cells):
        piece = cell + ("," if i < len(cells) - 1 else "")
        if line and len(line) + 1 + len(piece) + indent > LINE_WIDTH:
            lines.append(line)
            line = piece
        else:
            line = f"{line} {piece}" if line else piece
    lines.append(line)
    return ("\n" + " " * indent).join(lines)


def format_tensor(data: list, shape: list[int], dtype: str = "float32") -> str:
    """Nested rows by shape, columns aligned, e.g. ``[[1.0, 2.0],\\n [3.0, 4.0]]``."""
    if not shape:
        return format_number(data[0], dtype) if data else "[]"
    if math.prod(shape) != len(data) or 0 in shape:
        shape = [len(data)]
    cells = [format_number(v, dtype) for v in data]
    width = max((len(c) for c in cells), default=0)
    cells = [c.rjust(width) for c in cells]

    def block(start: int, dims: list[int], depth: int) -> str:
        if len(dims) == 1:
            return "[" + _join_row(cells[start:start + dims[0]], depth + 1) + "]"
        step = math.prod(dims[1:])
        sep = "," + "\n" * (len(dims) - 1) + " " * (depth + 1)
        parts = [block(start + i * step, dims[1:], depth + 1) for i in range(dims[0])]
        return "[" + sep.join(parts) + "]"

    return block(0, list(shape), 0)


def format_values(values: Values, shape: list[int], dtype: str = "float32") -> str:
    """Full values for small tensors; a sample and min/max/mean for big ones."""
    if values.data is not None:
        return format_tensor(values.data, shape, dtype)
    lines = []
    if values.sample:
        sample = ", ".join(format_number(v, dtype) for v in values.sample)
        lines.append(f"first {len(values.sample)} of {values.numel:,}: [{sample}, …]")
    else:
        lines.append(f"{values.numel:,} elements (values not captured)")
    stats = [(k, getattr(values, k)) for k in ("min", "max", "mean")]
    mark = "\u2248 " if values.approx else ""  # from a strided sample: approximately
    stats_text = "   ".join(f"{k} {mark}{format_number(v)}" for k, v in stats if v is not None)
    if stats_text:
        lines.append(stats_text + ("   (from a sample)" if values.approx else ""))
    return "\n".join(lines)


def stale_sentence(stale: Stale, cells: list[dict] | None = None) -> str:
    """The stale saved-tensor report in plain words; ``cells``: a notebook's, for "cell 3, line 3"."""
    text = (
        f"saved <code>{html.escape(stale.saved)}</code> at version {stale.saved_version}, "
        f"now at version {stale.version}: backward will fail here because the tensor was "
        "modified in place after this node saved it"
    )
    if stale.op_line:
        text += (f" (in-place change at <a href='line:{stale.op_line}'>"
                 f"{html.escape(line_where(cells or [], stale.op_line))}</a>)")
    text += ". Use an out-of-place op (x = x + 1 instead of x += 1) or .clone() before modifying."
    if stale.message:
        text += f"<br><span class='muted'>{html.escape(stale.message)}</span>"
    return text


def _mix(a: QColor, b: QColor, t: float) -> str:
    r = a.redF() * (1 - t) + b.redF() * t
    g = a.greenF() * (1 - t) + b.greenF() * t
    bl = a.blueF() * (1 - t) + b.blueF() * t
    return QColor.fromRgbF(r, g, bl).name()


# -- the panel -----------------------------------------------------------------------------



_WORD_START = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[._])(?=[^._])")


def breakable(name: str) -> str:
    """``name`` escaped for rich text, with line-break chances between its words only:
    "BinaryCrossEntropyWithLogitsBackward0" wraps after "Logits", never inside "Backward0"."""
    return "\u200b".join(html.escape(part) for part in _WORD_START.split(name))


WHOLE_GROUP = 16  # a bracketed group up to this many characters moves to the next line whole


def breakable_formula(line: str) -> str:
    """``line`` with a narrow panel allowed to break it only at a space outside short brackets
    that does not join a name to its ``(a)``: the other spaces become no-break spaces, so
    ``(1 − result)`` and ``grad_self (a)`` move to the next line whole instead of being split.
    A longer bracketed group (``(expand to self_sym_sizes)``) may break at its own spaces: kept
    whole, it would not fit a narrow panel and be cut in the middle of a word."""
    length: dict[int, int] = {}  # each opening bracket's position: its group's length
    opened: list[int] = []
    for i, ch in enumerate(line):
        if ch in "([{":
            opened.append(i)
        elif ch in ")]}" and opened:
            start = opened.pop()
            length[start] = i - start + 1
    out, whole = [], []  # whole: for each open group, whether it is kept on one line
    for i, ch in enumerate(line):
        if ch in "([{":
            whole.append(length.get(i, len(line) - i) <= WHOLE_GROUP)
        elif ch in ")]}":
            if whole:
                whole.pop()
        elif ch == " " and (any(whole) or (line[i + 1:i + 2] in ("(", "[") and length.get(i + 1, 0) <= WHOLE_GROUP
                                           and 0 < i and (line[i - 1].isalnum() or line[i - 1] == "_"))):
            ch = "\u00a0"
        out.append(ch)
    return "".join(out)


class InspectorPanel(QWidget):
    """Shows one node or tensor of a call; names of other nodes and tensors are links."""

    sig_node_selected = Signal(str)
    """A node link was clicked; carries the node id."""
    sig_tensor_selected = Signal(str)
    """A tensor link was clicked; carries the tensor id."""
    sig_line_selected = Signal(int)
    """A script line link was clicked; carries the 1-based line number."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.cells: list[dict] = []  # a notebook's cells: lines read "cell 4, line 2"
        self.browser = QTextBrowser(self)
        self.browser.setOpenLinks(False)
        self.browser.setOpenExternalLinks(False)
        self.browser.anchorClicked.connect(self._on_anchor)
        self.browser.document().setDocumentMargin(8)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.browser)
        self._show: tuple | None = None
        self._mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
        self.clear()

    # public API

    def clear(self) -> None:
        """Show the empty state."""
        self._show = None
        self._render("<p class='muted'>Select a node or a tensor in the graph to inspect it.</p>")

    def show_node(self, call: CallInfo, node_id: str) -> None:
        """Show a node of ``call``: its kind, origin, next functions, saved values and staleness."""
        self._show = ("node", call, node_id, None)
        node = call.node(node_id)
        if node is None:
            self._render(f"<p class='muted'>Node {html.escape(node_id)} is not in call #{call.index}.</p>")
            return
        self._render(self._node_html(call, node))

    def show_tensor(self, tensors: Mapping[str, TensorInfo] | CallInfo, tensor_id: str,
                    shown: CallInfo | None = None) -> None:
        """Show a tensor: metadata, memory layout, values and grad. ``tensors`` maps id -> info (or
        is a call); ``shown``: the call whose graph is on screen, which a table's tensor is told against."""
        self._show = ("tensor", tensors, tensor_id, shown)
        call = tensors if isinstance(tensors, CallInfo) else None
        table = call.tensor_map() if call is not None else tensors
        tensor = table.get(tensor_id)
        if tensor is None:
            self._render(f"<p class='muted'>Tensor {html.escape(tensor_id)} was not captured.</p>")
            return
        if call is None and shown is not None and shown.tensor(tensor_id) is tensor:
            call = shown  # the table holds the shown call's own tensors
        self._render(self._tensor_html(table, call, tensor, shown))

    def text(self) -> str:
        """The shown content as plain text (without the invisible line-break chances in long names)."""
        return self.browser.toPlainText().replace("\u200b", "")

    # events

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange and self._show is not None:
            kind, source, item, shown = self._show
            if kind == "node":
                self.show_node(source, item)
            else:
                self.show_tensor(source, item, shown)
        elif event.type() == QEvent.Type.PaletteChange:
            self.clear()
        super().changeEvent(event)

    def _on_anchor(self, url: QUrl) -> None:
        scheme, _, value = url.toString().partition(":")
        log.debug("inspector link %s", url.toString())
        if scheme == "node":
            self.sig_node_selected.emit(value)
        elif scheme == "tensor":
            self.sig_tensor_selected.emit(value)
        elif scheme == "line" and value.isdigit():
            self.sig_line_selected.emit(int(value))

    # html

    def _render(self, body: str) -> None:
        pal = self.palette()
        text, base = pal.color(QPalette.ColorRole.Text), pal.color(QPalette.ColorRole.Base)
        link = pal.color(QPalette.ColorRole.Link)
        amber = QColor("#e0a000")
        size = self.font().pointSizeF()
        css = f"""
            body {{ color: {text.name()}; }}
            a {{ color: {link.name()}; text-decoration: none; }}
            .title {{ font-size: {size * 1.45:.1f}pt; font-weight: 600; margin-bottom: 2px; }}
            .muted {{ color: {_mix(text, base, 0.45)}; }}
            .hint {{ color: {_mix(text, base, 0.45)}; font-size: {size * 0.88:.1f}pt; }}
            .key {{ color: {_mix(text, base, 0.45)}; }}
            .section {{ font-weight: 600; margin-top: 14px; margin-bottom: 0px; }}
            .mono, code, pre {{ font-family: '{self._mono}', monospace; }}
            pre {{ margin: 0px; }}
            .code {{ background-color: {_mix(base, text, 0.06)}; }}
            .warn {{ background-color: {_mix(base, amber, 0.22)}; }}
            .badge {{ background-color: {_mix(base, link, 0.18)}; }}
            .failed {{ background-color: {_mix(base, QColor("#d32f2f"), 0.16)}; }}
        """
        self.browser.document().setDefaultStyleSheet(css)
        self.browser.setHtml(f"<html><body>{cut_markup(body)}</body></html>")

    @staticmethod
    def _rows(rows: list[tuple[str, str]]) -> str:
        cells = "".join(
            f"<tr><td class='key' valign='top' style='padding-right: 12px'>{html.escape(k)}</td><td>{v}</td></tr>"
            for k, v in rows
        )
        return f"<table cellspacing='0' cellpadding='2' style='margin-top: 4px'>{cells}</table>"

    @staticmethod
    def _code(text: str, wrap: bool = False) -> str:
        """``text`` in a code box; ``wrap``: long lines break at spaces (formulas) instead of
        widening the panel (a tensor's rows keep their columns aligned)."""
        style = " style='white-space: pre-wrap'" if wrap else ""
        return (f"<table class='code' width='100%' cellspacing='0' cellpadding='6' style='margin-top: 4px'>"
                f"<tr><td><pre{style}>{html.escape(text)}</pre></td></tr></table>")

    @staticmethod
    def _section(title: str, hint: str = "") -> str:
        hint_html = f"<br><span class='hint' style='font-weight: normal'>{html.escape(hint)}</span>" if hint else ""
        return f"<p class='section'>{html.escape(title)}{hint_html}</p>"

    @staticmethod
    def _tensor_link(call: CallInfo | None, table: Mapping[str, TensorInfo] | None, tid: str | None) -> str:
        if tid is None:
            return "<span class='muted'>None</span>"
        t = (table or {}).get(tid) or (call.tensor(tid) if call else None)
        if t is None:
            return f"<a href='tensor:{html.escape(tid)}'>{html.escape(tid)}</a>"
        name = html.escape(cut_line(t.name or (f"output of {t.grad_fn_name}" if t.grad_fn_name else tid)))
        return (f"<a href='tensor:{html.escape(tid)}'><b>{name}</b></a> "
                f"<span class='muted'>{format_shape(t.shape)} {html.escape(t.dtype)}</span>")

    @staticmethod
    def _node_link(call: CallInfo, nid: str) -> str:
        node = call.node(nid)
        if node is None:
            return html.escape(nid)
        label = node.label
        if label is None and node.variable is not None:
            var = call.tensor(node.variable)
            label = var.name if var is not None else None
        extra = f" <span class='muted'>({html.escape(cut_line(label))})</span>" if label else ""
        return f"<a href='node:{html.escape(nid)}'>{html.escape(node.name)}</a>{extra}"

    def _grad_fn_elsewhere(self, call: CallInfo | None, t: TensorInfo) -> str:
        """The grad_fn of a tensor whose node id is not in its table: the shown call's node that made
        the tensor of that name, when there is one; else the node's name and where it is not."""
        name = html.escape(t.grad_fn_name or "")
        if call is None:
            return name
        made = next((c for c in call.tensors if t.name and c.name == t.name and c.grad_fn), None)
        node = call.node(made.grad_fn) if made is not None else None
        if node is not None and node.name == t.grad_fn_name:
            return self._node_link(call, node.id) + f" <span class='muted'>· in call #{call.index}</span>"
        return f"{name} <span class='muted'>(not in call #{call.index}'s graph)</span>"

    def _node_html(self, call: CallInfo, node: NodeInfo) -> str:
        subtitle = [f"<span class='badge'>&nbsp;{html.escape(node.kind)}&nbsp;</span>"]
        if node.label and node.kind == "accumulate_grad":
            subtitle.append(f"accumulates into <code>{html.escape(cut_line(node.label))}.grad</code>")
        elif node.label:
            subtitle.append(f"creates <code>{html.escape(cut_line(node.label))}</code>")
        if node.line:
            subtitle.append(html.escape(line_where(self.cells, node.line)))
        parts = [f"<p class='title'>{breakable(cut_line(node.name))}</p><p>{' · '.join(subtitle)}</p>"]
        if node.stale is not None:
            parts.append(f"<table class='warn' width='100%' cellpadding='6'><tr><td>"
                         f"<b>⚠ Stale saved tensor</b><br>{stale_sentence(node.stale, self.cells)}</td></tr></table>")
        parts.append(self._failed_html(call, node))
        rows = [("kind", html.escape(KIND_WORDS.get(node.kind, node.kind)))]
        if node.label:
            rows.append(("label", f"<code>{html.escape(cut_line(node.label))}</code> (the script's name)"))
        if node.tensor:
            rows.append(("grad_fn of", self._tensor_link(call, None, node.tensor)))
        if node.line:
            where = html.escape(line_where(self.cells, node.line))
            rows.append(("script line", f"<a href='line:{node.line}'>{where}</a>"))
        if node.module:
            rows.append(("module", f"<code>{html.escape(cut_line(node.module))}</code>"))
        title = call.title
        if failed_op(call) is not None:
            title = f"{call_head(call)} ({self._op_where(failed_op(call)) or 'no line'})"
        elif self.cells:  # a notebook: the call's line as "cell 4, line 2"
            title = f"#{call.index} {call.api} ({line_where(self.cells, call.line) or 'no line'})"
        rows.append(("call", html.escape(title)))
        rows.append(("id", f"<code>{html.escape(node.id)}</code>"))
        parts.append(self._rows(rows))

        grads = notes_for(call, node.id)
        if grads:
            parts.append(self._section("Gradient after this call", note_tip(call, node.id)))
            parts.append(self._code("\n".join(cut_line(line, 1_000) for line in grads[:LIST_LIMIT]), wrap=True))

        notes = hook_tips(call, node)
        if notes:
            parts.append(self._section("Hooks and checkpointing"))
            parts.append("<p style='margin-top: 4px'>" + "<br>".join(html.escape(n) for n in notes) + "</p>")
        for mark in node.edge_marks or ():
            parts.append(f"<p class='hint'>input {mark['input']}: {html.escape(mark_text(mark))} · "
                         f"{html.escape(edge_mark_tip(mark))}</p>")

        if node.kind == "accumulate_grad" or node.variable:
            parts.append(self._section("Variable", "the leaf whose .grad this node accumulates into"))
            parts.append(self._rows([("variable", self._tensor_link(call, None, node.variable))]))

        lines = formula_lines(node.name, *script_names(call, node))
        if lines:
            formula = formula_for(node.name)
            parts.append(self._section("Local derivative", "what this node computes from the gradient it gets "
                                       "(grad) and what forward saved"))
            shown = [breakable_formula(cut_line(line, 1_000)) for line in lines[:LIST_LIMIT]]
            if len(lines) > LIST_LIMIT:
                shown.append(f"… {len(lines) - LIST_LIMIT:,} more lines")
            parts.append(self._code("\n".join(shown), wrap=True))
            if formula.note:
                parts.append(f"<p class='hint' style='margin-top: 2px'>{html.escape(formula.note)}</p>")

        parts.append(self._section("Next functions", "where the gradient flows next, one per input"))
        cuts = {c["input"]: c for c in node.cuts or ()}
        if node.next:
            rows = []
            for i, edge in enumerate(node.next[:LIST_LIMIT]):
                if edge is None:
                    cut = cuts.get(i)
                    why = html.escape(cut_text(cut)) if cut else "this input needs no gradient"
                    rows.append((f"input {i}", f"<span class='muted'>None: {why}</span>"))
                else:
                    slot = f" <span class='muted'>· input_nr {edge.input_nr}</span>" if edge.input_nr else ""
                    rows.append((f"input {i}", self._node_link(call, edge.node) + slot))
            if len(node.next) > LIST_LIMIT:
                rows.append(("", f"<span class='muted'>… {len(node.next) - LIST_LIMIT:,} more inputs</span>"))
            parts.append(self._rows(rows))
        else:
            parts.append("<p class='muted'>none: the gradient stops here</p>")

        parents = list(dict.fromkeys(call.consumers().get(node.id, [])))
        if parents:
            parts.append(self._section("Gradient comes from"))
            links = "<br>".join(self._node_link(call, p) for p in parents[:LIST_LIMIT])
            if len(parents) > LIST_LIMIT:
                links += f"<br><span class='muted'>… {len(parents) - LIST_LIMIT:,} more nodes</span>"
            parts.append(f"<p style='margin-top: 4px'>{links}</p>")

        if node.saved:
            parts.append(self._section("Saved for backward", "what forward kept so backward can run"))
            rows = []
            for saved in node.saved[:LIST_LIMIT]:
                if saved.freed:
                    value = ("<span class='muted'>freed: released by an earlier backward "
                             "(retain_graph=True keeps it)</span>")
                elif saved.tensor is not None:
                    value = self._tensor_link(call, None, saved.tensor)
                    value = "= " + value
                else:
                    value = f"= <code>{html.escape(decoded_text(saved.name, saved.value))}</code>"
                rows.append((saved.name, value))
            if len(node.saved) > LIST_LIMIT:
                rows.append(("", f"<span class='muted'>… {len(node.saved) - LIST_LIMIT:,} more saved values</span>"))
            parts.append(self._rows(rows))
        return "".join(parts)

    def _op_where(self, op: dict) -> str:
        """The failed op's line: "line 17", or "cell 5, line 2" in a notebook ("" without one)."""
        return op.get("where") or line_where(self.cells, op.get("line"))

    def _failed_html(self, call: CallInfo, node: NodeInfo) -> str:
        """"Failed here": the op the forward pass failed in, when ``node`` is one of its inputs'."""
        op = failed_op(call)
        inputs = (op or {}).get("inputs") or []
        if op is None or not any(entry.get("node") == node.id for entry in inputs):
            return ""
        text = op.get("text") or op.get("name") or "an op"
        box = (f"<table class='failed' width='100%' cellpadding='6'><tr><td><b>✖ {html.escape(cut_line(text))} "
               f"raised {html.escape(op.get('type', 'an error'))}</b><br>"
               f"{html.escape(cut_lines(op.get('message', '').strip()))}</td></tr></table>")
        rows = [("op", f"<code>{html.escape(cut_line(text))}</code>"),
                ("why", html.escape(short_reason(op.get("message", ""), op)))]
        where = self._op_where(op)
        if where and op.get("line"):
            rows.append(("script line", f"<a href='line:{op['line']}'>{html.escape(where)}</a>"))
        elif where:
            rows.append(("script line", html.escape(where)))
        for entry in inputs:
            rows.append((f"input {entry.get('position', 0)}", self._failed_input(call, node, entry)))
        return (self._section("Failed here", "the script stopped in forward at this op, called on this node's "
                              "tensor; backward never ran on this graph") + box + self._rows(rows)
                + "<p class='section'>This node</p>")

    def _failed_input(self, call: CallInfo, node: NodeInfo, entry: dict) -> str:
        """``x · shape 2 · float32 · requires_grad True · leaf True``; the name links to its node."""
        name = html.escape(cut_line(entry.get("name") or "unnamed tensor"))
        nid = entry.get("node")
        if nid == node.id:
            name = f"<b>{name}</b> <span class='muted'>(this node)</span>"
        elif nid and call.node(nid) is not None:
            name = f"<a href='node:{html.escape(nid)}'><b>{name}</b></a>"
        else:
            name = f"<b>{name}</b>"
        facts = [format_shape(entry.get("shape")) or "shape unknown", html.escape(entry.get("dtype", "")),
                 f"requires_grad <code>{bool(entry.get('requires_grad'))}</code>",
                 f"leaf <code>{bool(entry.get('is_leaf'))}</code>"]
        return " · ".join([name, *(f for f in facts if f)])

    def _tensor_html(self, table: Mapping[str, TensorInfo], call: CallInfo | None, t: TensorInfo,
                     shown: CallInfo | None = None) -> str:
        flags = ["leaf" if t.is_leaf else "non-leaf"]
        if t.requires_grad:
            flags.append("requires grad")
        if t.is_view:
            flags.append("view")
        if t.origin:
            flags.append("detached" if t.origin == "detach" else "made under no_grad")
        title = breakable(cut_line(t.name)) if t.name else "<span class='muted'>unnamed tensor</span>"
        parts = [f"<p class='title'>{title}</p>",
                 f"<p><span class='badge'>&nbsp;{html.escape(t.dtype)}&nbsp;</span> "
                 f"{format_shape(t.shape)} · {html.escape(t.device)} · {' · '.join(flags)}</p>"]
        if t.grad_fn:
            grad_fn = (self._node_link(call, t.grad_fn) if call is not None
                       else f"<a href='node:{html.escape(t.grad_fn)}'>{html.escape(t.grad_fn_name or t.grad_fn)}</a>")
        elif t.grad_fn_name:
            grad_fn = self._grad_fn_elsewhere(call or shown, t)
        else:
            grad_fn = "<span class='muted'>None</span>"
        mono = lambda v: f"<code>{html.escape(str(v))}</code>"  # noqa: E731
        hint = lambda v: f"<br><span class='hint'>{html.escape(v)}</span>"  # noqa: E731
        parts.append(self._rows([
            ("shape", mono(dims_text(t.shape) or "scalar (0-d)")), ("dtype", mono(t.dtype)), ("device", mono(t.device)),
            ("requires_grad", mono(t.requires_grad)), ("is_leaf", mono(t.is_leaf)),
            ("retains_grad", mono(t.retains_grad)), ("grad_fn", grad_fn), ("id", mono(t.id)),
        ]))

        parts.append(self._section("Memory layout"))
        stride = "(" + ", ".join(str(s) for s in t.stride) + ("," if len(t.stride) == 1 else "") + ")"
        storage = mono(t.storage) if t.storage else "<span class='muted'>not captured</span>"
        if call is not None and t.storage:
            info = next((s for s in call.storages if s.id == t.storage), None)
            if info is not None:
                others = [self._tensor_link(call, table, o) for o in info.tensors if o != t.id]
                storage += f" <span class='muted'>· {format_bytes(info.nbytes)}</span>"
                if others:
                    storage += "<br>shared with " + ", ".join(others)
        if t.is_view:
            base = self._tensor_link(call, table, t.base) if t.base else "<span class='muted'>base not captured</span>"
            view = f"yes, a view of {base}" + hint("shares its base's memory: writing to one changes the other")
        else:
            view = "no"
        contiguous = is_contiguous(t.shape, t.stride)
        parts.append(self._rows([
            ("stride", mono(stride) + hint("elements to skip in memory for one step along each dim")),
            ("contiguous", mono(contiguous) + ("" if contiguous else hint("elements are not in row-major "
                                                                           "order; .contiguous() copies"))),
            ("storage offset", mono(t.storage_offset)), ("storage", storage), ("is_view", view),
            ("version", mono(t.version) + hint("bumped by every in-place op on this memory")),
            ("element size", f"{t.element_size} bytes"), ("nbytes", format_bytes(t.nbytes)),
        ]))

        if t.hooks:
            parts.append(self._section("Hooks", "Tensor.register_hook: each runs on this tensor's gradient and "
                                       "may replace it"))
            parts.append(self._rows([(f"hook {i}", f"<code>{html.escape(h)}</code>") for i, h in enumerate(t.hooks)]))
        if t.origin:
            parts.append(f"<p class='hint'>{html.escape(grad_none_cause(t, call or shown))}</p>")

        parts.append(self._section("Value", f"{t.values.numel:,} element" + ("" if t.values.numel == 1 else "s")))
        parts.append(self._code(format_values(t.values, t.shape, t.dtype)))
        parts.append(self._section(".grad"))
        if t.grad is not None:
            parts.append(self._code(format_values(t.grad.values, t.grad.shape, t.dtype)))
        else:
            parts.append(f"<p style='margin-top: 4px'><code>None</code><br>"
                         f"<span class='muted'>{html.escape(grad_none_cause(t, call or shown))}</span></p>")
        result = returned(call, t.id) if call is not None and call.tensor(t.id) is t else None
        if result is not None:
            parts.append(self._section(f"Returned by autograd.grad (call #{call.index})", RESULT_TIP))
            parts.append(self._code(format_values(result[1], result[0], t.dtype)))
        return "".join(parts)

