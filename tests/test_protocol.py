"""The worker protocol: every message kind round-trips through its dataclass."""

from __future__ import annotations

import json

import pytest

from core import protocol
from core.protocol import ProtocolError, StepBegin, command_from_dict, message_from_dict


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
