"""Module groups of a call: which nodes belong to which nn.Module path, which groups get a frame.

A group is drawn (a frame when expanded, a box when collapsed) only when its nodes form a
convex part of the graph: no path leaves the group and comes back into it. A ModuleList
whose residual additions live in the parent is not convex; a frame around it would cover
unrelated nodes, and collapsing it would make a cycle.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter

from core.model.trace import CallInfo, paused_gc

log = logging.getLogger(__name__)

CHUNK = 64  # a stack of more than twice this many modules opens as runs of this many
MAX_DEPTH = 64  # module paths deeper than this are drawn as their first MAX_DEPTH parts
LABEL_CHARS = 80  # a name in a box or frame label longer than this loses its middle
PAGED_ABOVE = 5_000  # a call whose top level would draw more boxes than this is drawn in pages
PAGE = 1_000  # nodes per page: the call opens on the page nearest the loss
MAX_PAGES = 128
PAGE_MARK = "\u22ef"  # "⋯2": the group of the second page of nodes past the first (no module has it)


class GroupInfo:
    """Module groups of a call: paths, nesting, node counts; which are drawn is found lazily.

    Checking convexity costs a short search per group, so it runs only for groups someone
    asks about: a 50,000-node graph that opens with one group collapsed checks a handful.
    """

    def __init__(self, call: CallInfo):
        self._call = weakref.ref(call)
        nodes = call.nodes
        # group -> how many levels below it were left undrawn (paths deeper than MAX_DEPTH)
        self.deeper: dict[str, int] = {}
        capped = {m: self._capped(m) for m in {n.module for n in nodes if n.module}}
        paths = set(capped.values())
        owners = _owners(call, paths)
        self.module: dict[str, str | None] = {}
        for n in nodes:
            mod = capped[n.module] if n.module else None
            if mod is None and n.kind == "accumulate_grad":
                mod = owners.get(n.variable) or _owner_of(n.label, paths)
            self.module[n.id] = mod
        self._walk: tuple[list[list[int]], list[int]] | None = None  # successors and depths by index
        self.pages = self._page(call)  # page group -> its page number
        by_module: dict[str | None, list[int]] = {}
        for i, n in enumerate(nodes):
            by_module.setdefault(self.module[n.id], []).append(i)
        self.ancestors: dict[str | None, tuple[str, ...]] = {None: ()}
        self.children: dict[str | None, list[str]] = {}  # the module tree
        self._members: dict[str, list[int]] = {}
        for mod, idx in by_module.items():
            if mod is None:
                continue
            parts = mod.split(".")
            chain = tuple(".".join(parts[:i]) for i in range(1, len(parts) + 1))
            for i, g in enumerate(chain):
                if g not in self.ancestors:
                    self.ancestors[g] = chain[: i + 1]
                    self.children.setdefault(chain[i - 1] if i else None, []).append(g)
                self._members.setdefault(g, []).extend(idx)
        self.count: dict[str, int] = {g: len(m) for g, m in self._members.items()}
        self.module_count: dict[str | None, int] = {m: len(idx) for m, idx in by_module.items()}
        self.own: dict[str | None, list[int]] = by_module  # module -> indices of its own nodes
        self._ids: dict[str, list[str]] = {}
        self._first: dict[str, int] = {}
        self._maps: dict[str, dict[str, str]] = {}
        self.lines: dict[str, str] = {}  # group -> the in/out line of its folded box (core.layout.visible)
        self._leaving: dict[str, list[tuple[int, int]]] | None = None  # group -> border edges (``_borders``)
        self._entering: dict[str, list[tuple[int, int]]] | None = None
        stacks, runs = _repeats(nodes, self)
        self.repeat: dict[str, int] = stacks  # "× N" groups -> N
        self._classes: dict[str, str] = dict((call.options or {}).get("module_classes") or {})
        self.chunk_of: dict[str, str | None] = {}  # a run or chunk of blocks -> the module whose blocks they are
        for parent, kids in runs:
            self._run(parent, kids)
        for g, n in list(self.repeat.items()):
            if n > 2 * CHUNK:
                self._chunk(g)
        self._drawn: dict[str, bool] = {}
        self._graph = None
        self._budget = 400_000

    def _capped(self, path: str) -> str:
        """``path`` cut to MAX_DEPTH parts: each part is a frame inside the last, and thousands of
        nested frames (a recursive module 3,000 deep) cost time and show nothing readable."""
        if path.count(".") < MAX_DEPTH:
            return path
        parts = path.split(".", MAX_DEPTH)
        head = ".".join(parts[:MAX_DEPTH])
        self.deeper[head] = max(self.deeper.get(head, 0), parts[MAX_DEPTH].count(".") + 1)
        return head

    def _page(self, call: CallInfo) -> dict[str, int]:
        """Put the nodes of a call whose top level has more than PAGED_ABOVE boxes (a 100,000-op
        chain, one op with 100,000 inputs) in pages of PAGE nodes (at most MAX_PAGES pages),
        nearest the loss first: the call opens on the first page drawn and each other page
        folded into one box "farther from the loss", which opens like a module.

        Pages follow the longest-path depth from the roots: every edge leads to a deeper node,
        so no path leaves a page and comes back, and each page group is convex.
        """
        nodes = call.nodes
        top = {m.split(".", 1)[0] for m in self.module.values() if m is not None}
        loose = sum(1 for m in self.module.values() if m is None)
        if loose + len(top) <= PAGED_ABOVE:
            return {}
        index = {n.id: i for i, n in enumerate(nodes)}
        succ = [[index[e.node] for e in n.next if e is not None and e.node in index] for n in nodes]
        depth = _depths(succ)
        self._walk = (succ, depth)
        order = sorted(range(len(nodes)), key=depth.__getitem__)  # stable: capture order within a depth
        size = max(PAGE, -(-len(nodes) // MAX_PAGES))
        count = -(-len(nodes) // size)
        prefixes = [""] + [f"{PAGE_MARK}{k + 1}" for k in range(1, count)]
        pages = {p: k for k, p in enumerate(prefixes) if k}
        for rank, i in enumerate(order):
            k = rank // size
            if k:
                nid = nodes[i].id
                mod = self.module[nid]
                self.module[nid] = prefixes[k] + ("." + mod if mod else "")
        log.info("%d nodes: drawn in pages of %d nodes from the loss", len(nodes), size)
        return pages

    def node_groups(self, node_id: str) -> tuple[str, ...]:
        return self.ancestors[self.module[node_id]]

    def _run(self, parent: str | None, kids: list[str]) -> None:
        """Stack the identical numbered blocks ``kids`` (``layers.1`` … ``layers.6``), a run among
        other children of ``parent`` (an embedding before them, a head after), into one group
        ``layers.1–6`` of their own; the other children stay as they are."""
        r = _run_name(kids)
        depth = len(self.ancestors[parent])
        inside = set(kids)
        siblings = self.children[parent]
        at = min(siblings.index(k) for k in kids)
        self.children[parent] = [k for k in siblings[:at] if k not in inside] + [r] + [
            k for k in siblings[at:] if k not in inside]
        self.children[r] = kids
        self.ancestors[r] = self.ancestors[parent] + (r,)
        self._members[r] = [i for k in kids for i in self._members[k]]
        self.count[r] = len(self._members[r])
        self.repeat[r] = len(kids)
        self.chunk_of[r] = parent
        for path, chain in list(self.ancestors.items()):
            if len(chain) > depth and chain[depth] in inside:
                self.ancestors[path] = chain[:depth] + (r,) + chain[depth:]

    def _chunk(self, g: str) -> None:
        """Split the stack ``g`` (say 8,333 blocks) into runs of ``CHUNK`` (``g.0–63`` …), each a
        group of its own: opening the stack then draws 131 boxes, not 8,333."""
        kids = sorted(self.children[g], key=_number)
        depth = len(self.ancestors[g])
        chunk_of: dict[str, str] = {}
        chunks = []
        k = -(-len(kids) // CHUNK)  # runs of even length, none longer than CHUNK
        bounds = [round(i * len(kids) / k) for i in range(k + 1)]
        for a, b in zip(bounds, bounds[1:]):
            part = kids[a:b]
            c = _run_name(part)
            chunks.append(c)
            self.children[c] = part
            self.ancestors[c] = self.ancestors[g] + (c,)
            self._members[c] = [i for k in part for i in self._members[k]]
            self.count[c] = len(self._members[c])
            self.repeat[c] = len(part)
            self.chunk_of[c] = g
            chunk_of.update((k, c) for k in part)
        self.children[g] = chunks
        for path, chain in list(self.ancestors.items()):
            if len(chain) > depth and chain[depth] in chunk_of:
                self.ancestors[path] = chain[:depth] + (chunk_of[chain[depth]],) + chain[depth:]

    def member_ids(self, g: str) -> list[str]:
        """Ids of the nodes inside ``g`` (kept: a fold then costs what it shows)."""
        hit = self._ids.get(g)
        if hit is None:
            nodes = self._call().nodes
            hit = self._ids[g] = [nodes[i].id for i in self._members[g]]
        return hit

    def member_map(self, g: str) -> dict[str, str]:
        """Node id -> ``group:<g>`` for the nodes inside ``g``: what a fold of ``g`` adds to a
        layout's ``members`` (kept: copying a dict costs half of building it)."""
        hit = self._maps.get(g)
        if hit is None:
            hit = self._maps[g] = dict.fromkeys(self.member_ids(g), "group:" + g)
        return hit

    def first(self, g: str) -> int:
        """The smallest node index inside ``g`` (kept)."""
        hit = self._first.get(g)
        if hit is None:
            hit = self._first[g] = min(self._members[g])
        return hit

    def prepare(self, collapsed, limit: int = 4096, stop=None) -> list[str]:
        """Find now what folding or unfolding a group of the view folded at ``collapsed`` will ask
        for: border edges, and for each folded group's subgroups whether they are drawn, their
        node ids and first node. Run off the GUI thread once a layout is shown, so that the first
        fold of a 50,000-node call costs what later ones do; ``stop()`` true ends it early (the
        user asked for another layout, which must not wait). Returns the groups it prepared."""
        if self._leaving is None:
            self._borders()
        done: list[str] = []
        for g in sorted(collapsed):
            if g not in self.count:
                continue
            if len(done) >= limit or stop is not None and stop():
                break
            for c in [g] + self.drawn_children(g):
                self.member_map(c)
                self.first(c)
                done.append(c)
        return done

    def leaving(self, g: str) -> list[tuple[int, int]]:
        """(node index, slot) of the edges from a node inside ``g`` to one outside, in node order."""
        if self._leaving is None:
            self._borders()
        return self._leaving.get(g, [])

    def entering(self, g: str) -> list[tuple[int, int]]:
        """(node index, slot) of the edges from a node outside ``g`` to one inside, in node order:
        in the forward sense, the tensors ``g`` hands to the rest of the graph."""
        if self._entering is None:
            self._borders()
        return self._entering.get(g, [])

    def _borders(self) -> None:
        """Every group's border edges in one pass over the edges: an edge leaves the groups around
        its source that are not around its target, and enters the converse ones. Asking for one
        group (a folded top level) walks all its nodes anyway, so all groups cost about what one
        does, and later folds find their borders ready."""
        call = self._call()
        module, anc = self.module, self.ancestors
        chain_of: dict[str, tuple[str, ...]] = {nid: anc[m] for nid, m in module.items()}
        leaving: dict[str, list[tuple[int, int]]] = {}
        entering: dict[str, list[tuple[int, int]]] = {}
        empty: tuple[str, ...] = ()
        for i, n in enumerate(call.nodes):
            ca = chain_of[n.id]
            for slot, e in enumerate(n.next):
                if e is None:
                    continue
                cb = chain_of.get(e.node, empty)
                if cb is ca:
                    continue
                k, top = 0, min(len(ca), len(cb))
                while k < top and ca[k] == cb[k]:
                    k += 1
                for g in ca[k:]:
                    leaving.setdefault(g, []).append((i, slot))
                for g in cb[k:]:
                    entering.setdefault(g, []).append((i, slot))
        self._leaving, self._entering = leaving, entering

    def title(self, g: str, parent: str | None = None) -> str:
        """``g`` relative to ``parent``, with "× N" for a stack of identical modules."""
        while parent in self.chunk_of:  # a block in a run is named as in the module that holds the run
            parent = self.chunk_of[parent]
        text = g if parent is None or not g.startswith(parent + ".") else g[len(parent) + 1 :]
        if g in self.pages:
            return f"farther from the loss ({self.pages[g] + 1} of {len(self.pages) + 1})"
        n = self.repeat.get(g)
        text = short_label(text)
        if g in self.deeper:
            text += f" (and {self.deeper[g]:,} deeper levels, not drawn)"
        return f"{text} \u00d7 {n}" if n else text

    def boundary(self, g: str) -> tuple[int, int]:
        """(inputs, outputs) of module ``g`` in the forward sense: nodes outside it that its nodes
        read from (their next functions) and nodes outside it that read its results."""
        nodes = self._call().nodes
        ins = {nodes[i].next[s].node for i, s in self.leaving(g)}
        outs = {nodes[i].id for i, _s in self.entering(g)}
        return len(ins), len(outs)

    def class_of(self, g: str) -> str | None:
        """The module's class name when the capture recorded it; a stack's (or a run's) is its
        blocks' class."""
        if g in self.repeat:
            kids = self.children.get(g) or [g]
            first = kids[0]
            while first in self.chunk_of:
                first = self.children[first][0]
            return self._classes.get(first)
        return self._classes.get(g)

    def depth(self, g: str) -> int:
        """Nesting depth among drawn groups: 0 for a top-level group."""
        d, p = 0, self.drawn_parent(g)
        while p is not None:
            d, p = d + 1, self.drawn_parent(p)
        return d

    def fold_to_depth(self, depth: int) -> frozenset[str]:
        """The collapsed set that shows drawn groups down to ``depth`` levels open (0: all folded)."""
        out: set[str] = set()
        level = self.drawn_children(None)
        for _ in range(max(0, depth)):
            level = [c for g in level for c in self.drawn_children(g)]
        out.update(level)
        return frozenset(out)

    def expand_path(self, collapsed: frozenset[str], node_id: str) -> frozenset[str]:
        """``collapsed`` less every group around ``node_id``; the groups beside that path stay
        folded (Model Explorer opens only the path), so a 50,000-node graph stays small."""
        chain = self.node_groups(node_id)
        first = next((i for i, g in enumerate(chain) if g in collapsed), None)
        if first is None:
            return collapsed
        around = set(chain)
        out = set(collapsed) - around
        for g in chain[first:]:
            out.update(c for c in self.drawn_children(g) if c not in around)
        return frozenset(out)

    def is_drawn(self, g: str) -> bool:
        """True when group ``g`` is convex, so it gets a frame or a box."""
        hit = self._drawn.get(g)
        if hit is None:
            hit = self._drawn[g] = self._convex(g)
        return hit

    @property
    def drawn(self) -> frozenset[str]:
        """Every drawn group (checks them all)."""
        return frozenset(g for g in self.count if self.is_drawn(g))

    def drawn_parent(self, g: str) -> str | None:
        """The nearest drawn group around ``g`` (None: the top level)."""
        for a in reversed(self.ancestors[g][:-1]):
            if self.is_drawn(a):
                return a
        return None

    def drawn_children(self, g: str | None) -> list[str]:
        """The nearest drawn groups inside ``g`` (None: the top level)."""
        out, stack = [], list(reversed(self.children.get(g, [])))
        while stack:
            c = stack.pop()
            if self.is_drawn(c):
                out.append(c)
            else:
                stack.extend(reversed(self.children.get(c, [])))
        return out

    def _convex(self, g: str) -> bool:
        if self._graph is None:
            call = self._call()
            if self._walk is None:
                index = {n.id: i for i, n in enumerate(call.nodes)}
                succ = [[index[e.node] for e in n.next if e is not None] for n in call.nodes]
                self._walk = (succ, _depths(succ))
            self._graph = (*self._walk, [self.ancestors[m] for m in self.module.values()])
        succ, depth, anc = self._graph
        mem = self._members[g]
        dmax = max(map(depth.__getitem__, mem))
        # A path out of g and back in only runs through nodes shallower than g's deepest node.
        stack = [w for u in mem for w in succ[u] if depth[w] < dmax and g not in anc[w]]
        seen: set[int] = set()
        while stack:
            if self._budget <= 0:
                log.info("group check stopped early; group %s assumed convex", g)
                return True
            w = stack.pop()
            if w in seen:
                continue
            seen.add(w)
            self._budget -= 1
            for x in succ[w]:
                if g in anc[x]:
                    return False
                if depth[x] < dmax and x not in seen:
                    stack.append(x)
        return True


def short_label(text: str, limit: int = LABEL_CHARS) -> str:
    """``text`` with its middle replaced by "…" past ``limit`` characters: boxes are sized to
    their labels, and a megabyte-long module or tensor name made a box millions of pixels wide."""
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return text[:half] + "\u2026" + text[-(limit - 1 - half):]


def node_index(call: CallInfo) -> dict[str, int]:
    """Node id -> position in ``call.nodes`` (kept on the call)."""
    cached = call.__dict__.get("_node_index")
    if cached is None:
        cached = {n.id: i for i, n in enumerate(call.nodes)}
        object.__setattr__(call, "_node_index", cached)
    return cached


def _number(path: str) -> int:
    return int(path.rsplit(".", 1)[-1])


def _run_name(kids: list[str]) -> str:
    """``layers.1–6`` for the blocks ``layers.1`` … ``layers.6`` (``1–6`` at the top level)."""
    head, _, _ = kids[0].rpartition(".")
    return f"{head + '.' if head else ''}{_number(kids[0])}\u2013{_number(kids[-1])}"


MIN_RUN = 3  # a run of numbered blocks among other children is stacked from this many


def _repeats(nodes, info: GroupInfo) -> tuple[dict[str, int], list[tuple[str | None, list[str]]]]:
    """Runs of identical numbered blocks: ``({module: N}, [(parent, blocks)])``.

    A module whose children are ``0 … N-1`` (a ModuleList, a Sequential of blocks) built of the
    same ops (all but perhaps the first) is drawn as one "× N" stack that opens to its members.
    Elsewhere, consecutive numbered children built of the same ops (at least ``MIN_RUN``) among
    other children (``embed``, ``h.0`` … ``h.11``, ``ln_f`` in one Sequential, or blocks whose
    first and last differ) are stacked on their own, the other children left as they are."""
    numbered: dict[str | None, list[str]] = {}
    for g, kids in info.children.items():
        start = len(g) + 1 if g is not None else 0
        run = [k for k in kids if k[start:].isdigit()]
        if len(run) >= 2:
            numbered[g] = sorted(run, key=_number)
    if not numbered:
        return {}, []
    sig: dict[str, list] = {k: [] for kids in numbered.values() for k in kids}
    for n in nodes:
        mod = info.module[n.id]
        for a in info.ancestors[mod]:
            if a in sig:
                sig[a].append((mod[len(a) :], n.name))
    sig = {k: sorted(v) for k, v in sig.items()}
    stacks: dict[str, int] = {}
    runs: list[tuple[str | None, list[str]]] = []
    for g, kids in numbered.items():
        whole = len(kids) == len(info.children[g]) and [_number(k) for k in kids] == list(range(len(kids)))
        if g is not None and whole and not info.module_count.get(g):
            # The first block may differ: its input often needs no grad, so some ops are missing.
            rest = kids[1:] if len(kids) > 2 else kids
            if all(sig[k] == sig[rest[-1]] for k in rest[:-1]):
                stacks[g] = len(kids)
                continue
        runs.extend((g, part) for part in _identical_runs(kids, sig) if len(part) >= MIN_RUN)
    return stacks, runs


def _identical_runs(kids: list[str], sig: dict[str, list]) -> list[list[str]]:
    """``kids`` (sorted by number) cut into runs of consecutive numbers and equal op lists; block 0
    joins the run after it when it only lacks some of their ops (its input needs no grad)."""
    out: list[list[str]] = []
    for k in kids:
        last = out[-1] if out else None
        if last is not None and _number(k) == _number(last[-1]) + 1 and sig[k] == sig[last[-1]]:
            last.append(k)
        elif (last is not None and len(last) == 1 and _number(last[0]) == 0 and _number(k) == 1
              and not Counter(sig[last[0]]) - Counter(sig[k])):
            last.append(k)
        else:
            out.append([k])
    return out


def _owners(call: CallInfo, paths: set[str]) -> dict[str, str]:
    """Parameters' modules from their names (``layers.3.fc.weight`` -> ``layers.3.fc``).

    The capture records AccumulateGrad nodes without a module; a parameter drawn inside
    the box of the module that owns it reads better than one left outside.
    """
    out = {}
    for t in call.tensors:
        if t.is_leaf and t.name and "." in t.name:
            owner = _owner_of(t.name, paths)
            if owner is not None:
                out[t.id] = owner
    return out


def _owner_of(name: str | None, paths: set[str]) -> str | None:
    """The nearest module on the name's path that made nodes: ``attn.out_proj.weight`` belongs
    to ``attn`` when ``out_proj`` never ran its own forward (nn.MultiheadAttention)."""
    while name and "." in name:
        name = name.rsplit(".", 1)[0]
        if name in paths:
            return name
    return None


def _depths(succ: list[list[int]]) -> list[int]:
    """Longest-path depth from the roots (Kahn's algorithm, no recursion)."""
    indeg = [0] * len(succ)
    for vs in succ:
        for v in vs:
            indeg[v] += 1
    depth = [0] * len(succ)
    stack = [v for v, d in enumerate(indeg) if d == 0]
    while stack:
        v = stack.pop()
        dv = depth[v] + 1
        for u in succ[v]:
            if depth[u] < dv:
                depth[u] = dv
            indeg[u] -= 1
            if indeg[u] == 0:
                stack.append(u)
    return depth


_info_cache: dict[int, tuple[weakref.ref, GroupInfo]] = {}


def group_info(call: CallInfo) -> GroupInfo:
    """Cached per call object; a call is immutable."""
    hit = _info_cache.get(id(call))
    if hit is not None and hit[0]() is call:
        return hit[1]
    with paused_gc():
        info = GroupInfo(call)
    if len(_info_cache) > 16:
        _info_cache.clear()
    _info_cache[id(call)] = (weakref.ref(call), info)
    return info


def default_collapsed(call: CallInfo, threshold: int = 2000) -> frozenset[str]:
    """Groups to collapse so that about ``threshold`` boxes show, opening whole levels at a time."""
    if len(call.nodes) <= threshold:
        return frozenset()
    with paused_gc():
        return _default_collapsed(call, threshold)


def _default_collapsed(call: CallInfo, threshold: int) -> frozenset[str]:
    info = group_info(call)
    count = info.count
    frontier = sorted(info.drawn_children(None))
    shown = len(call.nodes) - sum(count[g] for g in frontier) + len(frontier)
    while frontier:
        # Opening g shows at least its own nodes and one box per child module: a cheap bound
        # that spares checking thousands of subgroups when the level is too big anyway.
        bound = shown + sum(info.module_count.get(g, 0) + len(info.children.get(g, [])) - 1 for g in frontier)
        if bound > threshold:
            break
        kids = {g: info.drawn_children(g) for g in frontier}
        after = shown + sum(count[g] - sum(count[c] for c in kids[g]) + len(kids[g]) - 1 for g in frontier)
        if after > threshold:
            break
        shown, frontier = after, sorted(c for g in frontier for c in kids[g])
    return frozenset(frontier)
