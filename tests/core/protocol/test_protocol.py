"""The worker protocol: every message kind round-trips through its dataclass."""

from __future__ import annotations

import json

import pytest

from core.protocol import events as client_events
from core.protocol import messages as protocol
from core.protocol.messages import ProtocolError, StepBegin, command_from_dict, message_from_dict


def test_every_kind_round_trips_through_json():
    for kind, cls in {**protocol.MESSAGES, **protocol.COMMANDS}.items():
        msg = cls()
        data = json.loads(json.dumps(msg.to_dict()))
        back = (message_from_dict if cls.KEY == "type" else command_from_dict)(data)
        assert type(back) is cls and back == msg, kind
        assert data[cls.KEY] == kind


def test_fields_and_unknown_keys():
    data = {"type": "step_begin", "call": 3, "api": "Tensor.backward", "line": 12, "structure": "ab12",
            "worker": 7}
    msg = message_from_dict(data)
    assert isinstance(msg, StepBegin)
    assert (msg.call, msg.api, msg.line, msg.structure, msg.debug) == (3, "Tensor.backward", 12, "ab12", False)
    assert msg.extra == {"worker": 7}
    assert msg.to_dict() == {**data, "leaves": "", "graph": None, "debug": False}


def test_unknown_kinds_are_named():
    with pytest.raises(ProtocolError, match="'nope'"):
        message_from_dict({"type": "nope"})
    with pytest.raises(ProtocolError, match="'jump'"):
        command_from_dict({"cmd": "jump"})
    assert command_from_dict({"cmd": "step", "count": 4}).count == 4
    assert set(protocol.STEP_COMMANDS) <= set(protocol.COMMANDS)


def test_wrong_types_name_the_field():
    with pytest.raises(ProtocolError, match=r"'call' message: field 'index' must be int, got str 'three'"):
        message_from_dict({"type": "call", "index": "three"})
    with pytest.raises(ProtocolError, match=r"'step_end' message: field 'error' must be dict or None"):
        message_from_dict({"type": "step_end", "error": "boom"})
    with pytest.raises(ProtocolError, match=r"'steps' message: field 'records' must be list"):
        message_from_dict({"type": "steps", "records": {"node": "n1"}})
    with pytest.raises(ProtocolError, match=r"'step' command: field 'count' must be int, got bool True"):
        command_from_dict({"cmd": "step", "count": True})  # a JSON true is no count
    with pytest.raises(ProtocolError, match="must be a JSON object, not a list"):
        message_from_dict(["call", 3])
    # Optional fields take None; a float field takes an integer; ``Any`` takes anything.
    msg = message_from_dict({"type": "call", "index": 2, "line": None, "t": 1, "run": "r7"})
    assert (msg.index, msg.line, msg.t, msg.run) == (2, None, 1, "r7")


def test_messages_read_as_attributes_and_as_the_dict_they_were():
    msg = message_from_dict({"type": "step", "call": 1, "record": {"node": "n4"}, "worker": 3})
    assert (msg.kind, msg.call, msg.record) == ("step", 1, {"node": "n4"})
    assert (msg["type"], msg["call"], msg.get("worker"), msg.get("nope", 5)) == ("step", 1, 3, 5)
    with pytest.raises(KeyError):
        msg["nope"]
    # The client's own events are typed by the same table.
    ev = protocol.event_from_dict({"type": "transfer", "of": "trace", "received": 10, "decoded": 40, "raw": 80})
    assert isinstance(ev, client_events.Transfer) and (ev.of, ev.raw) == ("trace", 80)
    assert set(client_events.EVENTS).isdisjoint(protocol.MESSAGES)


FAKE_WORKER = '''
import json, os, sys, time
PID = {pid}
sys.path.insert(0, {root!r})
from core.model.trace import Trace
from core.protocol.wire import PROTOCOL_VERSION
out = os.fdopen(1, "w", buffering=1)
def send(msg):
    out.write(json.dumps(msg) + "\\n")
sys.stdin.readline()  # the channel's set-up line: this worker does not seal its messages
send({{"type": "hello", "pid": PID, "protocol": PROTOCOL_VERSION, "devices": []}})
run = json.loads(sys.stdin.readline())["run"]
send({{"type": "started", "run": run, "t": time.time()}})
send({{"type": "call", "run": run, "index": "three", "api": "Tensor.backward", "line": 4}})
send({{"type": "call", "run": run, "index": 1, "api": "Tensor.backward", "line": 9, "nodes": 5, "t": 0.5}})
send({{"type": "trace", "run": run, "trace": Trace(calls=[], script="s.py", call_count=2).to_dict()}})
sys.stdin.readline()
'''


def _fake_worker(tmp_path, pid="os.getpid()"):
    import shlex
    import sys

    from core.client.process import ROOT
    from core.client.launchers import from_command

    fake = tmp_path / "fake_worker.py"
    fake.write_text(FAKE_WORKER.format(root=str(ROOT), pid=pid))
    script = tmp_path / "s.py"
    script.write_text("x = 1\n")
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(fake))}", from_command, script


def test_a_malformed_worker_message_is_reported_by_field_and_nothing_is_lost(tmp_path):
    from core.client.handle import run_capture

    command, from_command, script = _fake_worker(tmp_path)
    events = []
    result = run_capture(str(script), launcher=from_command(command, name="fake"), timeout=30,
                         on_event=events.append)
    (bad,) = [e for e in events if isinstance(e, client_events.BadMessage)]
    assert bad.error == "'call' message: field 'index' must be int, got str 'three'"
    assert bad.raw["index"] == "three" and bad.raw["line"] == 4  # kept as received
    # The messages after it still arrive, typed, and the run ends with its trace.
    calls = [e for e in events if isinstance(e, protocol.CallStarted)]
    assert [(c.index, c.line, c.nodes) for c in calls] == [(1, 9, 5)]
    assert result.trace.error is None and result.trace.call_count == 2
    assert result.bad_messages == [bad.error]


def test_the_cli_names_a_malformed_worker_message(tmp_path, capsys):
    from app.cli import commands as cli

    command, _, script = _fake_worker(tmp_path)
    code = cli.main(["trace", str(script), "--worker-command", command, "--timeout", "30"])
    err = capsys.readouterr().err
    assert code == 0
    assert "warning: 'call' message: field 'index' must be int, got str 'three'" in err


MESSAGE_NAMES = {"event", "msg", "message", "e", "ev", "begin", "end", "pending_msg", "info"}


def _string_key_reads(tree) -> list[str]:
    """``x["type"]`` / ``x.get("type")`` on any name but an error record's, and any string-keyed read of a
    name that holds a message."""
    import ast

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            target = node.value
            if isinstance(target, ast.Name) and (target.id in MESSAGE_NAMES
                                                 or (node.slice.value == "type" and target.id != "error")):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            target = node.func.value
            if isinstance(target, ast.Name) and (target.id in MESSAGE_NAMES
                                                 or (node.args[0].value == "type" and target.id != "error")):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_app_reads_messages_by_attribute_not_by_string_key():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    files = sorted((root / "app").rglob("*.py")) + [root / "core" / "client" / "handle.py"]
    bad = {}
    for path in files:
        reads = _string_key_reads(ast.parse(path.read_text(encoding="utf-8")))
        if path.name == "handle.py":  # the one place a raw hello is checked before it is typed
            reads = [r for r in reads if "data.get('type')" not in r]
        if reads:
            bad[path.name] = reads
    assert bad == {}
    # The check finds what it looks for.
    sample = 'def f(event, msg):\n    a = event["record"]\n    b = msg.get("line")\n    c = x["type"]\n' \
             '    d = error["type"]\n'
    assert len(_string_key_reads(ast.parse(sample))) == 3


def test_a_hello_that_cannot_be_read_is_refused_naming_the_field(tmp_path):
    from core.client.handle import run_capture

    command, from_command, script = _fake_worker(tmp_path, pid="'one'")
    events = []
    result = run_capture(str(script), launcher=from_command(command, name="fake"), timeout=30,
                         on_event=events.append)
    refused = [e for e in events if isinstance(e, client_events.Refused)]
    assert refused and "'hello' message: field 'pid' must be int, got str 'one'" in refused[0].message
    assert "field 'pid'" in result.trace.error.message
