"""Graph questions answered with networkx: ancestors, descendants, loss-to-leaf paths, call diffs."""

import textwrap

import pytest

from core.model.graph_query import ancestors, compare_calls, descendants, loss_to_leaf_paths, path_edges, same_structure
from tests.fixtures_graphs import call, leaf, node, residual_mlp_call, tensor


def shared_call():
    """``y = x * w; loss = (y + y.exp()).sum()``: y's MulBackward0 feeds both branches."""
    tensors = [tensor("tx", "x", [3]), tensor("tw", "w", [3]), tensor("tb", "b", [3])]
    nodes = [
        node("n0", "SumBackward0", ["n1"], label="loss"),
        node("n1", "AddBackward0", ["n2", "n3"]),
        node("n2", "MulBackward0", ["n4", "n5"], label="y"),
        node("n3", "ExpBackward0", ["n2"]),
        leaf("n4", "tx", "x"),
        leaf("n5", "tw", "w"),
        node("n6", "NegBackward0", ["n7"]),  # a second root, unrelated
        leaf("n7", "tb", "b"),
    ]
    return call(nodes, tensors, ["n0", "n6"])


def test_descendants_and_ancestors_of_a_shared_subexpression():
    c = shared_call()
    assert descendants(c, "n2") == {"n4", "n5"}
    assert descendants(c, "n1") == {"n2", "n3", "n4", "n5"}
    assert ancestors(c, "n2") == {"n0", "n1", "n3"}
    assert ancestors(c, "n5") == {"n0", "n1", "n2", "n3"}
    assert ancestors(c, "n7") == {"n6"}
    assert descendants(c, "n4") == set()


def test_loss_to_leaf_paths_go_through_both_branches():
    c = shared_call()
    paths = loss_to_leaf_paths(c, "n5")
    assert paths == [["n0", "n1", "n2", "n5"], ["n0", "n1", "n3", "n2", "n5"]]
    assert path_edges(paths) == {("n0", "n1"), ("n1", "n2"), ("n2", "n5"), ("n1", "n3"), ("n3", "n2")}
    assert loss_to_leaf_paths(c, "n7") == [["n6", "n7"]]
    assert len(loss_to_leaf_paths(c, "n5", limit=1)) == 1


def test_diff_of_a_deeper_call_lists_the_added_blocks():
    a, b = residual_mlp_call(3), residual_mlp_call(5)
    d = compare_calls(a, b)
    assert not d.same_structure
    b_nodes = {n.id: n for n in b.nodes}
    assert sorted(d.added_nodes) == sorted(f"{k}{i}" for i in (3, 4) for k in ("add", "relu", "mm", "b", "t", "w"))
    assert d.removed_nodes == []
    assert {b_nodes[n].module for n in d.added_nodes} >= {"layers.3", "layers.4.fc"}
    assert len(d.added_edges) == 15 and ("n1", "add4") in d.added_edges
    assert d.removed_edges == [("n1", "add2")]
    assert d.summary() == "12 nodes added, 15 edges added, 1 edge removed"
    back = compare_calls(b, a)
    assert sorted(back.removed_nodes) == sorted(d.added_nodes)


def test_same_structure_is_verified_not_assumed():
    assert same_structure(residual_mlp_call(4), residual_mlp_call(4))
    assert compare_calls(residual_mlp_call(4), residual_mlp_call(4)).summary().startswith("same structure")
    a = shared_call()
    # Same node names and edge count, different wiring: Exp reads x instead of y.
    nodes = [n if n.id != "n3" else node("n3", "ExpBackward0", ["n4"]) for n in a.nodes]
    b = call(nodes, a.tensors, ["n0", "n6"])
    assert not same_structure(a, b)
    d = compare_calls(a, b)
    assert d.added_edges == [("n3", "n4")] and d.removed_edges == [("n3", "n2")]


def test_calls_of_a_script_whose_depth_changes(tmp_path):
    pytest.importorskip("torch")
    from core.worker.capture.recorder import capture_script

    script = tmp_path / "dynamic.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))

            def forward(self, x, depth):
                for layer in self.layers[:depth]:
                    x = torch.tanh(layer(x))
                return x

        net = Net()
        for depth in (2, 4, 2):
            loss = net(torch.ones(3, 4), depth).sum()
            loss.backward()
    """))
    trace = capture_script(str(script))
    c0, c1, c2 = trace.calls[:3]
    d = compare_calls(c0, c1)
    assert not d.same_structure and d.removed_nodes == []
    leaves = sorted(c1.tensor(c1.node(n).variable).name for n in d.added_nodes if c1.node(n).kind == "accumulate_grad")
    assert leaves == ["layers.2.bias", "layers.2.weight", "layers.3.bias", "layers.3.weight"]
    ops = sorted((c1.node(n).name, c1.node(n).module) for n in d.added_nodes if c1.node(n).kind != "accumulate_grad")
    assert ops == [("AddmmBackward0", "layers.2"), ("AddmmBackward0", "layers.3"),
                   ("TBackward0", "layers.2"), ("TBackward0", "layers.3"), ("TanhBackward0", None), ("TanhBackward0", None)]
    assert compare_calls(c0, c2).same_structure
