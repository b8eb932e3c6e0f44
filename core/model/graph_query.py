"""Questions about a call's graph, answered with networkx: what feeds a node, what its gradient
flows into, the paths from the loss to a leaf, and how two calls differ.

Edges run the way gradients do: from a node to its ``next_functions`` (loss to leaves).
"Downstream" (``descendants``) is where a node's gradient flows; "upstream" (``ancestors``)
is everything whose gradient reaches it, up to the loss.

Comparing two calls matches nodes by a structural key (op name, module path, the script's
name for the tensor, and the occurrence of that key in the call's preorder), so a net whose
depth changes per call shows the layers added or removed rather than a shifted mismatch.
"Same structure" is then verified with an isomorphism check on the op names, not taken
from a label.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from itertools import islice

import networkx as nx
from networkx.algorithms.isomorphism import DiGraphMatcher, categorical_node_match

from core.model.trace import CallInfo

_graphs: dict[int, tuple[weakref.ref, nx.MultiDiGraph]] = {}


def call_graph(call: CallInfo) -> nx.MultiDiGraph:
    """The call's nodes and edges (node -> next function, one edge per slot); cached per call."""
    hit = _graphs.get(id(call))
    if hit is not None and hit[0]() is call:
        return hit[1]
    g = nx.MultiDiGraph()
    for n in call.nodes:
        g.add_node(n.id, name=n.name)
    for n in call.nodes:
        for slot, e in enumerate(n.next):
            if e is not None:
                g.add_edge(n.id, e.node, key=slot, input_nr=e.input_nr)
    if len(_graphs) > 16:
        _graphs.clear()
    _graphs[id(call)] = (weakref.ref(call), g)
    return g


def descendants(call: CallInfo, node_id: str) -> set[str]:
    """Nodes the gradient of ``node_id`` flows into (towards the leaves), the node excluded."""
    return nx.descendants(call_graph(call), node_id)


def ancestors(call: CallInfo, node_id: str) -> set[str]:
    """Nodes whose gradient reaches ``node_id`` (towards the loss), the node excluded."""
    return nx.ancestors(call_graph(call), node_id)


def loss_to_leaf_paths(call: CallInfo, leaf_id: str, limit: int = 64) -> list[list[str]]:
    """Simple paths from each root (the loss) to ``leaf_id``, shortest first, at most ``limit``."""
    g = nx.DiGraph(call_graph(call))  # parallel edges (x * x) are one path here
    out: list[list[str]] = []
    for root in call.roots:
        if root not in g or leaf_id not in g:
            continue
        if root == leaf_id:
            out.append([root])
            continue
        try:
            out += islice(nx.shortest_simple_paths(g, root, leaf_id), limit - len(out))
        except nx.NetworkXNoPath:
            continue
        if len(out) >= limit:
            break
    return out


def path_edges(paths: list[list[str]]) -> set[tuple[str, str]]:
    """The (src, dst) pairs the paths run along."""
    return {(a, b) for p in paths for a, b in zip(p, p[1:])}


# -- comparing calls --------------------------------------------------------------------------


@dataclass(frozen=True)
class CallDiff:
    """How call ``b`` differs from call ``a``; ids are each call's own node ids."""

    same_structure: bool  # an isomorphism of the two graphs that keeps op names exists
    added_nodes: list[str] = field(default_factory=list)  # in b, not matched in a
    removed_nodes: list[str] = field(default_factory=list)  # in a, not matched in b
    added_edges: list[tuple[str, str]] = field(default_factory=list)  # b's ids
    removed_edges: list[tuple[str, str]] = field(default_factory=list)  # a's ids
    matched: dict[str, str] = field(default_factory=dict)  # a's id -> b's id

    def summary(self) -> str:
        if self.same_structure:
            return "same structure (verified node by node)"
        parts = []
        for n, what in ((len(self.added_nodes), "added"), (len(self.removed_nodes), "removed")):
            if n:
                parts.append(f"{n:,} node{'s' if n != 1 else ''} {what}")
        for n, what in ((len(self.added_edges), "added"), (len(self.removed_edges), "removed")):
            if n:
                parts.append(f"{n:,} edge{'s' if n != 1 else ''} {what}")
        return ", ".join(parts) or "same nodes and edges, different wiring"


def node_keys(call: CallInfo) -> dict[str, tuple]:
    """A key per node that names the same node in another call of the same code."""
    seen: dict[tuple, int] = {}
    out: dict[str, tuple] = {}
    for n in call.nodes:  # preorder from the roots
        name = n.label
        if n.kind == "accumulate_grad":
            t = call.tensor(n.variable)
            name = (t.name if t is not None else None) or n.label
        base = (n.name, n.module or "", name or "")
        k = seen[base] = seen.get(base, -1) + 1
        out[n.id] = base + (k,)
    return out


def same_structure(a: CallInfo, b: CallInfo) -> bool:
    """True when an isomorphism maps a's graph onto b's, keeping op names and edge slots."""
    ga, gb = call_graph(a), call_graph(b)
    if ga.number_of_nodes() != gb.number_of_nodes() or ga.number_of_edges() != gb.number_of_edges():
        return False
    if sorted(d["name"] for _, d in ga.nodes(data=True)) != sorted(d["name"] for _, d in gb.nodes(data=True)):
        return False
    # Preorder numbering makes the identity on positions the likely match: check it first.
    pa, pb = [n.id for n in a.nodes], [n.id for n in b.nodes]
    guess = dict(zip(pa, pb))
    if all(ga.nodes[u]["name"] == gb.nodes[guess[u]]["name"] for u in pa) and all(
        gb.has_edge(guess[u], guess[v], k) for u, v, k in ga.edges(keys=True)
    ):
        return True
    matcher = DiGraphMatcher(nx.DiGraph(ga), nx.DiGraph(gb), node_match=categorical_node_match("name", None))
    return matcher.is_isomorphic()


def compare_calls(a: CallInfo, b: CallInfo) -> CallDiff:
    """Nodes and edges of ``b`` that ``a`` lacks and the reverse (see the module docstring)."""
    if same_structure(a, b):
        ka, kb = node_keys(a), node_keys(b)
        inv = {v: k for k, v in kb.items()}
        matched = {u: inv[ka[u]] for u in ka if ka[u] in inv}
        return CallDiff(True, matched=matched)
    ka, kb = node_keys(a), node_keys(b)
    inv_b = {v: k for k, v in kb.items()}
    matched = {u: inv_b[key] for u, key in ka.items() if key in inv_b}
    back = {v: u for u, v in matched.items()}
    added = [n.id for n in b.nodes if n.id not in back]
    removed = [n.id for n in a.nodes if n.id not in matched]
    ea = {(ka[u], ka[v]) for u, v in call_graph(a).edges()}
    eb = {(kb[u], kb[v]) for u, v in call_graph(b).edges()}
    added_edges = [(inv_b[s], inv_b[d]) for s, d in sorted(eb - ea)]
    inv_a = {v: k for k, v in ka.items()}
    removed_edges = [(inv_a[s], inv_a[d]) for s, d in sorted(ea - eb)]
    return CallDiff(False, added, removed, added_edges, removed_edges, matched)
