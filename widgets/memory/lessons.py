"""The memory lessons of a run as the panels tell them: the leak problem, the peak's keeper, checkpointing.

Plain texts and HTML from ``core.model.memory_lessons``: the Problems panel lists a leak as one
problem (its stale saved tensors folded in), the memory chart blames a peak made of kept graphs
on the statement keeping them, and the memory panel states checkpointing's saving.
"""

from __future__ import annotations

import html
import re

from core.model.memory import format_bytes
from core.model.memory_lessons import KeptGraphs, checkpoint_saving, kept_graphs, leak_summary
from core.model.trace import Trace
from core.programs.notebook import where as line_where


def keeper_texts(trace: Trace, kept: list[KeptGraphs] | None = None) -> dict[str, str]:
    """List name -> "kept by losses.append(loss) · line 29": what the chart blames a peak on."""
    kept = kept_graphs(trace) if kept is None else kept
    return {k.keeper: f"kept by {k.code}" + (f" · {line_where(trace.cells, k.line)}" if k.line else "")
            for k in kept}


def folded_stale(kept: list[KeptGraphs]) -> set[tuple[str, str]]:
    """(call id, node id) of the kept graphs' nodes: their stale saved tensors are told in the leak
    problem, since no backward runs through them (a backward that does fail is reported apart)."""
    return {(k.call, node) for k in kept if k.call is not None for node in k.nodes}


def leak_problems(trace: Trace, kept: list[KeptGraphs] | None = None) -> list[dict]:
    """One problem per list keeping graphs alive: the fields of a Problems row."""
    kept = kept_graphs(trace) if kept is None else kept
    calls = {c.id: c for c in trace.calls}
    out = []
    for k in kept:
        where = line_where(trace.cells, k.line) if k.line else "line ?"
        summary = leak_summary(k, where)
        what = f"{k.graphs} graphs" if k.graphs is not None else "graphs"
        paragraphs = [
            f"<code>{html.escape(k.keeper)}</code> holds {what} that no backward ran through. Each one keeps "
            f"every tensor it saved for backward: {format_bytes(k.nbytes)} of saved activations (parameters "
            "and inputs not counted), more with every pass of the loop.",
            f"Keep a number instead: <code>{html.escape(k.keeper)}.append(loss.item())</code>, or a tensor "
            "cut off the graph with <code>loss.detach()</code>." if k.graphs is not None else
            "A graph node keeps its whole graph alive: keep what the loop needs from it (a number, "
            "<code>loss.item()</code>) instead of the node.",
        ]
        call = calls.get(k.call) if k.call else None
        stale = [n for n in call.nodes if n.id in k.nodes and n.stale is not None] if call is not None else []
        if stale:
            paragraphs.append(
                f"{len(stale)} of the tensors these graphs saved were changed in place since (an optimizer "
                "step updates the weights in place): a backward through them would now fail. That is one "
                "more reason not to keep them, not a separate problem.")
        if k.line:
            paragraphs.append(f"The list is filled at <a href='line:{k.line}'>{html.escape(where)}</a>.")
        details = "<p class='title'>Graphs kept alive</p>" + "".join(f"<p>{p}</p>" for p in paragraphs)
        text = "\n".join([summary] + [_plain(p) for p in paragraphs])
        out.append({"severity": "warning", "summary": summary, "details": details, "line": k.line,
                    "call": k.call, "node": None, "where": where, "text": text})
    return out


def checkpoint_notes(trace: Trace) -> list[str]:
    """"with checkpointing: peak saved 1.5 MB; without: 3.5 MB (calls #3 and #7)", one per pair."""
    return [f"{s.text()} (calls #{s.with_call.index} and #{s.without_call.index})" for s in checkpoint_saving(trace)]


def _plain(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))
