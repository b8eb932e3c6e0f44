"""One parser for the whole command line: its commands, the default one, and words that are neither."""

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "resources" / "examples" / "01_multiply.py"


def _help_of(capsys, *words) -> str:
    from app.main import main

    assert main([*words, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width


@pytest.mark.parametrize("command", ["open", "view", "trace", "step", "export", "hosts", "hosts add",
                                     "hosts check"])
def test_each_command_help_shows_its_options_with_their_help(capsys, command):
    from app.cli.commands import build_parser, command_parser

    parser = command_parser(build_parser(), command.split()[0])
    if " " in command:
        parser = command_parser(parser, command.split()[1])
    text = _help_of(capsys, *command.split())
    assert text.startswith(f"usage: backprop-studio {command} [-h]")
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        words = " ".join(action.help.split()).split("%(")[0]
        assert words and words in text, (command, action.dest)
        for option in action.option_strings:
            assert option in text


@pytest.mark.parametrize("command", ["trace", "step", "export"])
def test_run_commands_help_names_the_model_options(capsys, command):
    text = _help_of(capsys, command)
    assert ("--weights FILE a state_dict or .safetensors file to load into the model the script defines"
            in text)
    assert "--input-shape SHAPE input shape for a TorchScript archive or pickled model, e.g. 2,4" in text
    assert ("--trust-pickle allow a whole pickled model (torch.save(model)); loading it runs code from the "
            "file") in text


def test_help_window_and_help_command_open_a_command_help(capsys):
    assert _help_of(capsys, "open") == _help_of(capsys, "--help-window").removesuffix(" --help")
    from app.main import command_argv

    names = ["open", "view", "trace", "step", "export", "hosts"]
    assert command_argv(["help", "trace"], names) == ["trace", "--help"]
    assert command_argv(["help"], names) == ["--help"]
    assert command_argv(["--help-window"], names) == ["open", "--help"]


def test_an_unknown_word_that_is_no_file_is_named(capsys, tmp_path, monkeypatch):
    from app.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["trase", "x.py"]) == 2
    assert capsys.readouterr().err == (
        "backprop-studio: 'trase' is neither a command (open, view, trace, step, export, hosts) nor a file; "
        "did you mean 'trace'?\n"
        "Run 'backprop-studio --help' for the commands, 'backprop-studio SCRIPT' to open a script.\n")
    assert main(["frobnicate"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "backprop-studio: 'frobnicate' is neither a command (open, view, trace, step, export, hosts) nor a file")


@pytest.fixture
def window_calls(monkeypatch):
    """What app.main hands the window, instead of opening one."""
    import app.gui

    calls = []
    monkeypatch.setattr(app.gui, "main", lambda args, view=False: calls.append((args, view)) or 0)
    return calls


def test_a_script_without_a_command_opens_in_the_window(window_calls, tmp_path, monkeypatch):
    from app.main import main

    assert main([str(EXAMPLE), "--device", "cpu", "--weights", "w.pt"]) == 0
    assert main([]) == 0
    assert main(["view", "t.json", "--screenshot", "o.png"]) == 0
    assert main(["--screenshot", "shot.png"]) == 0
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trase").write_text("import torch\n")  # a file of that name is a file
    assert main(["trase"]) == 0
    (first, view1), (bare, view2), (saved, view3), (shot, view4), (word, view5) = window_calls
    assert (first.command, first.script, first.device, first.weights, view1) == ("open", str(EXAMPLE), "cpu",
                                                                                "w.pt", False)
    assert (bare.command, bare.script, bare.device, bare.timeout, view2) == ("open", None, None, 600.0, False)
    assert (saved.command, saved.script, saved.screenshot, view3) == ("view", "t.json", "o.png", True)
    assert (shot.script, shot.screenshot, view4) == (None, "shot.png", False)
    assert (word.command, word.script, view5) == ("open", "trase", False)

