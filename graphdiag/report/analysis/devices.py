"""Per-device keys and outcomes of a layer-split run (--devices N). Pure: events in, data out.

A run on several devices records its layout (DeviceLayout) and links (PeerLink) before step 0, and every
decision names its device; a one-device run (or a record older than the device field) has no layout, and
`device_report` returns None.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ... import events as E


@dataclass
class DeviceSummary:
    """One device's share of the run: its layers, graph keys and split outcomes (calls, not steps)."""

    device: int
    name: str = ""
    layers: int = 0                   # repeating layers held
    output_layer: bool = False        # holds output_norm and output
    keys: int = 0
    eager: int = 0
    capture: int = 0
    replay: int = 0
    instantiates: int = 0
    updates: int = 0
    refusals: int = 0
    replay_median_ns: int = 0         # a replayed split's graph launches (host time on the simulated driver)


@dataclass
class DeviceReport:
    devices: list[DeviceSummary] = field(default_factory=list)
    links: list[tuple[int, int, str, str]] = field(default_factory=list)   # (from, to, mode, reason)
    shares_from: str = ""
    split_points: tuple = ()
    simulated: bool = False


def device_report(events, one_device: bool = False) -> DeviceReport | None:
    """The per-device view of a run, or None when it ran on one device (`one_device`: then a report of
    device 0 alone, for comparing with a run on several)."""
    layout = next((e for e in events if isinstance(e, E.DeviceLayout)), None)
    if layout is None and not one_device:
        return None
    if layout is None:
        layout = E.DeviceLayout(names=("",))
    r = DeviceReport(shares_from=layout.shares_from, split_points=tuple(layout.split_points),
                     simulated=layout.simulated)
    for d, name in enumerate(layout.names):
        r.devices.append(DeviceSummary(d, name, sum(1 for x in layout.layers[:-1] if x == d),
                                       bool(layout.layers) and layout.layers[-1] == d))
    keys: dict[int, set] = {d.device: set() for d in r.devices}
    replays: dict[int, list[int]] = {d.device: [] for d in r.devices}
    for ev in events:
        if isinstance(ev, E.PeerLink):
            r.links.append((ev.device, ev.to_device, ev.mode, ev.reason))
            continue
        if ev.device not in keys:
            continue
        ds = r.devices[ev.device]
        if ev.key:
            keys[ev.device].add(ev.key)
        match ev:
            case E.EagerRun():
                ds.eager += 1
            case E.CaptureRun():
                ds.capture += 1
            case E.ReplayLaunched():
                ds.replay += 1
                replays[ev.device].append(ev.duration_ns)
            case E.ChunkInstantiated():
                ds.instantiates += 1
            case E.ChunkUpdated():
                ds.updates += 1
            case E.UpdateRefused():
                ds.refusals += 1
    for ds in r.devices:
        ds.keys = len(keys[ds.device])
        ds.replay_median_ns = int(statistics.median(replays[ds.device])) if replays[ds.device] else 0
    return r


def device_of_keys(events) -> dict[int, int]:
    """key -> the device whose cache holds it (keys are struct addresses: one device each)."""
    return {ev.key: ev.device for ev in events if ev.key and isinstance(ev, E.KeyLookup)}
