"""The main window's showing and selecting: the trace, its calls, and the session's one selection.

A mixin of ``app.window.window.MainWindow``. A node or tensor picked in any view (graph, inspector,
tensors table, storage, source, problems, memory, step log) becomes the session's selection
(``Session.select`` / ``Session.select_tensor``); every view follows ``Session.sig_selection``:
the graph shows the highlight it is told, the inspector, storage, tensors table, source and
problems show the same thing.
"""

from __future__ import annotations

from functools import partial

from app.session.session import Selection
from core.model.anatomy import name_lines
from core.model.forward_errors import failed_inputs, failed_op
from core.model.trace import CallInfo, Trace
from core.programs.notebook import where as line_where


class SelectionWiring:
    """Shows the session's trace and current call, and keeps every view on the one selection."""

    def show_trace(self, trace: Trace) -> None:
        """Show a trace: calls list, problems, memory, and the graph of the call the session opens
        it on (``Session.opening_call``: the first call, or the one last stepped)."""
        self.inspector.cells = trace.cells
        if trace.cells:  # the graph's tips and notes say "cell 4, line 2"
            name_lines(trace.calls, partial(line_where, trace.cells))
        if trace.source and (trace.cells or trace.mode == "model"):
            # What ran: a notebook's cells, or the script that opened a saved model.
            self.source.set_source(trace.source, trace.script, trace.cells)
        self.session.set_trace(trace)
        self.memory.show_trace(trace)
        self.tensors.set_tensors(trace.tensors)
        self.problems.set_trace(trace)
        self.grad_health.set_trace(trace)
        self.curves.set_trace(trace)
        if trace.error is not None:
            self.problems.show_error(trace.error)
        nodes = sum(c.node_count for c in trace.calls)
        self.counts_label.setText(f"{len(trace.calls)} graph(s), {trace.call_count} backward call(s), {nodes} nodes")
        first = self.session.opening_call()
        if first is None:
            self.session.set_call(None)
            named = [t for t in trace.tensors if t.name]
            if named:
                # No graph: the script is about tensors themselves; show them.
                self.left_tabs.setCurrentWidget(self.tensors)
                self.select_tensor(named[0].id, scope="top")
                self.center.setCurrentWidget(self.storage)
            self.sig_trace_shown.emit()
            return
        self.left_tabs.setCurrentWidget(self.calls)
        self.calls.select_call(first.id)
        self.show_call(first.id)

    def show_call(self, call_id: str) -> None:
        if self.trace is None:
            return
        call = next((c for c in self.trace.calls if c.id == call_id), None)
        if call is None:
            return
        self.grad_health.mark_call(call.index)
        self.curves.mark_call(call.index)
        if call.snapshot == "summary" and call.same_as:
            # A repeated call keeps only its summary: show the graph it repeats.
            self.inspector.clear()
            same = next((c for c in self.trace.calls if c.id == call.same_as), None)
            if same is not None and same is not self.call:
                self.session.set_call(same)
            return
        if call is not self.call:
            self.session.set_call(call)

    def _on_call(self, call: CallInfo | None) -> None:
        """The session's current call changed: every view shows it."""
        self.inspector.clear()
        self.source.clear_highlight()
        if call is None:
            self.graph.set_call(None)
            self.storage.clear()
            self._update_actions()
            return
        self.graph.set_peer_calls(self.trace.calls if self.trace is not None else [])
        self.graph.set_call(call)
        self.memory.set_call(call)
        self.center.setCurrentWidget(self.graph)
        self._update_actions()

    def _on_scene_ready(self, _call_id: str = "") -> None:
        self._update_zoom_label()
        node = self.session.opening_node() if self.session.selected is None else None
        if node is not None:  # described, without moving the fitted view
            self.inspector.show_node(self.call, node)
        self.sig_trace_shown.emit()

    def _select_call_index(self, index: int) -> None:
        if self.trace is None:
            return
        call = next((c for c in self.trace.calls if c.index == index), None)
        if call is not None:
            self._select_call_from_elsewhere(call.id)

    def _select_call_from_elsewhere(self, call_id: str) -> None:
        self.calls.select_call(call_id)
        self.show_call(call_id)

    def select_node(self, node_id: str) -> None:
        """Make a node the selection (the session's; every view follows)."""
        self.session.select(node_id)

    def _follow_selection(self) -> None:
        """Every view listens to the session's one selection and draws its part of it."""
        sig = self.session.sig_selection
        sig.connect(lambda sel: self.graph.show_selection(sel.node))
        sig.connect(lambda sel: self.problems.show_selection(sel.node))
        sig.connect(self._calls_follow)
        sig.connect(self._tensors_follow)
        sig.connect(self._storage_follow)
        sig.connect(self._inspector_follow)
        sig.connect(self._source_follow)

    def _selected_node(self, selection: Selection):
        call = self.call
        return call.node(selection.node) if call is not None and selection.node else None

    def _calls_follow(self, selection: Selection) -> None:
        """The calls list marks the call the selected node belongs to."""
        if self.call is None or not selection.node or self.trace is None:
            return
        marked = next((c for c in self.trace.calls if c.id == self.calls.current_call()), None)
        if marked is None or (marked.id != self.call.id and marked.same_as != self.call.id):
            self.calls.select_call(self.call.id)  # a repeated call's row stays: it shows this graph

    def _tensors_follow(self, selection: Selection) -> None:
        top = self._top_tensor(selection) if selection.tensor is not None else None
        if top is not None:
            self.tensors.select_tensor(top)

    def _storage_follow(self, selection: Selection) -> None:
        self._tensor_scope = selection.scope
        if selection.tensor is not None:
            tensors, storages = self._scope_tensors(selection.scope)
            self.storage.set_tensor(tensors, selection.tensor, storages)

    def _inspector_follow(self, selection: Selection) -> None:
        """The inspector describes what the user picked: the tensor, or the node."""
        node = self._selected_node(selection)
        if selection.origin == "tensor" and selection.tensor is not None:
            tensors, _ = self._scope_tensors(selection.scope)
            self.inspector.show_tensor({t.id: t for t in tensors}, selection.tensor, self.call)
        elif node is not None:
            self.inspector.show_node(self.call, node.id)

    def _source_follow(self, selection: Selection) -> None:
        node = self._selected_node(selection)
        if node is not None and node.line:
            self.source.highlight_lines([node.line])
        elif node is not None:
            self.source.clear_highlight()

    def _scope_tensors(self, scope: str) -> tuple[list, list]:
        if scope == "call" and self.call is not None:
            return self.call.tensors, self.call.storages
        if self.trace is not None:
            return self.trace.tensors, self.trace.storages
        return [], []

    def _top_tensor(self, selection: Selection) -> str | None:
        """The selection's tensor among those named when the script ended (the Tensors table's rows)."""
        if selection.scope == "top" or self.trace is None:
            return selection.tensor if selection.scope == "top" else None
        held = self.call.tensor(selection.tensor) if self.call is not None else None
        name = held.name if held is not None else None
        match = next((t for t in self.trace.tensors if name and t.name == name), None)
        return match.id if match is not None else None

    def select_tensor(self, tensor_id: str, scope: str | None = None) -> None:
        """Make a tensor the selection; ``scope`` is "call" (the graph's tensors) or "top" (the
        tensors named when the script ended); ids are per scope. The node holding it follows."""
        self.session.select_tensor(tensor_id, scope or self._tensor_scope)

    def select_named(self, name: str) -> bool:
        """Select a node or tensor by its script name (used by --select for screenshots)."""
        if self.call is not None:
            node = next((n for n in self.call.nodes if n.label == name or n.name == name), None)
            if node is not None:
                self.select_node(node.id)
                return True
        if self.trace is not None:
            t = next((t for t in self.trace.tensors if t.name == name), None)
            if t is not None:
                self.left_tabs.setCurrentWidget(self.tensors)
                self.select_tensor(t.id, scope="top")
                self.center.setCurrentWidget(self.storage)
                return True
        return False

    def select_line(self, line: int) -> None:
        """Select the nodes a script line created (the first one is centred)."""
        if self.call is None:
            self.source.highlight_lines([line])
            return
        nodes = [n for n in self.call.nodes if n.line == line]
        op = failed_op(self.call)
        if not nodes and op is not None and op.get("line") == line:
            # the op the forward pass failed in made no node: its inputs are where it is drawn
            inputs = failed_inputs(self.call)
            if inputs and self.session.selected not in inputs:
                self.session.select(inputs[0])
            self.source.highlight_lines([line])
            self.state_label.setText(f"Line {line}: {op.get('text') or op.get('name')} failed in forward "
                                     f"(graph #{self.call.index})")
            return
        if nodes:
            self.session.select(nodes[0].id)
            self.source.highlight_lines([line])
            self.state_label.setText(f"Line {line} created {len(nodes)} node(s)")
        else:
            self.source.highlight_lines([line])
            self.state_label.setText(f"Line {line} created no node of this graph")

    def focus_search(self) -> None:
        self.search_box.setFocus()
        self.search_box.selectAll()

    def search(self) -> None:
        text = self.search_box.text().strip()
        if not text:
            return
        matches = self.graph.search(text)
        if matches and self.call is not None:
            # A node whose variable or op name is exactly the text comes first.
            want = text.lower()
            exact = [m for m in matches
                     if want in ((self.call.node(m).label or "").lower(), self.call.node(m).name.lower())]
            matches = exact + [m for m in matches if m not in exact]
        if matches:
            self.select_node(matches[0])
            self.state_label.setText(f"{len(matches)} match(es) for '{text}'")
        else:
            self.state_label.setText(f"No node matches '{text}'")
