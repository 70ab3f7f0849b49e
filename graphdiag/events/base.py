"""The base of every event: the common fields, the registry of kinds, the JSON round-trip (to_dict /
from_dict), and the fast __init__ each event class gets once all are defined."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

SCHEMA_VERSION = 1

EVENT_TYPES: dict[str, type["Event"]] = {}


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"
    step: int = -1
    split: int = -1
    key: int = 0
    uid: int = 0
    t_ns: int = 0
    device: int = 0

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        EVENT_TYPES[cls.kind] = cls

    def to_dict(self) -> dict[str, Any]:
        # the instance dict holds exactly the fields, in field order (both __init__s fill it so, and events
        # are frozen): one copy instead of a getattr per field; device goes last, and only when set
        d = {"kind": self.kind, **self.__dict__}    # tuples serialise as JSON arrays
        device = d.pop("device")
        if device:
            d["device"] = device
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Event":
        cls = EVENT_TYPES.get(d.get("kind", ""))
        if cls is None:
            raise KeyError(f"unknown event kind {d.get('kind')!r}")
        kw = {f.name: _tuplify(d[f.name]) for f in dataclasses.fields(cls) if f.name in d}
        return cls(**kw)


def _tuplify(v):
    """JSON lists back to the tuples events hold (recursively)."""
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


def _fast_init(cls: type) -> None:
    """Give a frozen event class an __init__ that fills the instance dict directly. The dataclass one calls
    object.__setattr__ once per field (~2 µs for a ten-field event, six events per replayed step); this one
    takes the same parameters in the same order with the same defaults, and the class stays frozen (no
    assignment after construction, same eq and hash)."""
    fs = dataclasses.fields(cls)
    if any(f.default is dataclasses.MISSING or not f.init for f in fs):
        return                               # required or non-init fields: keep the dataclass __init__
    params = ", ".join(f"{f.name}=_d{i}" for i, f in enumerate(fs))
    body = "; ".join(f"d[{f.name!r}] = {f.name}" for f in fs)
    ns = {f"_d{i}": f.default for i, f in enumerate(fs)}
    exec(f"def __init__(self, {params}):\n    d = self.__dict__; {body}", ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init

