"""Files that are not what their names say get a message saying what they are, read without torch:
random bytes named ``.pt``, empty files, safetensors headers, and notebooks nested past what JSON
decoding can follow."""

import json
import os
import struct

import pytest

from core.programs.model_kinds import ModelFileError, check_model_bytes, safetensors_tensor_count
from core.programs.notebook import NotebookError, notebook_script
from core.programs.opener import ProgramError
from core.programs.program import load_program

RANDOM = bytes.fromhex("3f9a11c2d4e5f60718293a4b5c6d7e8f") + os.urandom(200)


def _safetensors(path, header, data=b""):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_random_bytes_in_a_pt_are_not_a_pickle_to_trust(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(RANDOM)
    with pytest.raises(ProgramError) as info:
        load_program(path, {})
    assert str(info.value) == ("model.pt: not a PyTorch file: it starts with bytes 3f 9a 11 c2 d4 e5 f6 07, and "
                               "what torch saves is a zip archive (or, before PyTorch 1.6, a pickle)")
    assert info.value.reason == "load"  # not "unsafe_pickle": no trust is asked
    for name in ("net.pt2", "net.ts"):
        (tmp_path / name).write_bytes(RANDOM)
        with pytest.raises(ProgramError, match=rf"^{name}: not a PyTorch file: it starts with bytes 3f 9a .*"
                                               "a zip archive$"):
            load_program(tmp_path / name, {"input_shapes": "2,4"})


def test_an_empty_model_file_says_it_is_empty(tmp_path):
    for name in ("empty.pt", "empty.pt2", "empty.ts", "empty.safetensors", "empty.pth"):
        (tmp_path / name).write_bytes(b"")
        with pytest.raises(ProgramError) as info:
            load_program(tmp_path / name, {"input_shapes": "2,4"})
        assert str(info.value) == f"{name}: the file is empty"


def test_the_bytes_of_real_torch_files_pass(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(2)}, tmp_path / "zip.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    check_model_bytes(tmp_path / "zip.pt", "checkpoint")
    check_model_bytes(tmp_path / "legacy.pt", "checkpoint")
    with pytest.raises(ProgramError, match="legacy.pt holds weights only"):
        load_program(tmp_path / "legacy.pt", {})


def test_a_safetensors_header_is_read_before_saying_weights_only(tmp_path):
    good = _safetensors(tmp_path / "w.safetensors", {
        "__metadata__": {"format": "pt"},
        "fc.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "fc.bias": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}}, bytes(24))
    assert safetensors_tensor_count(good) == 2
    with pytest.raises(ProgramError, match=r"^w.safetensors holds weights only \(2 tensors, a state_dict\): open "
                                           r"the .py") as info:
        load_program(good, {})
    assert info.value.reason == "needs_code"
    cases = {
        "random.safetensors": (RANDOM, r"its header length \(573,898,704,488,077,887 bytes\) is past the end "
                                       r"of the file \(216 bytes\)"),
        "short.safetensors": (b"\x01\x02", "2 bytes, too short for the 8-byte header length"),
        "text.safetensors": (struct.pack("<Q", 5) + b"hello", "its header is not JSON"),
        "list.safetensors": (struct.pack("<Q", 2) + b"[]", "its header is not a JSON object"),
        "entry.safetensors": (None, "tensor 'w' has no dtype, shape and data_offsets"),
        "past.safetensors": (None, "tensor 'w' lies at bytes 0-400, past the 8 bytes of data"),
    }
    _safetensors(tmp_path / "entry.safetensors", {"w": {"dtype": "F32"}})
    _safetensors(tmp_path / "past.safetensors", {"w": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}},
                 bytes(8))
    for name, (content, words) in cases.items():
        if content is not None:
            (tmp_path / name).write_bytes(content)
        with pytest.raises(ProgramError, match=rf"^{name}: not a valid safetensors file: {words}$") as info:
            load_program(tmp_path / name, {})
        assert info.value.reason == "load"


def test_bad_weights_beside_a_script_are_named_before_it_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("x = 1\n")
    (tmp_path / "w.pt").write_bytes(RANDOM)
    with pytest.raises(ProgramError, match=r"^--weights .*w.pt: w.pt: not a PyTorch file: it starts with bytes 3f"):
        load_program(script, {"weights": str(tmp_path / "w.pt")})
    _safetensors(tmp_path / "w.safetensors", b"{nope")
    with pytest.raises(ProgramError, match=r"w.safetensors: not a valid safetensors file: its header is not JSON"):
        load_program(script, {"weights": str(tmp_path / "w.safetensors")})


@pytest.mark.parametrize("where", ["metadata", "outputs"])
def test_a_notebook_nested_too_deeply_is_refused(tmp_path, where):
    deep = "[" * 100_000 + "]" * 100_000
    cell = ('{"cell_type": "code", "source": "x = 1", "metadata": ' + (deep if where == "metadata" else "{}")
            + ', "outputs": ' + (deep if where == "outputs" else "[]") + "}")
    path = tmp_path / "deep.ipynb"
    path.write_text('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [' + cell + "]}")
    with pytest.raises(NotebookError) as info:
        notebook_script(path)
    assert str(info.value) == f"{path}: not a notebook: its JSON is too deeply nested to read"
    with pytest.raises(ProgramError, match="too deeply nested"):
        load_program(path, {})


def test_an_empty_notebook_says_it_is_empty(tmp_path):
    path = tmp_path / "empty.ipynb"
    path.write_text("")
    with pytest.raises(NotebookError, match=r"empty.ipynb: not a notebook: the file is empty$"):
        notebook_script(path)
