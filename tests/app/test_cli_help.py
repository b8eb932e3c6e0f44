"""Every command-line option says what it does, and trace, step and export take the same model options."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _parsers():
    """(name, parser) of the headless commands, their subcommands, the window's and ``view``'s."""
    from app.cli.commands import build_parser
    from app.gui import build_parser as window_parser

    found = [("window", window_parser()), ("view", window_parser(view=True))]
    stack = [("", build_parser())]
    while stack:
        name, parser = stack.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend((f"{name} {sub}".strip(), p) for sub, p in action.choices.items())
        if name:
            found.append((name, parser))
    return found


def _unhelped(parser: argparse.ArgumentParser) -> list[str]:
    return [action.dest for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
            and not (action.help or "").strip()]


def test_every_option_of_every_command_has_help():
    parsers = dict(_parsers())
    assert {"trace", "step", "export", "hosts", "hosts add", "hosts check", "window", "view"} <= set(parsers)
    missing = {name: _unhelped(p) for name, p in parsers.items() if _unhelped(p)}
    assert missing == {}


def test_view_help_asks_for_a_saved_trace_not_a_bundled_example():
    from app.gui import build_parser

    text = build_parser(view=True).format_help()
    assert "bundled example" not in text
    assert "usage: backprop-studio view [-h]" in text and "TRACE.json" in text
    assert "[TRACE.json]" not in text  # required, not optional
    assert "--weights" not in text and "--timeout" not in text  # nothing runs
    with pytest.raises(SystemExit):
        build_parser(view=True).parse_args([])
    args = build_parser(view=True).parse_args(["t.json", "--screenshot", "o.png"])
    assert (args.script, args.screenshot, args.device, args.timeout) == ("t.json", "o.png", None, 600.0)


def test_mode_help_names_each_choice():
    from app.cli.commands import build_parser

    help_text = build_parser()._subparsers._group_actions[0].choices["trace"].format_help()
    mode = help_text.split("--mode")[1]
    assert "auto" in mode and "model runs a model file's forward" in " ".join(help_text.split())


def test_trace_step_and_export_take_the_same_model_options():
    from app.cli.commands import build_parser

    choices = build_parser()._subparsers._group_actions[0].choices
    wanted = {"--device", "--mode", "--timeout", "--weights", "--input-shape", "--trust-pickle"}
    for name in ("trace", "step", "export"):
        options = {s for a in choices[name]._actions for s in a.option_strings}
        assert wanted <= options, (name, wanted - options)
    args = choices["export"].parse_args(["m.ts", "-o", "o.json", "--input-shape", "2,4", "--trust-pickle",
                                         "--weights", "w.pt"])
    assert (args.input_shape, args.trust_pickle, args.weights) == (["2,4"], True, "w.pt")


@pytest.mark.slow
def test_export_of_a_torchscript_archive_uses_input_shape(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    archive = tmp_path / "mlp.ts"
    torch.jit.script(model).save(str(archive))
    out = tmp_path / "mlp.json"
    result = subprocess.run([sys.executable, "main.py", "export", str(archive), "-o", str(out),
                             "--input-shape", "6,4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["error"] is None
    names = sorted(n["name"] for n in data["calls"][0]["nodes"])
    assert names.count("AccumulateGrad") == 4 and "TanhBackward0" in names


def test_page_help_tells_the_slide_and_paper_minimums():
    from app.cli.commands import build_parser
    from widgets.export.page import MIN_PAGE_TEXT, MIN_SLIDE_TEXT, OPEN_VALUES_NODES, PAGES

    export = build_parser()._subparsers._group_actions[0].choices["export"]
    page = " ".join(next(a for a in export._actions if a.dest == "page").help.split())
    assert "below 9 px" not in page
    slide_px = MIN_SLIDE_TEXT * PAGES["16:9"][0][0] / PAGES["16:9"][1][0]
    assert (slide_px, MIN_PAGE_TEXT, OPEN_VALUES_NODES) == (20.0, 9.0, 40)
    assert page == ("fit a slide (16:9 is 1920x1080 in PNG) or a portrait page. On a slide, text stays at 10 "
                    "pt of the slide or more (20 px at 1920x1080): the graph is spaced compactly unless what "
                    "is written along its edges needs more room, and modules fold before text gets smaller; "
                    "only a graph that folded would still show just its part around the loss goes down to 9 "
                    "pt. On paper, modules fold rather than text going below 9 pt (9 px in PNG). With "
                    "--values, graphs of up to 40 nodes stay unfolded")
