"""Hostile file names and notebook text: what the app runs is only what Python would run."""

import ast
import json

import pytest

from core.programs.model_files import driver_source
from core.programs.notebook import notebook_script, python_lines

# Each name breaks a line in its own way; what follows the break would be code if it left the comment.
PAYLOAD = "open('PWNED', 'w').write('ran')"
BREAKS = ["\n", "\r", "\r\n", "\u2028", "\x0c", "\x85"]


def _statements(source: str) -> list[str]:
    return [type(node).__name__ for node in ast.parse(source).body]


@pytest.mark.parametrize("brk", BREAKS, ids=[repr(b) for b in BREAKS])
def test_a_model_files_name_stays_in_the_drivers_comment(tmp_path, brk):
    pt2 = tmp_path / f"m{brk}{PAYLOAD}{brk}#.pt2"
    pt2.write_bytes(b"")
    ts = tmp_path / f"t{brk}{PAYLOAD}{brk}#.ts"
    ts.write_bytes(b"")
    hf = tmp_path / f"hf{brk}{PAYLOAD}{brk}#"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    for path, options, loader in ((pt2, {}, "open_export"), (ts, {"input_shapes": "2,4"}, "open_torchscript"),
                                  (hf, {}, "open_huggingface")):
        source = driver_source(path, options)
        # One statement, the loader's call; the name is written escaped in the first comment line.
        assert _statements(source) == ["Assign"], source
        call = ast.parse(source).body[0].value
        assert call.func.id == loader and call.args[0].value == str(path)
        assert source.splitlines()[0].startswith(f"# Backprop Studio opens {ascii(path.name)} (")


def _notebook(path, cells):
    doc = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": src}
                     for src in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize("brk", ["\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85"],
                         ids=lambda b: f"U+{ord(b):04X}")
def test_a_notebook_comment_holding_a_line_separator_stays_a_comment(tmp_path, brk):
    cells = [f"x = 1  # note{brk}{PAYLOAD}\n", f"s = 'a{brk}b'\n"]
    nb = notebook_script(_notebook(tmp_path / "nb.ipynb", cells))
    tree = ast.parse(nb.source)  # a separator inside a string is no SyntaxError
    names = [node.targets[0].id for node in tree.body if isinstance(node, ast.Assign)]
    assert names[-2:] == ["x", "s"]
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "open"]
    assert calls == []
    assert [c["lines"] for c in nb.cells] == [1, 1]
    namespace: dict = {"print": print}
    exec(compile(nb.source, "nb", "exec"), namespace)  # runs as Jupyter would: nothing written
    assert namespace["s"] == f"a{brk}b"
    assert not (tmp_path / "PWNED").exists()


def test_a_notebooks_name_stays_in_its_comment(tmp_path):
    path = _notebook(tmp_path / f"n\n{PAYLOAD}\n#.ipynb", ["y = 2\n"])
    nb = notebook_script(path)
    assert _statements(nb.source) == ["Assign", "Assign"]  # display = print, y = 2


def test_python_lines_split_where_python_does():
    assert python_lines("a\nb\r\nc\rd") == ["a", "b", "c", "d"]
    assert python_lines("a\u2028b\x0cc\n") == ["a\u2028b\x0cc"]
    assert python_lines("") == [] and python_lines("\n") == [""]
    assert python_lines("x\n\ny") == "x\n\ny".splitlines()
