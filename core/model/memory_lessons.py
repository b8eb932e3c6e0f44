"""What a run's memory teaches, from the trace alone: graphs a list keeps alive, checkpointing's saving.

``kept_graphs`` finds the graphs a script keeps in a list (``losses.append(loss)``): the roots of
its never-backwarded graphs (the "unreached" call) named ``losses[0]``, ``losses[1]``, ..., and,
for lists of graph nodes (``grad_fns.append(loss.grad_fn)``, which names no tensor), the list the
memory samples name in ``kept_in``. Each is told with the line that fills the list, found in the
script's source. ``checkpoint_saving`` pairs a call made with reentrant ``torch.utils.checkpoint``
with one of the same parameters made without it: the most each saved at once.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass

from core.model.memory import format_bytes, held_by_nodes, tensor_bytes
from core.model.trace import CallInfo, MemorySample, Trace

_ITEM = re.compile(r"^([A-Za-z_][A-Za-z_0-9.]*)\[\d+\]$")
CHECKPOINT_NODE = "CheckpointFunctionBackward"


@dataclass(frozen=True)
class KeptGraphs:
    """Graphs one list keeps alive after the script ended."""

    keeper: str  # the list's name: "losses"
    code: str  # the statement that fills it, without its comment: "losses.append(loss)"
    line: int | None  # that statement's script line
    graphs: int | None  # how many graphs it holds; None for a list of graph nodes (samples only)
    nbytes: int  # saved bytes only these graphs hold (not parameters, inputs or other graphs)
    call: str | None = None  # the "unreached" call holding them
    nodes: frozenset = frozenset()  # their node ids in that call


def keeping_line(source: str, name: str) -> tuple[int | None, str]:
    """(line, statement) of the first line of ``source`` that stores into the list ``name``:
    ``name.append(...)``, ``.extend``, ``.insert``, ``name += ...`` or ``name[i] = ...``."""
    store = re.compile(rf"(?<![\w.]){re.escape(name)}\s*(\.(append|extend|insert)\s*\(|\+=|\[[^\]]*\]\s*=(?!=))")
    for number, text in enumerate(source.splitlines(), 1):
        if store.search(text) and not text.lstrip().startswith("#"):
            return number, _without_comment(text)
    return None, ""


def _without_comment(text: str) -> str:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return text.strip()
    comment = next((t for t in tokens if t.type == tokenize.COMMENT), None)
    stripped = text.strip()
    return stripped[:comment.start[1]].rstrip() if comment is not None else stripped


def _reachable(call: CallInfo, starts: list[str]) -> set[str]:
    nodes, stack = set(), list(starts)
    node_map = call.node_map()
    while stack:
        node_id = stack.pop()
        if node_id in nodes or node_id not in node_map:
            continue
        nodes.add(node_id)
        stack.extend(e.node for e in node_map[node_id].next if e is not None)
    return nodes


def _own_saved_bytes(call: CallInfo, nodes: set[str]) -> int:
    """Bytes of the distinct storages the ``nodes`` save, leaving out the script's leaves and the
    tensors it names by a plain variable (parameters, inputs): the memory the graphs alone keep."""
    tensors = call.tensor_map()
    shared = {t.storage or t.id for t in call.tensors if t.is_leaf or (t.name and not _ITEM.match(t.name))}
    storages: dict[str, int] = {}
    for node in call.nodes:
        if node.id not in nodes:
            continue
        for saved in node.saved:
            t = tensors.get(saved.tensor) if saved.tensor else None
            if t is None or saved.freed or (t.storage or t.id) in shared:
                continue
            storages[t.storage or t.id] = tensor_bytes(t)
    return sum(storages.values())


def kept_graphs(trace: Trace) -> list[KeptGraphs]:
    """The lists that keep graphs alive at the script's end, the biggest first."""
    found: dict[str, KeptGraphs] = {}
    for call in trace.calls:
        if call.api != "unreached":
            continue
        node_map = call.node_map()
        by_list: dict[str, list[str]] = {}
        for root in call.roots:
            node = node_map.get(root)
            match = _ITEM.match(node.label or "") if node is not None else None
            if match:
                by_list.setdefault(match.group(1), []).append(root)
        for name, roots in by_list.items():
            if len(roots) < 2:
                continue  # one graph in a list is no loop keeping one per pass
            line, code = keeping_line(trace.source, name)
            if line is None:
                continue  # a list built whole (losses = [a, b]) is no loop keeping a graph per pass
            nodes = _reachable(call, roots)
            found[name] = KeptGraphs(name, code, line, len(roots), _own_saved_bytes(call, nodes), call.id,
                                     frozenset(nodes))
    last = _last_kept(trace.memory)
    if last is not None and last.kept_in not in found:
        line, code = keeping_line(trace.source, last.kept_in)
        if line is not None:
            found[last.kept_in] = KeptGraphs(last.kept_in, code, line, None, last.kept_bytes)
    return sorted(found.values(), key=lambda k: (-k.nbytes, k.keeper))


def _last_kept(samples: list[MemorySample]) -> MemorySample | None:
    for sample in reversed(samples):
        if sample.kept_in:
            return sample if sample.kept_bytes > 0 else None
    return None


def leak_summary(kept: KeptGraphs, where: str) -> str:
    """``graph kept alive by `losses.append(loss)` (line 29): 20 graphs, 10.0 MB``."""
    count = f"{kept.graphs} graphs, " if kept.graphs is not None else ""
    return f"graph kept alive by `{kept.code}` ({where}): {count}{format_bytes(kept.nbytes)}"


# -- checkpointing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointSaving:
    """A checkpointed call beside a call of the same parameters without checkpointing."""

    with_call: CallInfo
    without_call: CallInfo
    with_bytes: int  # the most saved at once: from forward, or while backward recomputes a block
    without_bytes: int  # held from forward when the plain call's backward began
    kept_bytes: int  # of with_bytes, held from forward (each checkpointed block's input)
    recompute_bytes: int  # of with_bytes, saved by the biggest block while backward recomputes it

    def text(self) -> str:
        return (f"with checkpointing: peak saved {format_bytes(self.with_bytes)}; "
                f"without: {format_bytes(self.without_bytes)}")

    def details(self) -> str:
        return (f"call #{self.with_call.index} keeps {format_bytes(self.kept_bytes)} from forward (each block's "
                f"input); recomputing a block in backward saves up to {format_bytes(self.recompute_bytes)} more; "
                f"call #{self.without_call.index}, the same model without checkpointing, keeps every activation")


def _parameters(call: CallInfo) -> frozenset[str]:
    tensors = call.tensor_map()
    names = set()
    for node in call.nodes:
        t = tensors.get(node.variable) if node.variable else None
        if t is not None and t.name:
            names.add(t.name)
    return frozenset(names)


def saved_at_start(samples: list[MemorySample], index: int) -> int | None:
    """Saved bytes when call ``index``'s backward began (the sample marking its start): all its
    forward held. None without such a sample (a run without memory samples)."""
    return next((s.saved_bytes for s in samples if s.call == index), None)


def checkpoint_saving(trace: Trace) -> list[CheckpointSaving]:
    """Each reentrant-checkpointed call with a plain call of the same parameters (the same model
    without checkpointing). Non-reentrant checkpointing keeps its inputs outside the graph's
    saved tensors, where the saved bytes do not see them, so it is not compared."""

    by_index = {c.index: c for c in trace.calls}
    calls = [c for c in trace.calls if c.api != "unreached" and c.nodes and "nested_in" not in c.options]
    out = []
    for call in calls:
        if not any(n.name == CHECKPOINT_NODE for n in call.nodes):
            continue
        nested = [by_index[i] for i in call.options.get("nested", ()) if i in by_index and by_index[i].nodes]
        params = _parameters(call).union(*(_parameters(n) for n in nested))  # the blocks' are the nested calls'
        plain = next((c for c in calls if c is not call and params and _parameters(c) == params
                      and not any(n.name == CHECKPOINT_NODE or n.recomputed for n in c.nodes)), None)
        kept, without = saved_at_start(trace.memory, call.index), None
        if plain is not None:
            without = saved_at_start(trace.memory, plain.index)
        if plain is None or kept is None or without is None:
            continue
        # While backward recomputes a block, the outer graph still holds what its nodes not yet run
        # saved (the sample at the nested call's start), and the recomputed block saves its own.
        peak, recompute = kept, 0
        for inner in nested:
            held = held_by_nodes(inner)[1]
            at = saved_at_start(trace.memory, inner.index)
            peak = max(peak, (kept if at is None else at) + held)
            recompute = max(recompute, held)
        out.append(CheckpointSaving(call, plain, peak, without, kept, recompute))
    return out
