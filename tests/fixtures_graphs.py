"""Synthetic CallInfo objects with a known structure, built without torch.

Small graphs spell out every node; big ones follow ``resources/examples/50_big_residual_mlp.py``
(per block: AddBackward0 and ReluBackward0 in ``layers.N``, AddmmBackward0 and TBackward0 in
``layers.N.fc``, two AccumulateGrad leaves with module None, as the capture records them).
"""

from __future__ import annotations

from core.model.trace import CallInfo, Edge, ErrorInfo, NodeInfo, Saved, Stale, TensorInfo, Values


def tensor(
    tid: str,
    name: str | None,
    shape: list[int],
    *,
    requires_grad: bool = True,
    is_leaf: bool = True,
    grad_fn: str | None = None,
    retains_grad: bool = False,
) -> TensorInfo:
    numel = 1
    for s in shape:
        numel *= s
    stride, acc = [], 1
    for s in reversed(shape):
        stride.insert(0, acc)
        acc *= s
    return TensorInfo(
        id=tid,
        name=name,
        shape=list(shape),
        dtype="float32",
        device="cpu",
        requires_grad=requires_grad,
        is_leaf=is_leaf,
        retains_grad=retains_grad,
        stride=stride,
        storage_offset=0,
        storage=f"s_{tid}",
        version=0,
        values=Values(numel=numel),
        grad_fn=grad_fn,
        nbytes=4 * numel,
    )


def node(
    nid,
    name,
    nxt,
    *,
    kind="backward",
    variable=None,
    saved=(),
    label=None,
    tensor_id=None,
    module=None,
    line=None,
    stale=None,
):
    return NodeInfo(
        id=nid,
        name=name,
        kind=kind,
        next=[None if e is None else Edge(e[0], e[1]) if isinstance(e, tuple) else Edge(e, 0) for e in nxt],
        saved=list(saved),
        variable=variable,
        tensor=tensor_id,
        label=label,
        line=line,
        module=module,
        stale=stale,
    )


def leaf(nid, tid, label=None, module=None):
    return node(
        nid, "torch::autograd::AccumulateGrad", [], kind="accumulate_grad", variable=tid, label=label, module=module
    )


def call(nodes, tensors, roots, *, error=None, index=0, api="Tensor.backward") -> CallInfo:
    edges = sum(1 for n in nodes for e in n.next if e is not None)
    return CallInfo(
        id=f"c{index}",
        index=index,
        api=api,
        line=3,
        roots=list(roots),
        nodes=list(nodes),
        tensors=list(tensors),
        error=error,
        node_count=len(nodes),
        edge_count=edges,
    )


def mul_call() -> CallInfo:
    """``c = a * b; c.backward(torch.ones(3))``: MulBackward0 over two AccumulateGrad leaves."""
    tensors = [
        tensor("t_a", "a", [3]),
        tensor("t_b", "b", [3]),
        tensor("t_c", "c", [3], is_leaf=False, grad_fn="n0"),
    ]
    nodes = [
        node(
            "n0",
            "MulBackward0",
            ["n1", "n2"],
            saved=[Saved("other", "t_b"), Saved("self", "t_a")],
            label="c",
            tensor_id="t_c",
            line=3,
        ),
        leaf("n1", "t_a", "a"),
        leaf("n2", "t_b", "b"),
    ]
    return call(nodes, tensors, ["n0"])


def mlp_call(error: bool = False) -> CallInfo:
    """A two-layer MLP with a custom Function, a retained grad and inputs that need no grad.

    ``h = relu(fc1(x)); h.retain_grad(); s = Scale.apply(h); out = fc2(s); loss = mse(out, target)``
    """
    tensors = [
        tensor("t_x", "x", [4, 3], requires_grad=False),
        tensor("t_target", "target", [4, 2], requires_grad=False),
        tensor("t_w1", "fc1.weight", [8, 3]),
        tensor("t_b1", "fc1.bias", [8]),
        tensor("t_w2", "fc2.weight", [2, 8]),
        tensor("t_b2", "fc2.bias", [2]),
        tensor("t_h", "h", [4, 8], is_leaf=False, grad_fn="n6", retains_grad=True),
        tensor("t_s", "s", [4, 8], is_leaf=False, grad_fn="n5"),
        tensor("t_out", "out", [4, 2], is_leaf=False, grad_fn="n1"),
        tensor("t_loss", "loss", [], is_leaf=False, grad_fn="n0"),
    ]
    stale = Stale("result", 0, 1, "modified by an inplace operation", 7) if error else None
    nodes = [
        node(
            "n0",
            "MseLossBackward0",
            ["n1", None],
            saved=[Saved("self", "t_out"), Saved("target", "t_target")],
            label="loss",
            tensor_id="t_loss",
            line=9,
        ),
        node(
            "n1",
            "AddmmBackward0",
            ["n2", ("n5", 0), "n3"],
            saved=[Saved("mat1", "t_s"), Saved("alpha", value=1)],
            label="out",
            tensor_id="t_out",
            module="fc2",
            line=8,
        ),
        leaf("n2", "t_b2", "fc2.bias"),
        node("n3", "TBackward0", ["n4"], module="fc2", line=8),
        leaf("n4", "t_w2", "fc2.weight"),
        node("n5", "ScaleBackward", ["n6"], kind="custom", label="s", tensor_id="t_s", line=7),
        node(
            "n6",
            "ReluBackward0",
            ["n7"],
            saved=[Saved("result", "t_h")],
            label="h",
            tensor_id="t_h",
            module="act",
            line=6,
            stale=stale,
        ),
        node("n7", "AddmmBackward0", ["n8", None, "n9"], saved=[Saved("mat1", "t_x")], module="fc1", line=6),
        leaf("n8", "t_b1", "fc1.bias"),
        node("n9", "TBackward0", ["n10"], module="fc1", line=6),
        leaf("n10", "t_w1", "fc1.weight"),
    ]
    err = (
        ErrorInfo("RuntimeError", "one of the variables needed for gradient computation has been modified", 10)
        if error
        else None
    )
    return call(nodes, tensors, ["n0"], error=err)


def residual_mlp_call(blocks: int = 833, prefix: str = "layers") -> CallInfo:
    """``h = h + relu(fc(h))`` repeated, then ``loss = h.pow(2).mean()``: 6 * blocks + 2 nodes."""
    nodes: list[NodeInfo] = []
    tensors = [tensor("t_x", "x", [8, 64], requires_grad=False)]
    nodes.append(node("n0", "MeanBackward0", ["n1"], label="loss", line=30))
    nodes.append(node("n1", "PowBackward0", [f"add{blocks - 1}"], line=30))
    for i in range(blocks - 1, -1, -1):
        mod = f"{prefix}.{i}"
        prev = (f"add{i - 1}", 0) if i > 0 else None
        w, b = f"{mod}.fc.weight", f"{mod}.fc.bias"
        tensors += [tensor(f"tw{i}", w, [64, 64]), tensor(f"tb{i}", b, [64])]
        nodes += [
            node(f"add{i}", "AddBackward0", [prev, f"relu{i}"], module=mod, line=20),
            node(f"relu{i}", "ReluBackward0", [f"mm{i}"], module=mod, line=20),
            node(f"mm{i}", "AddmmBackward0", [f"b{i}", prev, f"t{i}"], module=f"{mod}.fc", line=20),
            leaf(f"b{i}", f"tb{i}", b),
            node(f"t{i}", "TBackward0", [f"w{i}"], module=f"{mod}.fc", line=20),
            leaf(f"w{i}", f"tw{i}", w),
        ]
    return call(nodes, tensors, ["n0"])


def rnn_call(steps: int = 12) -> CallInfo:
    """``h = tanh(h @ W + x[t] @ U)`` unrolled, then ``loss = h.sum()``: W and U feed every step,
    so their leaves sit at the bottom with long edges from each step (dummy points)."""
    tensors = [
        tensor("tW", "W", [16, 16]),
        tensor("tU", "U", [8, 16]),
        tensor("tx", "x", [steps, 8], requires_grad=False),
    ]
    nodes = [node("loss", "SumBackward0", [f"tanh{steps - 1}"], label="loss")]
    for t in range(steps - 1, -1, -1):
        prev = (f"tanh{t - 1}", 0) if t else None
        nodes += [
            node(f"tanh{t}", "TanhBackward0", [f"add{t}"], label="h"),
            node(f"add{t}", "AddBackward0", [f"mmh{t}", f"mmx{t}"]),
            node(f"mmh{t}", "MmBackward0", [prev, "W"]) if t else node(f"mmh{t}", "MmBackward0", [None, "W"]),
            node(f"mmx{t}", "MmBackward0", [None, "U"]),
        ]
    nodes += [leaf("W", "tW", "W"), leaf("U", "tU", "U")]
    return call(nodes, tensors, ["loss"])


def edge_count(c: CallInfo) -> int:
    return sum(1 for n in c.nodes for e in n.next if e is not None)


def transformer_call(blocks: int = 12, prefix: str = "transformer") -> CallInfo:
    """A GPT-2-like language model's backward graph (token and position embeddings, ``blocks``
    pre-norm blocks of attention and MLP with residual additions, a final norm, an LM head tied
    to the token embedding and a cross-entropy loss), about 45 nodes per block."""
    nodes: list[NodeInfo] = []
    tensors: list[TensorInfo] = []
    made: dict[str, int] = {}

    def op(name, module, inputs, label=None):
        k = made[name] = made.get(name, -1) + 1
        nid = f"{name[:-9].lower() if name.endswith('Backward0') else name.lower()}{k}"
        nodes.append(node(nid, name, list(inputs), module=module, label=label))
        return nid

    def param(name, shape):
        tid = "t_" + name
        tensors.append(tensor(tid, name, shape))
        nodes.append(leaf("p_" + name, tid, name))
        return "p_" + name

    def linear(mod, x, n_in=64, n_out=64):
        mm = op("AddmmBackward0", mod, [param(f"{mod}.bias", [n_out]), op("ViewBackward0", mod, [x]),
                                         param(f"{mod}.weight", [n_in, n_out])])
        return op("ViewBackward0", mod, [mm])

    def norm(mod, x):
        return op("NativeLayerNormBackward0", mod, [x, param(f"{mod}.weight", [64]), param(f"{mod}.bias", [64])])

    wte = param(f"{prefix}.wte.weight", [500, 64])
    h = op("AddBackward0", prefix, [op("EmbeddingBackward0", f"{prefix}.wte", [wte]),
                                    op("EmbeddingBackward0", f"{prefix}.wpe", [param(f"{prefix}.wpe.weight", [32, 64])])])
    for i in range(blocks):
        m = f"{prefix}.h.{i}"
        a = f"{m}.attn"
        split = op("SplitBackward0", a, [linear(f"{a}.c_attn", norm(f"{m}.ln_1", h), 64, 192)])
        q, k, v = (op("PermuteBackward0", a, [op("ViewBackward0", a, [split])]) for _ in range(3))
        scores = op("DivBackward0", a, [op("BmmBackward0", a, [q, op("TransposeBackward0", a, [k])])])
        probs = op("SoftmaxBackward0", a, [op("WhereBackward0", a, [scores])])
        ctx = op("ViewBackward0", a, [op("PermuteBackward0", a, [op("BmmBackward0", a, [probs, v])])])
        h = op("AddBackward0", m, [h, linear(f"{a}.c_proj", ctx)])
        act = op("GeluBackward0", f"{m}.mlp.act", [linear(f"{m}.mlp.c_fc", norm(f"{m}.ln_2", h), 64, 256)])
        h = op("AddBackward0", m, [h, linear(f"{m}.mlp.c_proj", act, 256, 64)])
    h = norm(f"{prefix}.ln_f", h)
    logits = op("MmBackward0", "lm_head", [op("ViewBackward0", "lm_head", [h]), op("TBackward0", "lm_head", [wte])])
    loss = op("NllLossBackward0", None, [op("LogSoftmaxBackward0", None, [op("ViewBackward0", None, [logits])])],
              label="loss")
    order = {n.id: i for i, n in enumerate(nodes)}
    nodes.sort(key=lambda n: -order[n.id])  # consumers before their inputs, the loss first
    return call(nodes, tensors, [loss])


def step_record(index: int, node: NodeInfo) -> dict:
    """The record a worker sends when backward runs ``node`` as step ``index``: every gradient,
    a leaf's too, the one number ``index``."""
    record = {"index": index, "node": node.id, "name": node.name,
              "grad_inputs": [{"numel": 1, "data": [float(index)]} for _ in node.next]}
    if node.kind == "accumulate_grad":
        record["leaf_grads"] = {node.label: {"numel": 1, "data": [float(index)]}}
    return record
