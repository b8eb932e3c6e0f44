"""Runs of files that are not Python: each ends at once, naming the file and why."""

import subprocess
import sys
from pathlib import Path

import pytest

from core.client.handle import run_capture
from core.programs.openers import read_script

ROOT = Path(__file__).resolve().parents[3]


def test_read_script_refuses_undecodable_text_with_a_value_error(tmp_path):
    binary = tmp_path / "noise.py"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(ValueError, match="invalid or missing encoding declaration"):
        read_script(binary)
    bogus = tmp_path / "bogus.py"
    bogus.write_text("# -*- coding: bogus -*-\nprint(1)\n")
    with pytest.raises(ValueError, match="unknown encoding.*bogus"):
        read_script(bogus)


@pytest.mark.slow
@pytest.mark.parametrize("content", [bytes(range(128, 256)) * 8, b"# -*- coding: bogus -*-\nx = 1\n"],
                         ids=["binary", "unknown-coding"])
def test_a_file_python_cannot_decode_ends_its_run_naming_it(tmp_path, content):
    script = tmp_path / "train.py"
    script.write_bytes(content)
    result = run_capture(str(script), timeout=20)
    err = result.trace.error
    assert (err.type, err.kind) == ("OpenError", "load")
    assert err.message.startswith(f"cannot read {script}: ")
    assert result.trace.source == ""  # nothing of it to show


@pytest.mark.slow
def test_the_trace_command_ends_on_a_binary_file(tmp_path):
    script = tmp_path / "noise.py"
    script.write_bytes(bytes(range(128, 256)) * 8)
    done = subprocess.run([sys.executable, "main.py", "trace", str(script), "--timeout", "20"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"error: OpenError: cannot read {script}: invalid or missing encoding declaration" in done.stdout + done.stderr
