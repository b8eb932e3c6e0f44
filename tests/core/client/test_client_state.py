"""The client's states: a real WorkerClient goes from starting to ready, running, ready and closed."""

from __future__ import annotations

import threading
import time

import pytest

from core.client.handle import ClientState, WorkerClient
from core.protocol import events

WAIT_S = 60.0


@pytest.mark.slow
def test_client_states_of_one_run(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * 3).sum().backward()\n")
    states, finished = [], threading.Event()
    results = []

    def on_event(e):
        if isinstance(e, events.State):
            states.append(e.state)
        elif isinstance(e, events.Finished):
            results.append(e.result)
            finished.set()

    client = WorkerClient(on_event, prestart=True)
    try:
        assert client.state is ClientState.STARTING  # the spare worker has not said hello yet
        deadline = time.monotonic() + WAIT_S
        while client.state is not ClientState.READY and time.monotonic() < deadline:
            time.sleep(0.05)
        client.run(str(script))
        assert finished.wait(WAIT_S)
        assert results[0].trace.error is None and results[0].trace.call_count == 1
    finally:
        client.close()
    assert states == [ClientState.READY, ClientState.RUNNING, ClientState.READY, ClientState.CLOSED]
    assert all(type(s) is ClientState for s in states) and client.state is ClientState.CLOSED
    assert str(ClientState.READY) == "ready"
