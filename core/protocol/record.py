"""The record every protocol message is: typed fields, checked on arrival (``core.protocol.messages``).

``from_dict`` checks each field against its annotation and names the kind and the field of
anything that does not fit; unknown keys are kept in ``extra``. ``msg["field"]`` and
``msg.get("field")`` read a record as the dict it was sent as.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar


class ProtocolError(ValueError):
    """A message that does not match its kind: names the kind and the field."""


_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list, tuple),
          "dict": (dict,), "None": (type(None),)}


def _check(what: str, name: str, annotation: str, value) -> None:
    """Raise ProtocolError when ``value`` does not fit the field's annotation ("int | None", "Any")."""
    allowed: tuple = ()
    for part in str(annotation).split("|"):
        part = part.strip()
        if part == "Any":
            return
        allowed += _TYPES.get(part, (object,))
    if isinstance(value, bool) and bool not in allowed:  # JSON true is no count
        ok = False
    else:
        ok = isinstance(value, allowed)
    if not ok:
        want = " or ".join(p.strip() for p in str(annotation).split("|"))
        raise ProtocolError(f"{what}: field '{name}' must be {want}, got {type(value).__name__} "
                            f"{_short(value)}")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass
class _Base:
    KEY: ClassVar[str] = "type"
    KIND: ClassVar[str] = ""
    extra: dict = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        out = {self.KEY: self.KIND}
        for f in fields(self):
            if f.name != "extra":
                out[f.name] = getattr(self, f.name)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: dict):
        """The typed message; ProtocolError naming the field when one is missing or of the wrong type."""
        what = f"'{cls.KIND}' {'command' if cls.KEY == 'cmd' else 'message'}"
        if not isinstance(data, dict):
            raise ProtocolError(f"{what}: not a JSON object but {type(data).__name__}")
        known = {f.name: f for f in fields(cls) if f.name != "extra"}
        args = {}
        for name, f in known.items():
            if name in data:
                _check(what, name, f.type, data[name])
                args[name] = data[name]
            elif f.default is MISSING and f.default_factory is MISSING:
                raise ProtocolError(f"{what}: field '{name}' is missing")
        args["extra"] = {k: v for k, v in data.items() if k not in known and k != cls.KEY}
        return cls(**args)

    @property
    def kind(self) -> str:
        """The message's ``type`` (or a command's ``cmd``)."""
        return self.KIND

    # The dict form, read-only, for code written against it (the app itself reads attributes).
    def __getitem__(self, key: str):
        if key == self.KEY:
            return self.KIND
        if key != "extra" and key in self.__dataclass_fields__:
            return getattr(self, key)
        return self.extra[key]

    def get(self, key: str, default=None):
        try:
            return self[key]
        except KeyError:
            return default
