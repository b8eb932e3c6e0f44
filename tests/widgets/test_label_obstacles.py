"""What edge labels keep off besides boxes and notes (the storage names on sharing links), and
tags that cover no node's text: every bundled example in each direction, with sharing on and
saved boxes shown (see ``test_label_placement`` for the rules)."""

from __future__ import annotations

from core.layout.boxes import DIRECTIONS
from tests.widgets.test_label_placement import (  # noqa: F401
    _overlap,
    _rect,
    example_calls,
    scene_faults,
    svg_faults,
    tag_faults,
    view_texts,
)
from widgets.export import graph_export as export
from widgets.graph.labels import segment_rect_distance


def link_faults(view) -> list[str]:
    """Edge labels over the storage names of sharing links (the pill in the middle of each link),
    or crossed by a link's dashed line."""
    links = [(link.storage, _rect(link.label_obstacle())) for link in view.marks.links]
    labels = [(e, _rect(e.label_rect())) for e in view.edge_items if e.label_size()[0]]
    faults = [f"label {e.label_text()!r} of {e.key} covers storage {s!r}" for e, r in labels for s, rs in links
              if _overlap(r, rs)]
    for link in view.marks.links:
        pieces = [((a.x(), a.y(), b.x(), b.y())) for poly in link._path.toSubpathPolygons()
                  for a, b in zip(poly, list(poly)[1:])]
        faults += [f"label {e.label_text()!r} of {e.key} is crossed by the link of {link.storage!r}"
                   for e, r in labels if any(segment_rect_distance(p, r) == 0 for p in pieces)]
    return faults


# With sharing on, the storage names on the links take the last spots beside these fanned-out
# edges: three edges leave one node, and the label of the middle one finds no spot nearer
# its own edge than a neighbour's, or clear of the links. It takes its shortest form and covers
# no text.
SHARED_NO_ROOM = {("14_checkpointing", "TB"): ("n1", "n3"), ("14_checkpointing", "forward"): ("n1", "n3"),
                  ("40_model_small_cnn", "TB"): ("n6", "n12"), ("41_model_build", "TB"): ("n4", "n9"),
                  ("41_model_build", "LR"): ("n4", "n9"), ("41_model_build", "forward"): ("n4", "n9"),
                  ("36_amp_skip", "TB"): ("n4", "n5"), ("36_amp_skip", "forward"): ("n4", "n5")}


def test_edge_labels_keep_off_the_storage_names_of_sharing_links(example_calls):
    faults = {}
    linked = set()
    for name, call in example_calls.items():
        for direction in DIRECTIONS:
            with export.offscreen_view(call, values=True, direction=direction) as view:
                view.set_show_sharing(True)
                if view.marks.links:
                    linked.add(name)
                found = link_faults(view) + scene_faults(view)
                cramped = SHARED_NO_ROOM.get((name, direction))
                if cramped is not None:
                    edge = next(e for e in view.edge_items if e.key == cramped)
                    assert edge.label_text() == edge.label_forms()[-1], (name, direction, edge.label_text())
                    found = [f for f in found if f" of {cramped} is " not in f]
            if found:
                faults[(name, direction)] = found
    assert faults == {}
    assert len(linked) >= 21 and {"03_second_order", "15_hooks", "40_model_small_cnn"} <= linked


def test_a_gradient_label_moves_off_the_storage_it_would_cover(example_calls):
    """03_second_order: x and the PowBackward0 output share storage s1, whose name sits on the
    edge the gradient 12 runs along; with sharing on, the label steps aside."""
    call = example_calls["03_second_order"]
    with export.offscreen_view(call, values=True) as view:
        edge = next(e for e in view.edge_items if e.label_size()[0])
        assert (edge.label_text(), _rect(edge.label_rect())) == ("grad = 12", (21.71875, 86.7734375, 75.0, 99.2265625))
        view.set_show_sharing(True)
        [link] = view.marks.links
        assert (link.storage, _rect(link.label_obstacle())) == ("s1", (43.171875, 86.0, 63.578125, 100.0))
        edge = next(e for e in view.edge_items if e.label_size()[0])
        assert (edge.label_text(), _rect(edge.label_rect())) == ("grad = 12", (81.0, 86.7734375, 134.28125, 99.2265625))
        assert link_faults(view) == [] and scene_faults(view) == []


def test_tags_cover_no_node_text_with_sharing_and_saved_boxes_on(example_calls, tmp_path):
    """A view tag names the base of a saved tensor beside its saved box; no tag's text covers a
    node's name or label, on screen or in the SVG."""
    faults = {}
    tagged = 0
    for name, call in example_calls.items():
        for direction in DIRECTIONS:
            with export.offscreen_view(call, values=True, direction=direction, show_saved=True) as view:
                view.set_show_sharing(True)
                tags, names = view_texts(view)
                tagged += len(tags)
                found = tag_faults(view)
                svg = export.render_svg(view, tmp_path / f"{name}-{direction}.svg")
                found += [f"SVG: {f}" for f in svg_faults(svg, set(), tags, names)]
            if found:
                faults[(name, direction)] = found
    assert faults == {}
    assert tagged >= 90


def test_a_saved_boxs_view_tag_squeezed_between_nodes_stands_over_it(example_calls):
    """11_linear_regression_scratch: MulBackward0's saved ``self`` (a view of x) sits between
    MulBackward0 and the leaf b; its tag goes above the saved box, not over b's name."""
    call = example_calls["11_linear_regression_scratch"]
    with export.offscreen_view(call, values=True, show_saved=True) as view:
        view.set_show_sharing(True)
        saved = next(s for s in view.graph_layout().saved if (s.node, s.name) == ("n4", "self"))
        assert (saved.x, saved.y, saved.x + saved.w, saved.y + saved.h) == (140.0, 382.5, 198.4, 399.5)
        b = view.graph_layout().nodes["n6"]
        assert b.label == "b\nshape 1" and (b.x, b.y) == (224.39999999999998, 368.0)
        [tag] = [t for t in view.marks.tags if getattr(t, "target", None) == ("saved", "n4", "self")]
        assert tag.text == "view of a 100 tensor"
        assert _rect(tag.sceneBoundingRect()) == (117.1609375, 355.5, 221.2390625, 371.5)
        assert tag_faults(view) == []


def test_every_label_lies_inside_the_scene_so_it_can_be_scrolled_to(example_calls):
    """A label placed beside an edge on the graph's side reaches past the boxes: the scene (what
    the view scrolls over) grows to hold it, as it does for notes."""
    outside = {}
    for name, call in example_calls.items():
        for direction in DIRECTIONS:
            with export.offscreen_view(call, values=True, direction=direction) as view:
                scene = view.scene().sceneRect()
                found = [e.label_text() for e in view.edge_items
                         if e.label_size()[0] and not scene.contains(e.label_rect())]
                found += [str(t.lines) for t in view.marks.tags if hasattr(t, "lines")
                          and not scene.contains(t.text_rect())]
            if found:
                outside[(name, direction)] = found
    assert outside == {}


def test_a_label_past_the_graphs_side_widens_the_scene(example_calls):
    """13_mlp_classifier: the gradient into fc1.bias is written left of its edge, past the graph's
    left side (the fc1.bias chip is there, right of it)."""
    call = example_calls["13_mlp_classifier"]
    with export.offscreen_view(call, values=True) as view:
        edge = next(e for e in view.edge_items if e.label_text().startswith("grad = [-0.01795, 0.03569"))
        assert edge.label_text() == "grad = [-0.01795, 0.03569, 0.04663, 0.03086, …] (16 values)"
        assert _rect(edge.label_rect()) == (-205.84735460058266, 732.429455991217, 80.18389539941734, 744.882580991217)
        assert view.scene().sceneRect().left() == -211.84735460058266  # with the scene's 6 px margin


def test_a_failed_ops_mark_covers_no_node_or_its_text(tmp_path):
    """The mark of the op a forward pass raised in stands above its inputs, or beside them when a
    consumer is in the way: in each direction it covers no box and no node's text."""
    from tests.widgets import test_forward_error_marks as failed

    faults = {}
    for make in (failed.leaf_inplace, failed.numpy_on_grad, failed.mm_mismatch,
                 failed.device_mismatch_under_a_consumer):
        for direction in DIRECTIONS:
            with export.offscreen_view(make(), values=True, direction=direction) as view:
                tags, names = view_texts(view)
                assert len(tags) == 1 and tags.pop().startswith(make().options["failed_op"]["text"] + " failed: ")
                found = tag_faults(view) + scene_faults(view)
                svg = export.render_svg(view, tmp_path / f"{make.__name__}-{direction}.svg")
                found += [f"SVG: {f}" for f in svg_faults(svg, set(), *view_texts(view))]
            if found:
                faults[(make.__name__, direction)] = found
    assert faults == {}
