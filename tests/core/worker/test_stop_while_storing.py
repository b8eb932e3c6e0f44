"""A Stop that lands while a captured call is being stored keeps that call."""

import _thread
import signal
import textwrap

import pytest

torch = pytest.importorskip("torch")

from core.worker.capture.call_record import CallRecording  # noqa: E402
from core.worker.capture.recorder import capture_script  # noqa: E402
from core.worker.interrupts import INTERRUPTS  # noqa: E402


def test_a_stop_while_the_call_is_stored_keeps_the_call(tmp_path, monkeypatch):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""\
        import torch
        w = torch.tensor([1.0, 2.0], requires_grad=True)
        for step in range(3):
            (w * w).sum().backward()
        """))
    real_after = CallRecording._after

    def stopped_meanwhile(self, *args, **kwargs):
        _thread.interrupt_main()  # Stop pressed: the worker's command thread does this
        for _ in range(1000):  # the interrupt's handler runs between these bytecodes
            pass
        return real_after(self, *args, **kwargs)

    monkeypatch.setattr(CallRecording, "_after", stopped_meanwhile)
    INTERRUPTS.start()
    try:
        trace = capture_script(str(script), mode="script")
    finally:
        INTERRUPTS.script_ended()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert (trace.error.type, trace.error.kind, trace.error.line) == ("KeyboardInterrupt", "cancelled", 4)
    assert trace.call_count == 1
    (call,) = trace.calls
    assert call.leaf_grads["w"].data == [2.0, 4.0]
