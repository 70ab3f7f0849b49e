"""NVTX ranges of a real GPU run, seen through CUPTI marker records (libcupti as the NVTX injection).

The run happens in a subprocess: NVTX picks its tool once, at its first call, from NVTX_INJECTION64_PATH."""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parent.parent.parent

SCRIPT = r"""
import json, sys
from cupti import cupti
records = []
def requested():
    return 8 * 1024 * 1024, 0
def completed(activities):
    for a in activities:
        records.append({"kind": str(getattr(a, "kind", "")), "flags": int(getattr(a, "flags", 0)),
                        "id": int(getattr(a, "id", -1)), "ts": int(getattr(a, "timestamp", 0)),
                        "name": getattr(a, "name", None), "domain": getattr(a, "domain", None)})
cupti.activity_register_callbacks(requested, completed)
cupti.activity_enable(cupti.ActivityKind.MARKER)
# NVTX must inject the very libcupti this process loaded (another copy would be another CUPTI instance whose
# records never reach these callbacks); NVTX reads the variable at its first call, which comes later
import os
loaded = [l.split()[-1] for l in open("/proc/self/maps") if "libcupti" in l and l.split()[-1].startswith("/")]
if loaded:
    os.environ["NVTX_INJECTION64_PATH"] = loaded[0]
print("injection", os.environ.get("NVTX_INJECTION64_PATH"), file=sys.stderr)
from graphdiag.config import resolve
from graphdiag.report.sinks.nvtx_sink import NvtxSink
from graphdiag.runner import run
sink = NvtxSink()
assert sink.enabled, "NVTX found no tool"
r = run(resolve({"backend": "cuda", "steps": 4, "prompt_tokens": 4, "chunk_size": 64}, environ={}),
        span_sinks=[sink])
cupti.activity_flush_all(1)
json.dump({"records": records, "steps": sum(1 for e in r.events if e.kind == "step_finished")},
          open(sys.argv[1], "w"))
"""


def _libcupti() -> str | None:
    pats = ["/usr/local/cuda/lib64/libcupti.so*", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so*"]
    for p in sys.path:
        pats.append(os.path.join(p, "nvidia", "*", "lib", "libcupti.so*"))
        pats.append(os.path.join(p, "nvidia", "cuda_cupti", "lib", "libcupti.so*"))
    for pat in pats:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[0]
    return None


def test_nvtx_ranges_through_cupti(tmp_path):
    pytest.importorskip("cupti")
    from graphdiag.backends.drivers.cuda import CudaDriver
    from graphdiag.errors import NoDeviceError
    try:
        CudaDriver.open().close()
    except NoDeviceError as exc:
        pytest.skip(f"no GPU: {exc}")
    lib = _libcupti()
    if lib is None:
        pytest.skip("libcupti not found")
    out = tmp_path / "markers.json"
    env = dict(os.environ, NVTX_INJECTION64_PATH=lib)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    print(p.stderr[-2000:])
    data = json.loads(out.read_text())
    dump = os.environ.get("GRAPHDIAG_CUPTI_DUMP")
    if dump:
        Path(dump).write_text(json.dumps(data))
    # CUpti_ActivityMarker2: a start record carries the name, its end record (same id) has none
    starts = {r["id"]: r for r in data["records"] if r["name"]}
    ends = {r["id"]: r for r in data["records"] if not r["name"]}
    assert starts and set(starts) == set(ends), "every pushed range is popped"
    names = [r["name"] for r in starts.values()]
    assert names.count("step") == data["steps"]
    for want in ("graph_compute", "capture chunk", "instantiate", "replay"):
        assert want in names, (want, sorted(set(names)))
    assert all(r["domain"] == "graphdiag" for r in starts.values())
    assert all(starts[i]["ts"] <= ends[i]["ts"] for i in starts)
    # nesting: every replay range lies inside a graph_compute range, which lies inside a step range
    spans = {n: [(s["ts"], ends[i]["ts"]) for i, s in starts.items() if s["name"] == n] for n in set(names)}

    def inside(inner, outer):
        return all(any(a <= x and y <= b for a, b in spans[outer]) for x, y in spans[inner])

    assert inside("replay", "graph_compute") and inside("graph_compute", "step")
    assert inside("capture chunk", "graph_compute")
