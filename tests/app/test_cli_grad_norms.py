"""``main.py trace SCRIPT --grad-norms``: each module's gradient norm per call, the flags that say
where a run starts to explode, and the clipping and optimizer steps after each call."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.commands import main

EXAMPLE = Path(__file__).resolve().parents[2] / "resources" / "examples" / "35_exploding_and_clipping.py"


@pytest.mark.slow
def test_trace_prints_the_norms_the_flags_and_the_clipping(capsys):
    assert main(["trace", str(EXAMPLE), "--grad-norms", "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "gradient norms: 3 modules × 16 calls" in out
    assert out[out.index("gradient norms: 3 modules × 16 calls") + 1].split() == [
        "module", "#0", "#1", "#2", "#3", "#12", "#13", "#14", "#15"]
    assert [line for line in out if line.startswith("  exploding: ")] == [
        "  exploding: fc1 from call #3: norm 0.752 → 886 over 3 calls",
        "  exploding: fc2 from call #3: norm 1.45 → 894 over 3 calls",
        "  exploding: fc3 from call #3: norm 1.23 → 838 over 3 calls",
    ]
    assert "after #12: clip_grad_norm_ (line 38): max 1, norm 4.82 → 1 (× 0.207)" in out
    # without the option the summary is as it was
    assert main(["trace", str(EXAMPLE), "--quiet"]) == 0
    assert not any(line.startswith("gradient norms:") for line in capsys.readouterr().out.splitlines())


@pytest.mark.slow
def test_trace_lists_the_step_gradscaler_skipped(capsys):
    amp = EXAMPLE.with_name("36_amp_skip.py")
    assert main(["trace", str(amp), "--grad-norms", "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index("GradScaler: 6 steps, 1 skipped")
    assert out[start + 1] == "  after #3 (line 35): step skipped: inf/NaN in gradients, scale 65536 → 32768"
    assert "after #2: GradScaler.step(SGD) (line 35): scale 65536" in out
    assert "after #4: GradScaler.step(SGD) (line 35): scale 32768" in out
