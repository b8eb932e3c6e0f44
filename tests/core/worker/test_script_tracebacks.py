"""A script's traceback as the app shows it is the one the script alone prints: no frame of the app's."""

import re
import subprocess
import sys
import textwrap

import pytest

from core.client.handle import run_capture

pytest.importorskip("torch")

HOOK_RAISES = textwrap.dedent("""\
    import torch

    w = torch.ones(3, requires_grad=True)
    y = (w * 2).sum()


    def refuse(grad):
        raise ValueError("hook says no")


    w.register_hook(refuse)
    y.backward()
    """)

CHAINED = textwrap.dedent("""\
    import torch

    w = torch.ones(3, requires_grad=True)
    try:
        (w * 2).backward()
    except RuntimeError as exc:
        raise ValueError("a vector has no backward of its own") from exc
    """)

FRAME = re.compile(r'^  File "([^"]+)", line (\d+), in (\S+)$', re.MULTILINE)


def _frames(text: str) -> list[tuple[str, int, str]]:
    return [(f, int(n), name) for f, n, name in FRAME.findall(text)]


def _alone(script) -> str:
    """What the script prints when it runs on its own."""
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    return result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("step", [None, {"call": 0, "mode": "all"}], ids=["run", "step"])
def test_a_hooks_error_shows_the_scripts_frames_and_torchs_only(tmp_path, step):
    script = tmp_path / "hook_raises.py"
    script.write_text(HOOK_RAISES, encoding="utf-8")
    err = run_capture(str(script), step=step, timeout=300).trace.error
    assert (err.type, err.message, err.line) == ("ValueError", "hook says no", 8)
    frames = _frames(err.traceback)
    assert not [f for f, _, _ in frames if "/core/" in f.replace("\\", "/")], err.traceback
    assert (str(script), 12, "<module>") == frames[0] and (str(script), 8, "refuse") == frames[-1]
    assert frames == _frames(_alone(script))  # torch's frames kept, and no hop through the app's mode
    assert err.traceback.endswith("ValueError: hook says no\n")


@pytest.mark.slow
def test_a_chained_error_keeps_both_tracebacks_without_the_apps_frames(tmp_path):
    script = tmp_path / "chained.py"
    script.write_text(CHAINED, encoding="utf-8")
    err = run_capture(str(script), step={"call": 0, "mode": "all"}, timeout=300).trace.error
    assert err.type == "ValueError" and "/core/" not in err.traceback.replace("\\", "/")
    assert "The above exception was the direct cause of the following exception" in err.traceback
    assert _frames(err.traceback) == _frames(_alone(script))
