"""Step states and gradient texts on the graph view, redrawn per step in O(changed items).

Stepping backward changes a handful of nodes per step (the one that ran, the next one, the
nodes whose gradient became complete) and the edges that got a value. ``update_step`` redraws
the boxes and edges showing those and nothing else: states are tallied per drawn box (a
folded group counts its members' states) so a box's state is known without looking at the
other nodes, and the legend and the zoomed-out overview's marks are touched only when what they
show changed. ``set_node_states`` / ``set_edge_texts`` replace everything (a replay, an
export); ``states_token`` tells a caller sending deltas whether that happened meanwhile.
"""

from __future__ import annotations

from core.model.grad_notes import node_notes
from core.model.step_state import box_state
from core.model.values import leaf_value_lines
from widgets.graph.items import NodeItem
from widgets.graph.scene import apply_edge_texts, update_edge_texts


class StepStatesMixin:
    """Step states and edge texts for ``GraphView``."""

    def _init_step_states(self) -> None:
        self._box_size: dict[str, int] = {}  # members of each folded group's box
        self.item_updates = 0  # node and edge items given a new state or text (tests read it)
        self._step_grads: tuple | None = None  # (call, the step's leaf_grads) while a call is stepped

    def node_states(self) -> dict[str, str]:
        """Step states by trace node id (see ``set_node_states``)."""
        return dict(self.state.states)

    def edge_texts(self) -> dict[tuple[str, str], str]:
        """Texts on edges by (src, dst) trace node ids (see ``set_edge_texts``)."""
        return dict(self.state.edge_texts)

    def set_node_states(self, states: dict[str, str]) -> None:
        """Step states by trace node id: "executed", "current", "frontier" or "failed"."""
        self.state.states = dict(states)
        self.state.states_token += 1
        self._apply_states()
        if self.state.layout is not None:
            self._legend_entries()

    def set_edge_texts(self, texts: dict[tuple[str, str], str]) -> None:
        """Texts (gradient values) on edges, keyed by (src, dst) trace node ids."""
        self.state.edge_texts = dict(texts)
        self.state.states_token += 1
        self._apply_edge_texts()

    def update_step(self, states: dict[str, str | None], texts: dict[tuple[str, str], str | None]) -> None:
        """What a step changed: new states of some nodes (None: no state) and new texts on some
        edges (None: none). Only the boxes and edges drawing them are touched; the legend and the
        overview's marks change only when what they show does. O(changes), not O(nodes)."""
        if texts:
            self.item_updates += update_edge_texts(self, texts)
        if not states:
            return
        kinds_before = set(self.state.state_kinds)
        members = self.state.layout.members if self.state.layout is not None else {}
        touched = set()
        for nid, new in states.items():
            old = self.state.states.get(nid)
            if old == new:
                continue
            if new is None:
                del self.state.states[nid]
            else:
                self.state.states[nid] = new
            _count(self.state.state_kinds, old, new)
            vid = members.get(nid)
            if vid is not None:
                _count(self.state.box_tally.setdefault(vid, {}), old, new)
                touched.add(vid)
        marks = dict(self.overview.marks) if self.overview is not None else None
        for vid in touched:
            item = self.node_items.get(vid)
            if item is None:
                continue
            item.set_state(box_state(self.state.box_tally[vid], self._box_size.get(vid, 1)))
            self.item_updates += 1
            if marks is not None:
                _overview_mark(marks, vid, item, self._selected_box())
        if marks is not None:
            self.overview.set_marks(marks)
        if set(self.state.state_kinds) != kinds_before and self.state.layout is not None:
            self._legend_entries()

    def states_token(self) -> int:
        """Changes whenever the states or edge texts are replaced wholesale (a new call, a replay,
        ``clear_states``), not when ``update_step`` changes some: a caller that sends deltas
        knows the view still holds what it sent while the token is the one it saw."""
        return self.state.states_token

    def clear_states(self) -> None:
        self.set_node_states({})
        self.set_edge_texts({})  # after the states: with none left, edges show the call's values again
        self.set_leaf_lines({}, replace=True)
        self.set_step_grads(None)

    def step_grads(self) -> dict | None:
        """The ``leaf_grads`` of the step shown (see ``set_step_grads``); None when not stepping."""
        found = self._step_grads
        return found[1] if found is not None and found[0] is self.state.call else None

    def set_step_grads(self, leaf_grads: dict | None) -> None:
        """The ``leaf_grads`` of the step shown (``StepView.leaf_grads``: a tensor's name, or its
        node's id, -> its .grad at that step) while the call is stepped; None: the call's own. The
        retained-grad and ``autograd.grad`` notes on nodes follow: "hidden.grad = None" until
        hidden's node has run, then the value that step recorded. O(notes) once the call has none."""
        call = self.state.call
        self._step_grads = (call, leaf_grads) if leaf_grads is not None and call is not None else None
        items = [i for i in self.marks.tags if getattr(i, "grad_note", False)]
        if not items:
            return
        notes = node_notes(call, self.step_grads())
        for item in items:
            lines = notes.get(item.target)
            if lines and lines != item.lines:
                item.set_lines(lines)
                self.item_updates += 1

    def note_lines(self, node_id: str) -> list[str] | None:
        """The lines of the retained-grad / ``autograd.grad`` note on a node (None: none drawn)."""
        item = next((i for i in self.marks.tags if getattr(i, "grad_note", False) and i.target == node_id), None)
        return list(item.lines) if item is not None else None

    def leaf_chip(self, node_id: str) -> list[str] | None:
        """The lines a leaf's value chip shows (None: no chip drawn for it)."""
        item = next((i for i in self.marks.tags if getattr(i, "leaf", False) and i.target == node_id), None)
        return list(item.lines) if item is not None else None

    def set_leaf_lines(self, lines: dict[str, list[str]], *, replace: bool = False) -> None:
        """Leaf value chips' lines by AccumulateGrad node id, while a call is stepped (a leaf's
        .grad changes at its step); ``replace``: these are all of them, the others show the call's
        own. Chips drawn are updated in place; a scene built later draws them too."""
        if replace:
            dropped = set(self.state.leaf_lines) - set(lines)
            self.state.leaf_lines = dict(lines)
        else:
            dropped = set()
            self.state.leaf_lines.update(lines)
        if not lines and not dropped:
            return
        call = self.state.call
        for item in self.marks.tags:
            if not getattr(item, "leaf", False):
                continue
            new = lines.get(item.target)
            if new is None and item.target in dropped and call is not None and call.node(item.target) is not None:
                new = leaf_value_lines(call, call.node(item.target))
            if new:
                item.set_lines(new)
                self.item_updates += 1

    def _apply_states(self) -> None:
        self.state.state_kinds = {}
        for st in self.state.states.values():
            _count(self.state.state_kinds, None, st)
        if self.state.layout is None:
            return
        members = self.state.layout.members
        self._box_size = {"group:" + g.path: g.count for g in self.state.layout.groups if g.collapsed}
        self.state.box_tally = {}
        for nid, st in self.state.states.items():
            vid = members.get(nid)
            if vid is not None:
                _count(self.state.box_tally.setdefault(vid, {}), None, st)
        for vid, item in self.node_items.items():
            tally = self.state.box_tally.get(vid)
            item.set_state(box_state(tally, self._box_size.get(vid, 1)) if tally else None)
        self.item_updates += len(self.node_items)
        self._update_marks()

    def _selected_box(self) -> str | None:
        if self.state.selected is None or self.state.layout is None:
            return None
        return self.state.layout.members.get(self.state.selected, self.state.selected)

    def _apply_edge_texts(self) -> None:
        self.item_updates += apply_edge_texts(self)


def _count(tally: dict[str, int], old: str | None, new: str | None) -> None:
    """Move one node from state ``old`` to ``new`` in a tally (None: no state)."""
    if old is not None:
        left = tally.get(old, 0) - 1
        if left > 0:
            tally[old] = left
        else:
            tally.pop(old, None)
    if new is not None:
        tally[new] = tally.get(new, 0) + 1


def _overview_mark(marks: dict[str, str], vid: str, item: NodeItem, selected: str | None) -> None:
    """``marks[vid]`` as ``overview_marks`` gives it: the selection, else a running or failed
    step, else a search match."""
    if vid == selected:
        marks[vid] = "selection"
    elif item.state in ("current", "failed"):
        marks[vid] = item.state
    elif item.highlighted:
        marks[vid] = "highlight"
    else:
        marks.pop(vid, None)
