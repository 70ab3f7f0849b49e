"""The per-device table of a layer-split run (analysis/devices.py's DeviceReport), and its link lines."""

from __future__ import annotations

from rich.table import Table

from ..analysis.devices import DeviceReport
from ..analysis.eventlog import fmt_ns
from .tables import table


def device_table(r: DeviceReport) -> Table:
    """Devices, their layers and their caches' outcomes (split calls), at 80 columns."""
    sim = " — SIMULATED devices" if r.simulated else ""
    t = table(f"Per device (layer split by {r.shares_from}; split calls per phase){sim}", "dev", "layers",
              "keys", "eager", "capt", "replay", "inst", "upd", "refused", "replay split")
    for d in r.devices:
        t.add_row(str(d.device), f"{d.layers}{' +out' if d.output_layer else ''}", str(d.keys), str(d.eager),
                  str(d.capture), str(d.replay), str(d.instantiates), str(d.updates), str(d.refusals),
                  fmt_ns(d.replay_median_ns) if d.replay else "-")
    t.padding = (0, 1, 0, 0)
    t.caption = "\n".join(f"dev {d.device} = {d.name}" for d in r.devices)
    t.caption_justify = "left"
    return t


def link_lines(r: DeviceReport) -> list[str]:
    """One line per ordered pair of devices: how split inputs cross."""
    return [f"split inputs {a}→{b}: {mode} ({reason})" for a, b, mode, reason in r.links]
