"""Scripts that go for the worker's channel to the app: they write on its descriptor (found
through /proc/self/fd, as a hostile script would), into its fallback or fault file, or patch the
modules the channel uses. Nothing they write is shown as the run's, and every run ends in time."""

import json
import shlex
import sys
import textwrap
import threading
import time

import pytest

from core.client.handle import run_capture
from core.client.launchers import from_command
from core.client.process import ROOT
from core.model.trace_json import call_to_dict
from core.protocol import wire

# What a hostile script does to find the protocol descriptor: every pipe it may write to, past fd 2.
FIND_PIPES = '''
import os
def write_pipes():
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as f:
                flags = int(f.read().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        if fd > 2 and link.startswith("pipe:") and flags & 3 == os.O_WRONLY:
            found.append(fd)
    return found
'''

PLAIN = "import torch\nx = torch.tensor(1.0, requires_grad=True)\n(x * 2).backward()\n"


def bounded(bound: float, **run_args):
    """``run_capture`` that must end within ``bound`` seconds: (result, seconds taken)."""
    box = {}

    def go():
        started = time.monotonic()
        box["result"] = run_capture(**run_args)
        box["took"] = time.monotonic() - started

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(bound)
    assert "result" in box, f"the run did not end within {bound:g} s"
    return box["result"], box["took"]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("patch", [
    "import json, functools; json.dumps = functools.partial(json.dumps, indent=2)",
    "import json; json.JSONEncoder.encode = lambda self, o: 'nothing'",
    "import os; os.write = lambda fd, data: len(data)",
], ids=["json.dumps", "JSONEncoder", "os.write"])
def test_a_script_that_patches_what_the_channel_uses_changes_nothing_sent(tmp_path, patch):
    """Before, the run stalled to its time limit and lost its calls; plain python runs it in under 1 s."""
    script = write(tmp_path, "patch.py", patch + "\n" + PLAIN + "(x * 3).backward()\n")
    result, took = bounded(45, path=str(script), timeout=60)
    trace = result.trace
    assert trace.error is None, trace.error
    assert [c.leaf_grads["x"].data for c in trace.calls] == [[2.0], [5.0]]
    assert result.bad_messages == []
    assert took < 30