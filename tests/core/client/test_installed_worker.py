"""A worker from an installed copy of the package, outside the source tree, with numpy, psutil and Qt
blocked: trace, step and memory samples still work, and the trace comes back compressed."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from core.client.handle import run_capture
from core.client.process import ROOT
from core.client.launchers import from_command

from tests.core.client.test_launchers import PRODUCT, PY, assert_no_process, write


def installed_copy(target: Path) -> Path | None:
    """The package installed with pip into ``target`` (no dependencies), or None where pip cannot build it."""
    try:
        import setuptools  # noqa: F401  (the build backend, used without network)
    except ImportError:
        return None
    src = target.parent / "src"  # built from a copy: pip leaves build/ and egg-info beside the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("app", "core", "widgets", "resources"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([PY, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                           str(target), str(src)], capture_output=True, timeout=300)
    return target if done.returncode == 0 and (target / "core" / "worker" / "main.py").is_file() else None


@pytest.mark.slow
def test_worker_runs_with_only_torch_and_the_standard_library(tmp_path):
    """From an installed copy of the package, outside the source tree, with numpy, psutil and Qt
    blocked: trace, step and memory samples still work, and the trace comes back compressed."""
    mark = uuid.uuid4().hex
    bare = Path(__file__).resolve().parents[2] / "bare_worker.py"
    # Installed into a folder named like the real one: the script still imports its neighbours there.
    site = installed_copy(tmp_path / "site-packages") or ROOT
    if site != ROOT:
        (site / "neighbour_pkg.py").write_text("VALUE = 1.0\n")
    launcher = from_command(f"sh -c 'cd {shlex.quote(str(tmp_path))} && exec {shlex.quote(PY)} "
                            f"{shlex.quote(str(bare))}'", name="bare",
                            env={"BPS_TEST_MARK": mark, "PYTHONPATH": str(site)})
    # 800 multiplications: the captured call is over 64 KiB, so it travels compressed.
    neighbour = "from neighbour_pkg import VALUE\n" if site != ROOT else "VALUE = 1.0\n"
    script = write(tmp_path, "chain.py", neighbour + PRODUCT.replace(
        "c = (a * b).sum()", "c = a * b\nfor _ in range(800):\n    c = c * VALUE\nc = c.sum()"))
    events = []
    result = run_capture(str(script), launcher=launcher, timeout=60, on_event=events.append,
                         step={"call": 0, "mode": "all"})
    assert result.trace.error is None, (result.trace.error, result.output)
    assert "Failed to initialize NumPy" in result.output  # numpy really was missing
    if site != ROOT:
        assert f"{site}/core/worker/main.py" in result.output  # the installed copy ran, not the source tree
    assert result.trace.calls[0].leaf_grads["a"].data == [4.0, -1.0]
    assert len([e for e in events if e.get("type") == "step"]) == 804  # sum, 801 mul, 2 leaves
    assert result.trace.memory and all(s.rss > 0 for s in result.trace.memory)
    (transfer,) = [e for e in events if e.get("type") == "transfer" and e["of"] == "call_trace"]
    assert transfer["codec"] == "zlib"
    assert transfer["received"] * 5 < transfer["decoded"] == transfer["raw"]  # compressed on the way
    assert_no_process(mark)
