"""Breakpoints and Step Over / Into / Out stop at the same lines through sys.settrace and sys.monitoring.

``core.worker.line_stops`` is torch-free, so each case runs a plain-Python script under it
(``line_stops_run.py``) in a subprocess of this Python and of every CPython 3.12+ found on the
machine, where line events come from ``sys.monitoring`` (and once more there with monitoring
turned off). The stops are exact (function, line, why); the costs are counts of line events.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).with_name("line_stops_run.py")

SCRIPT = """\
def double(x):
    y = x * 2
    return y


def total(n):
    s = 0
    for i in range(n):
        if i < 0:
            print("never")
        s += double(i)
    return s


def bad():
    raise ValueError("no")


def guard():
    try:
        bad()
    except ValueError:
        return -1


a = guard()
b = total({n})
c = a + b
import threading
worker = threading.Thread(target=double, args=(5,))
worker.start()
worker.join()
"""
# Lines of SCRIPT: 2 ``y = x * 2``, 3 ``return y``, 8 ``for``, 9 ``if i < 0``, 10 the branch never
# taken, 16 ``raise``, 22 ``except``, 27 ``b = total(n)``; ``double`` runs once more in a thread.

BP = "breakpoint"
CASES = {
    "a breakpoint, then Step Over twice": (
        [27], ["step over", "step over"], [["<module>", 27, BP], ["<module>", 28, "step"], ["<module>", 29, "step"]]),
    "Step Into goes into the script's functions and back out": (
        [27], ["step into"] * 7,
        [["<module>", 27, BP], ["total", 7, "step"], ["total", 8, "step"], ["total", 9, "step"],
         ["total", 11, "step"], ["double", 2, "step"], ["double", 3, "step"], ["total", 8, "step"]]),
    "a breakpoint in a function stops each call, not in other threads": (
        [2], [], [["double", 2, BP]] * 3),
    "Step Out stops at the caller's next line": (
        [2], ["step out", "step over", "clear"], [["double", 2, BP], ["total", 8, "step"], ["total", 9, "step"]]),
    "Step Over on a return line stops in the caller": (
        [3], ["step over", "clear"], [["double", 3, BP], ["total", 8, "step"]]),
    "Step Over a raise stops where the caller handles it": (
        [16], ["step over", "step over"], [["bad", 16, BP], ["guard", 22, "step"], ["guard", 23, "step"]]),
    "a breakpoint set while paused stops in a frame already running": (
        [2], ["add 9", "continue", "clear"], [["double", 2, BP], ["total", 9, BP], ["double", 2, BP]]),
    "a branch never taken never stops": ([10], [], []),
}


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    parts = out.stdout.split()
    return (int(parts[0]), int(parts[1])) if out.returncode == 0 and len(parts) == 2 else None


def _monitoring_pythons() -> list[str]:
    """CPython 3.12+ interpreters on this machine (on PATH, or pyenv's), one per version."""
    found: dict[tuple[int, int], str] = {}
    candidates = [sys.executable] + [shutil.which(f"python3.{minor}") or "" for minor in range(12, 16)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        candidates += sorted(str(p) for p in pyenv.glob("3.1[2-9]*/bin/python3"))
    for python in candidates:
        if not python:
            continue
        version = _version(python)
        if version is not None and version >= (3, 12) and version not in found:
            found[version] = python
    return list(found.values())


MONITORING = _monitoring_pythons()


def run(python: str, tmp_path: Path, lines, answers, n: int = 3, monitoring=None) -> dict:
    script = tmp_path / "stops.py"
    script.write_text(SCRIPT.format(n=n))
    spec = {"script": str(script), "lines": lines, "answers": answers, "monitoring": monitoring}
    out = subprocess.run([python, str(RUNNER), json.dumps(spec)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_stops_through_settrace(case, tmp_path):
    lines, answers, expected = CASES[case]
    result = run(sys.executable, tmp_path, lines, answers, monitoring=False)
    assert result["source"] == "sys.settrace"
    assert result["seen"] == expected
    assert (result["outcome"], result["result"]) == ("finished", -1 + 2 * (0 + 1 + 2))


@pytest.mark.skipif(not MONITORING, reason="no CPython 3.12+ on this machine")
@pytest.mark.parametrize("case", list(CASES))
def test_the_same_stops_through_sys_monitoring(case, tmp_path):
    lines, answers, expected = CASES[case]
    for python in MONITORING:
        result = run(python, tmp_path, lines, answers)
        assert result["source"] == "sys.monitoring", python
        assert result["seen"] == expected, (python, result["python"])
        assert (result["outcome"], result["result"]) == ("finished", 5), python
        # Turned off there, the same stops come from the local tracer.
        assert run(python, tmp_path, lines, answers, monitoring=False)["seen"] == expected, python


def test_stop_at_a_pause_ends_the_script(tmp_path):
    pythons = [sys.executable] + MONITORING
    for python in pythons:
        result = run(python, tmp_path, [27], ["stop"])
        assert (result["seen"], result["outcome"], result["result"]) == ([["<module>", 27, BP]], "stopped", None)


@pytest.mark.skipif(not MONITORING, reason="no CPython 3.12+ on this machine")
def test_a_breakpoint_never_hit_costs_a_few_line_events_not_one_per_line(tmp_path):
    # 1,000 iterations of a frame holding a breakpoint on a branch never taken: the local tracer
    # sees each of the loop's 3 lines every iteration; monitoring disables each line after its first event.
    traced = run(sys.executable, tmp_path, [10], [], n=1000, monitoring=False)
    assert traced["seen"] == [] and traced["line_events"] >= 3000
    for python in MONITORING:
        monitored = run(python, tmp_path, [10], [], n=1000)
        assert monitored["seen"] == [] and monitored["line_events"] <= 6, (python, monitored["line_events"])
