"""GGUF models on the H200: an exported preset, run from its file with its own weights, matches the oracle,
replays what it computed eagerly, and decides and generates as the preset does (issue 27, the llama part)."""

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.runner import run
from support.decisions import decision_stream, first_difference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]
pytest.importorskip("gguf")

# 1b Q8_0 once decided differently from the preset here (2026-12-02): the preset ran first with a cold kernel
# cache, its prefill compiled kernels for over 10 s, and the next lookup's sweep evicted the entry it had just
# stamped (ggml's 10 s idle rule, measured on the wall clock as upstream does). The file then ran warm. Both now
# run after one warm-up step of the same shapes, so neither pays the compile inside the compared run.
ONE_B = pytest.param("1b", "q8_0")


def _both(tmp_path, model, wtype):
    path = tmp_path / f"{model}-{wtype}.gguf"
    assert main(["export-gguf", "--model", model, "--wtype", wtype, str(path)]) == 0
    base = {"backend": "cuda", "steps": 8, "prompt_tokens": 8, "oracle": True, "verify": True}
    run(resolve({**base, "model": model, "wtype": wtype, "steps": 1, "oracle": False, "verify": False}, environ={}))
    preset = run(resolve({**base, "model": model, "wtype": wtype}, environ={}))
    filed = run(resolve({**base, "model": str(path)}, environ={}))
    assert filed.header["backend"] == "cuda" and filed.header["model_file"]["arch"] == "llama"
    return preset, filed


@pytest.mark.parametrize("model,wtype", [("tiny", "f16"), ("tiny", "q8_0"), ONE_B])
def test_an_exported_preset_on_the_gpu_runs_and_decides_as_the_preset(tmp_path, model, wtype):
    preset, filed = _both(tmp_path, model, wtype)
    checks = [c for c in filed.events if isinstance(c, E.OracleCheck)]
    assert checks and all(c.ok for c in checks), [(c.step, c.rel_err) for c in checks if not c.ok]
    assert all(v.ok for v in filed.events if isinstance(v, E.VerifyResult))
    print(f"{model} {wtype} from its GGUF: oracle max rel err {max(c.rel_err for c in checks):.3g}; tokens "
          f"{'equal' if filed.tokens == preset.tokens else 'DIFFER'}")
    a, b = decision_stream(preset.events), decision_stream(filed.events)
    assert a == b, first_difference(a, b)
    assert filed.tokens == preset.tokens
