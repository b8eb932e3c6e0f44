"""Edge labels that cannot be misread: every bundled example, with values on, in each direction,
on screen and in the SVG export. No text box covers another text, a node or a module frame's
title, and each edge's label is nearer its own drawn line than any other edge's line."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PySide6.QtCore import QRectF

from core.layout.boxes import DIRECTIONS
from core.model.edge_marks import edge_mark_tip
from widgets.export import graph_export as export
from widgets.graph.items import edge_path
from widgets.graph.painting import text_metrics

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"
SVG = "{http://www.w3.org/2000/svg}"
NUM = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")
SKIPPED = ("32_", "50_", "51_")  # the allocator demo (no graph to label) and the big graphs
TOUCH = 0.5  # boxes overlapping by less than this (rounding) do not count


@pytest.fixture(scope="module")
def example_calls():
    """The first call with nodes of every bundled example that makes one."""
    capture = pytest.importorskip("core.worker.capture.recorder")
    out = {}
    for path in sorted(EXAMPLES.glob("*.py")):
        if path.stem.startswith(SKIPPED):
            continue
        call = next((c for c in capture.capture_script(str(path)).calls if c.nodes), None)
        if call is not None:
            out[path.stem] = call
    return out


def _rect(r: QRectF) -> tuple[float, float, float, float]:
    return r.left(), r.top(), r.right(), r.bottom()


def _overlap(a, b) -> bool:
    return a[0] + TOUCH < b[2] and b[0] + TOUCH < a[2] and a[1] + TOUCH < b[3] and b[1] + TOUCH < a[3]


def _line(item) -> list[tuple[float, float]]:
    """The edge's drawn line, sampled every 2 px or so (the painter's own path, not the placer's)."""
    path = edge_path(item.edge.points, item._curved, item._horizontal)
    n = max(40, int(path.length() / 2))
    return [(p.x(), p.y()) for p in (path.pointAtPercent(path.percentAtLength(path.length() * i / n))
                                     for i in range(n + 1))]


def _distance(line, r) -> float:
    return min(math.hypot(max(r[0] - x, 0, x - r[2]), max(r[1] - y, 0, y - r[3])) for x, y in line)


def scene_faults(view) -> list[str]:
    """What is wrong with the texts of a view's scene, in words (empty when nothing is)."""
    from widgets.graph.marks import TagItem
    from widgets.graph.teaching import NoteItem

    labels = [(e, _rect(e.label_rect())) for e in view.edge_items if e.label_size()[0]]
    notes = [(t, _rect(t.text_rect())) for t in view.marks.tags if isinstance(t, NoteItem)]
    tags = [(t, _rect(t.sceneBoundingRect().adjusted(1, 1, -1, -1))) for t in view.marks.tags if isinstance(t, TagItem)]
    boxes = [(f"node {b.id}", (b.x, b.y, b.x + b.w, b.y + b.h)) for b in view.graph_layout().nodes.values()]
    boxes += [(f"saved {s.node}.{s.name}", (s.x, s.y, s.x + s.w, s.y + s.h)) for s in view.graph_layout().saved]
    titles = [(f"title of {g.path}", _rect(g.title_rect())) for g in view.group_items.values()]
    texts = [(f"label {e.label_text()!r}", r) for e, r in labels] + [(f"note {t.lines!r}", r) for t, r in notes]
    tags = [(f"tag {t.text!r}", r) for t, r in tags]
    faults = []
    for i, (a, ra) in enumerate(texts):
        for b, rb in texts[i + 1:] + tags:
            if _overlap(ra, rb):
                faults.append(f"{a} overlaps {b}")
    for a, ra in texts:
        for b, rb in boxes + titles:
            if _overlap(ra, rb):
                faults.append(f"{a} covers {b}")
    faults += tag_faults(view)
    lines = {id(e): _line(e) for e in view.edge_items}
    for e, r in labels:
        own = _distance(lines[id(e)], r)
        for other in view.edge_items:
            if other is not e and other.key != e.key and _distance(lines[id(other)], r) <= own:
                faults.append(f"label {e.label_text()!r} of {e.key} is as near {other.key} as its own edge")
                break
    return faults


HANG = 6.0  # how far a tag's pill may reach over its own box's border (it hangs from it)


def tag_faults(view) -> list[str]:
    """Tags over node or saved boxes: a tag's pill may hang on its own box's border, no deeper,
    and covers no other box."""
    from widgets.graph.marks import TagItem

    layout = view.graph_layout()
    boxes = [(b.id, f"node {b.id}", (b.x, b.y, b.x + b.w, b.y + b.h)) for b in layout.nodes.values()]
    boxes += [(("saved", s.node, s.name), f"saved {s.node}.{s.name}", (s.x, s.y, s.x + s.w, s.y + s.h))
              for s in layout.saved]
    faults = []
    for t in view.marks.tags:
        if not isinstance(t, TagItem):
            continue
        r = _rect(t.sceneBoundingRect().adjusted(1, 1, -1, -1))
        for key, name, box in boxes:
            if _overlap(r, box) and not (key == t.target and min(r[3], box[3]) - max(r[1], box[1]) <= HANG):
                faults.append(f"tag {t.text!r} covers {name}")
    return faults


def svg_texts(path: Path) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Every <text> of an SVG with its box in the SVG's units (measured with the font it names);
    a line written in runs (a Greek letter starts a run of its own) is one text."""
    out = []
    for g in ET.parse(path).getroot().iter(SVG + "g"):
        m = g.get("transform") or "matrix(1,0,0,1,0,0)"
        a, _, _, d, e, f = (float(v) for v in NUM.findall(m))
        for ch in g:
            raw = (ch.text or "") if ch.tag == SVG + "text" else ""
            if not raw.strip():
                continue
            px = float(ch.get("font-size") or g.get("font-size"))
            fm = text_metrics(ch.get("font-family") or g.get("font-family"), round(px))
            x, y = float(ch.get("x")), float(ch.get("y"))
            box = (x, y - fm.ascent() + 1, x + fm.horizontalAdvance(raw), y + fm.descent() - 1)
            box = (a * box[0] + e, d * box[1] + f, a * box[2] + e, d * box[3] + f)
            last = out[-1] if out else None
            if last is not None and abs(last[1][1] - box[1]) < 0.1 and abs(last[1][2] - box[0]) < 1.0:
                out[-1] = (last[0] + raw, (last[1][0], last[1][1], box[2], last[1][3]))
            else:
                out.append((raw, box))
    return [_trimmed(t, r) for t, r in out]


def _trimmed(raw: str, box):
    """A text without the spaces around it, its box without theirs."""
    fm = text_metrics("DejaVu Sans", 9)
    left = (len(raw) - len(raw.lstrip())) * fm.horizontalAdvance(" ")
    right = (len(raw) - len(raw.rstrip())) * fm.horizontalAdvance(" ")
    return raw.strip(), (box[0] + left, box[1], box[2] - right, box[3])


def svg_faults(path: Path, placed: set[str], tags: set[str] = frozenset(), names: set[str] = frozenset()) -> list[str]:
    """Overlaps in an SVG between a placed text (an edge label or a note's line) and any other
    text, and between a tag's text and a node's (its name and label lines): a tag's pill may hang
    on its own node's border, its text never covers a node's."""
    texts = svg_texts(path)
    return [f"{a!r} overlaps {b!r}" for i, (a, ra) in enumerate(texts) for b, rb in texts[i + 1:]
            if (a in placed or b in placed or (a in tags and b in names) or (b in tags and a in names))
            and _overlap(ra, rb)]


def view_texts(view) -> tuple[set[str], set[str]]:
    """(the texts of a view's tags, the lines its nodes write: names and labels)."""
    from widgets.graph.marks import TagItem

    tags = {t.text for t in view.marks.tags if isinstance(t, TagItem)}
    return tags, {line for b in view.graph_layout().nodes.values() for line in b.label.split("\n")} - tags


@pytest.mark.parametrize("shapes", [False, True], ids=["values", "values+shapes"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_example_labels_its_own_edge_and_covers_nothing(example_calls, direction, shapes, tmp_path):
    assert len(example_calls) == 31 and "28_broadcasting_backward" in example_calls
    faults = {}
    labelled = 0
    for name, call in example_calls.items():
        with export.offscreen_view(call, values=True, direction=direction, show_shapes=shapes) as view:
            found = scene_faults(view)
            labels = [e.label_text() for e in view.edge_items if e.label_size()[0]]
            lines = {line for t in view.marks.tags for line in getattr(t, "lines", ())}
            labelled += len(labels)
            svg = export.render_svg(view, tmp_path / f"{name}.svg")
            drawn = [t for t, _ in svg_texts(svg)]
            found += [f"SVG: {f}" for f in svg_faults(svg, set(labels) | lines, *view_texts(view))]
            found += [f"SVG lacks the label {t!r}" for t in labels if t not in drawn]
        if found:
            faults[name] = found
    assert faults == {}
    assert labelled >= 140  # the examples' edges do carry labels


def test_broadcast_sum_and_its_value_are_one_label_on_their_own_edge(example_calls):
    call = example_calls["28_broadcasting_backward"]
    names = {n.id: n.name for n in call.nodes}
    with export.offscreen_view(call, values=True) as view:
        texts = {(names[e.edge.src], view.graph_layout().nodes[e.edge.dst].label.split("\n")[0]): e.label_text()
                 for e in view.edge_items}
        assert scene_faults(view) == []
        into_b = next(e for e in view.edge_items if e.label_text().endswith("= [8, 8, 8]"))
        add = call.node(into_b.edge.src)
        assert into_b.toolTip() == (edge_mark_tip(add.edge_marks[0])
                                    + "\n\nthe gradient AddBackward0 sent to AccumulateGrad in this call")
    assert texts == {
        ("SumBackward0", "MulBackward0"): "grad = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]",
        ("MulBackward0", "AddBackward0"): "grad = [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]",
        ("MulBackward0", "s"): "[4, 3] \u2192 \u03a3 \u2192 [] = 86.4",
        ("AddBackward0", "MmBackward0"): "grad = [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]",
        ("AddBackward0", "b"): "[4, 3] \u2192 \u03a3 \u2192 [3] = [8, 8, 8]",
        ("MmBackward0", "w"): "grad = [8, 8, 8, 8, 8, 8]",
    }


def test_a_retained_grad_is_written_beside_its_node(example_calls):
    call = example_calls["06_retain_grad"]
    hidden = next(n for n in call.nodes if n.label == "hidden")
    with export.offscreen_view(call, values=True) as view:
        notes = {tuple(t.lines): t for t in view.marks.tags if getattr(t, "target", None) == hidden.id}
        assert list(notes) == [("✂ Python number 3",), ("hidden.grad = 3",)]
        box = view.graph_layout().nodes[hidden.id]
        r = notes[("hidden.grad = 3",)].text_rect()
        gap = max(box.x - r.right(), r.left() - box.x - box.w, box.y - r.bottom(), r.top() - box.y - box.h)
        assert 0 < gap <= 6  # beside the box, not over it
        assert scene_faults(view) == []


def test_stepping_writes_only_the_stepped_gradients_and_labels_keep_clear(example_calls):
    """While a call is stepped its edges show what the steps sent, worded like the call's own
    gradients, and nothing from after the call; a leaf's chip that grows pushes labels aside."""
    from core.model.step_state import edge_text

    call = example_calls["28_broadcasting_backward"]
    names = {n.id: n.name for n in call.nodes}
    root = call.roots[0]
    first = next(n.node for n in call.node(root).next if n is not None)
    with export.offscreen_view(call, values=True) as view:
        view.set_node_states({root: "executed", first: "current"})
        view.update_step({}, {(root, first): edge_text({"numel": 12, "data": [1.0] * 12})})
        texts = {(names[e.edge.src], names[e.edge.dst]): e.label_text() for e in view.edge_items if e.label_text()}
        assert texts == {("SumBackward0", "MulBackward0"): "grad = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]",
                         ("MulBackward0", "AccumulateGrad"): "[4, 3] \u2192 \u03a3 \u2192 []",
                         ("AddBackward0", "AccumulateGrad"): "[4, 3] \u2192 \u03a3 \u2192 [3]"}
        assert scene_faults(view) == []
        view.clear_states()  # stepping over: the call's own gradients again
        assert next(e for e in view.edge_items if e.label_text().startswith("[4, 3] \u2192 \u03a3 \u2192 [3]")
                    ).label_text() == "[4, 3] \u2192 \u03a3 \u2192 [3] = [8, 8, 8]"


def test_a_leaf_chip_that_grows_while_stepping_pushes_labels_aside(example_calls):
    from widgets.graph.teaching import NoteItem

    call = example_calls["13_mlp_classifier"]
    with export.offscreen_view(call, values=True) as view:
        chips = [t for t in view.marks.tags if isinstance(t, NoteItem) and t.leaf]
        labels = [e for e in view.edge_items if e.label_size()[0]]
        # a chip with a label just below it, within its width
        chip, label = min(((c, e) for c in chips for e in labels
                           if e.label_rect().left() < c.text_rect().right() < e.label_rect().right() + 400
                           and e.label_rect().right() > c.text_rect().left()
                           and e.label_rect().top() >= c.text_rect().bottom()),
                          key=lambda p: p[1].label_rect().top() - p[0].text_rect().bottom())
        before = label.label_rect()
        more = int((before.bottom() - chip.text_rect().top()) // 12) + 2
        view.set_leaf_lines({chip.target: chip.lines + [f"line {i}" for i in range(more)]})
        assert chip.text_rect().intersects(before)  # the chip now reaches where the label was
        assert label.label_rect() != before
        assert scene_faults(view) == []


def test_labels_are_placed_anew_when_shapes_are_switched_on_over_values(example_calls):
    """On screen the toggles come one after the other: values first, then shapes, each one
    placing the labels again for their new texts."""
    faults = {}
    for name in ("13_mlp_classifier", "28_broadcasting_backward", "30_graph_leak", "41_model_build"):
        with export.offscreen_view(example_calls[name], values=True) as view:
            view.set_show_shapes(True)
            assert any(e.label_text().startswith("shape ") for e in view.edge_items), name
            found = scene_faults(view)
            view.set_show_shapes(False)
            found += scene_faults(view)
        if found:
            faults[name] = found
    assert faults == {}
