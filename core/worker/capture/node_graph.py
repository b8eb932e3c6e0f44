"""The live autograd graph as the capture, the stepper and the memory report all see it.

Which node a backward call starts from (``root_nodes``), the one numbering of nodes they
share (``number_nodes``, DFS preorder with an explicit stack), node names and kinds, and the
finishing touches a snapshot gets from its tensors (``label_nodes``: script names, lines
inherited by nodes made inside C++ ops, multi-output labels).
"""

from __future__ import annotations

import torch

from core.model.trace import NodeInfo, TensorInfo, with_fields

_saved_attrs_cache: dict[type, tuple[str, ...]] = {}


def saved_attr_names(node) -> tuple[str, ...]:
    cls = type(node)
    names = _saved_attrs_cache.get(cls)
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_saved_"))
        _saved_attrs_cache[cls] = names
    return names


def grad_fn_of(t: torch.Tensor):
    """``t.grad_fn``, or None where reading it would raise.

    Reading the grad_fn of a view made under ``no_grad`` whose base was later changed in
    place with grad mode on raises, although the script itself never reads it (BERT's
    weight initialisation does this). Capture must not turn that into the script's error.
    """
    try:
        if not t.requires_grad:
            return None
        return t.grad_fn
    except Exception:  # also a tensor subclass of the script's whose attributes raise
        return None


def plain_ints(sizes) -> list[int]:
    """Sizes (a Size, a stride) as plain ints: a symbolic size (the ragged dim of a jagged nested
    tensor, ``j1``) has no one value and gives 0, where ``int()`` would raise or guard on it."""
    return [s if type(s) is int else _hint(s) for s in sizes]


def _hint(s) -> int:
    try:
        hint = s.node.hint
        return int(hint) if hint is not None else 0
    except Exception:
        return 0


def shape_of(t: torch.Tensor) -> list[int]:
    """``list(t.shape)`` as plain ints, where it can be read. A nested tensor's ragged dims (which
    have no one size) give its largest component's size, as ``torch.nested.to_padded_tensor``
    would; a shape that cannot be read at all (a tensor subclass whose ``shape`` raises) is []."""
    try:
        if t.is_nested:
            return _nested_shape(t)
        return plain_ints(t.shape)
    except Exception:
        return []


def _nested_shape(t: torch.Tensor) -> list[int]:
    if t.layout == torch.jagged:
        shape = plain_ints(t.shape)
        lengths = t.offsets().diff() if t.lengths() is None else t.lengths()
        shape[t._ragged_idx] = int(lengths.max()) if lengths.numel() else 0
        return shape
    sizes = t._nested_tensor_size()  # strided layout: one row of sizes per component
    widest = sizes.amax(0).tolist() if sizes.numel() else [0] * (t.dim() - 1)
    return [t.size(0)] + [int(s) for s in widest]


def version_of(t: torch.Tensor) -> int:
    """``t._version``; 0 for an inference tensor (made under ``torch.inference_mode()``), which
    has no version counter and raises when asked for it."""
    try:
        return 0 if t.is_inference() else t._version
    except Exception:
        return 0


def node_kind(node) -> str:
    name = node.name()
    if name == "torch::autograd::AccumulateGrad" or name == "AccumulateGrad":
        return "accumulate_grad"
    if isinstance(node, torch.autograd.function.BackwardCFunction):
        return "custom"
    return "backward"


def node_name(node) -> str:
    name = node.name()
    if name.startswith("torch::autograd::"):
        name = name[len("torch::autograd::"):]
    return name


def root_nodes(roots) -> list:
    """The graph nodes of backward roots: a tensor's grad_fn (its AccumulateGrad for a leaf), a
    GradientEdge's node, or a node itself. The capture, the stepper and the memory report all
    start from these, so a call's graph is the same graph everywhere."""
    out = []
    for r in roots:
        if isinstance(r, torch.autograd.graph.GradientEdge):
            node = r.node
        elif isinstance(r, torch.Tensor):
            node = r.grad_fn
            if node is None and r.requires_grad:
                node = torch.autograd.graph.get_gradient_edge(r).node
        else:
            node = r if hasattr(r, "next_functions") else None
        if node is not None:
            out.append(node)
    return out


def number_nodes(roots: list) -> tuple[list, dict[int, str]]:
    """Nodes in DFS preorder (explicit stack, no recursion) with ids "n0", "n1", ...

    The capture, the stepper and the memory report all number nodes this way, so their ids
    agree. The returned list keeps the node wrappers alive, so the ``id()`` keys stay valid.
    """
    ids: dict[int, str] = {}
    order: list = []
    stack = [r for r in reversed(roots) if r is not None]
    while stack:
        node = stack.pop()
        if id(node) in ids:
            continue
        ids[id(node)] = f"n{len(ids)}"
        order.append(node)
        for fn, _ in reversed(node.next_functions):
            if fn is not None and id(fn) not in ids:
                stack.append(fn)
    return order, ids


def inherit_origin(nodes: list[NodeInfo]) -> list[NodeInfo]:
    """Nodes made inside C++ ops (the TBackward0 of a Linear) take their consumer's line and module."""
    line: dict[str, int | None] = {n.id: n.line for n in nodes}
    module: dict[str, str | None] = {n.id: n.module for n in nodes}
    custom = {n.id for n in nodes if n.kind == "custom"}  # Function.apply runs where it is called, not inside
    for n in nodes:  # walk order lists a node before its inputs
        for e in n.next:
            if e is None or e.node in custom:
                continue
            if line.get(e.node) is None and line[n.id] is not None:
                line[e.node] = line[n.id]
                if module.get(e.node) is None:
                    module[e.node] = module[n.id]
    return [
        n if n.kind == "accumulate_grad" or (n.line == line[n.id] and n.module == module[n.id])
        else with_fields(n, line=line[n.id], module=module[n.id])
        for n in nodes
    ]


def label_nodes(nodes: list[NodeInfo], tensors: list[TensorInfo]) -> list[NodeInfo]:
    """Give each node the script name of the tensor whose grad_fn it is."""
    by_node: dict[str, TensorInfo] = {}
    for t in tensors:
        if t.grad_fn is not None and (t.name or t.grad_fn not in by_node):
            if t.grad_fn not in by_node or (t.name and not by_node[t.grad_fn].name):
                by_node[t.grad_fn] = t
    names = {t.id: t.name for t in tensors}
    outputs = multi_output_labels(tensors)
    nodes = inherit_origin(nodes)
    out = []
    for n in nodes:
        t = by_node.get(n.id)
        if t is not None:
            n = with_fields(n, tensor=t.id, label=outputs.get(n.id, t.name))
        elif n.variable is not None:
            n = with_fields(n, label=names.get(n.variable))
        out.append(n)
    return out


def multi_output_labels(tensors: list[TensorInfo]) -> dict[str, str]:
    """Node id -> 'values, indices' for nodes that made several named outputs, in output order."""
    found: dict[str, dict[int, str]] = {}
    for t in tensors:
        if t.grad_fn is not None and t.name:
            found.setdefault(t.grad_fn, {}).setdefault(t.output_nr or 0, t.name)
    return {nid: ", ".join(by_nr[k] for k in sorted(by_nr)) for nid, by_nr in found.items() if len(by_nr) > 1}


def gradient_node(t: torch.Tensor):
    """The node a gradient for ``t`` reaches: its grad_fn, or a leaf's AccumulateGrad (None when
    it requires no grad)."""
    fn = grad_fn_of(t)
    if fn is not None:
        return fn
    try:
        if t.requires_grad and t.is_leaf:
            return torch.autograd.graph.get_gradient_edge(t).node
    except Exception:  # a tensor subclass of the script's whose attributes raise
        pass
    return None
