"""The forward replay's order and frames, on hand-made calls."""

from core.model.forward_order import forward_replay, replay_caption
from core.model.trace import CallInfo, Edge, NodeInfo


def _node(nid, name, nxt=(), seq=None, created=None, line=None):
    kind = "accumulate_grad" if name == "AccumulateGrad" else "backward"
    return NodeInfo(id=nid, name=name, kind=kind, next=[Edge(n, 0) if n else None for n in nxt], seq=seq,
                    created=created, line=line)


def _call(nodes):
    return CallInfo(id="c0", index=0, api="Tensor.backward", line=9, roots=[nodes[0].id], nodes=nodes, tensors=[])


def _mlp():
    """loss = (relu(x @ w1 + b1) @ w2).sum(), in preorder from the loss, as the capture numbers it."""
    return _call([
        _node("n0", "SumBackward0", ["n1"], seq=4, created=0.50, line=7),
        _node("n1", "MmBackward0", ["n2", "n6"], seq=3, created=0.40, line=6),
        _node("n2", "ReluBackward0", ["n3"], seq=2, created=0.30, line=5),
        _node("n3", "AddBackward0", ["n4", "n7"], seq=1, created=0.20, line=4),
        _node("n4", "MmBackward0", [None, "n5"], seq=0, created=0.10, line=4),
        _node("n5", "AccumulateGrad"),  # w1
        _node("n6", "AccumulateGrad"),  # w2
        _node("n7", "AccumulateGrad"),  # b1
    ])


def test_ops_go_by_sequence_number_with_each_leaf_at_its_first_consumer():
    replay = forward_replay(_mlp())
    assert [s.op for s in replay.steps] == ["n4", "n3", "n2", "n1", "n0"]
    assert [s.name for s in replay.steps] == ["MmBackward0", "AddBackward0", "ReluBackward0", "MmBackward0",
                                               "SumBackward0"]
    assert [s.leaves for s in replay.steps] == [("n5",), ("n7",), (), ("n6",), ()]
    assert [(s.line, s.created) for s in replay.steps] == [(4, 0.10), (4, 0.20), (5, 0.30), (6, 0.40), (7, 0.50)]
    assert replay.nodes_at(0) == frozenset()
    assert replay.nodes_at(1) == {"n4", "n5"}
    assert replay.nodes_at(2) == {"n4", "n5", "n3", "n7"}
    assert replay.nodes_at(3) == {"n4", "n5", "n3", "n7", "n2"}
    assert replay.nodes_at(4) == {"n4", "n5", "n3", "n7", "n2", "n1", "n6"}
    assert replay.nodes_at(5) == {f"n{i}" for i in range(8)}
    assert replay.changed(1, 4) == {"n3": True, "n7": True, "n2": True, "n1": True, "n6": True}
    assert replay.changed(4, 2) == {"n2": False, "n1": False, "n6": False}
    assert replay_caption(replay, 2) == "op 2 of 5: AddBackward0, line 4"


def test_equal_numbers_from_two_threads_go_by_creation_time():
    # two threads each made their first op (seq 0): the one made first comes first
    call = _call([
        _node("n0", "AddBackward0", ["n1", "n2"], seq=1, created=0.9, line=8),
        _node("n1", "MulBackward0", ["n3"], seq=0, created=0.6, line=5),
        _node("n2", "ExpBackward0", ["n3"], seq=0, created=0.3, line=3),
        _node("n3", "AccumulateGrad"),
    ])
    replay = forward_replay(call)
    assert [s.op for s in replay.steps] == ["n2", "n1", "n0"]
    assert [s.leaves for s in replay.steps] == [("n3",), (), ()]


def test_without_sequence_numbers_ops_go_in_topological_order_from_the_leaves():
    # an old trace: no seq, no created; (exp(a) * 2) + (b * 3) made left to right
    call = _call([
        _node("n0", "AddBackward0", ["n1", "n4"], line=4),
        _node("n1", "MulBackward0", ["n2", None], line=3),
        _node("n2", "ExpBackward0", ["n3"], line=3),
        _node("n3", "AccumulateGrad"),
        _node("n4", "MulBackward0", ["n5", None], line=4),
        _node("n5", "AccumulateGrad"),
    ])
    replay = forward_replay(call)
    assert [s.op for s in replay.steps] == ["n2", "n1", "n4", "n0"]
    assert [s.created for s in replay.steps] == [None, None, None, None]
    assert replay.nodes_at(1) == {"n2", "n3"}
    assert replay.nodes_at(3) == {"n2", "n3", "n1", "n4", "n5"}
    assert forward_replay(call) == replay  # stable


def test_an_op_without_a_time_keeps_the_last_time_known():
    call = _call([
        _node("n0", "SumBackward0", ["n1"], seq=2, created=0.7, line=6),
        _node("n1", "FBackward", ["n2"], seq=1, line=None),  # a custom Function's node: untagged
        _node("n2", "MulBackward0", ["n3"], seq=0, created=0.2, line=4),
        _node("n3", "AccumulateGrad"),
    ])
    replay = forward_replay(call)
    assert [(s.name, s.created) for s in replay.steps] == [("MulBackward0", 0.2), ("FBackward", 0.2),
                                                           ("SumBackward0", 0.7)]
    assert replay_caption(replay, 2) == "op 2 of 3: FBackward"


def test_a_call_without_ops_has_no_frames():
    leaf_only = _call([_node("n0", "AccumulateGrad")])
    assert len(forward_replay(leaf_only)) == 0 and forward_replay(None).steps == ()
    assert replay_caption(forward_replay(leaf_only), 1) == "no ops to replay"


def test_an_op_never_comes_before_an_input_another_thread_made():
    # a thread made n2 as its sixth op (seq 5); the main thread's second op (seq 1) consumed it
    call = _call([
        _node("n0", "AddBackward0", ["n1", "n2"], seq=1, created=0.8, line=9),
        _node("n1", "MulBackward0", ["n3"], seq=0, created=0.2, line=7),
        _node("n2", "ExpBackward0", ["n3"], seq=5, created=0.5, line=3),
        _node("n3", "AccumulateGrad"),
    ])
    assert [s.op for s in forward_replay(call).steps] == ["n1", "n2", "n0"]
