"""GGUF models on the H200: an exported preset, run from its file with its own weights, matches the oracle,
replays what it computed eagerly, and decides and generates as the preset does (issue 27, the llama part)."""

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.runner import run
from support.decisions import decision_stream

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]
pytest.importorskip("gguf")


@pytest.mark.parametrize("model,wtype", [("tiny", "f16"), ("tiny", "q8_0"), ("1b", "q8_0")])
def test_an_exported_preset_on_the_gpu_runs_as_the_preset(tmp_path, model, wtype):
    path = tmp_path / f"{model}-{wtype}.gguf"
    assert main(["export-gguf", "--model", model, "--wtype", wtype, str(path)]) == 0
    base = {"backend": "cuda", "steps": 8, "prompt_tokens": 8, "oracle": True, "verify": True}
    preset = run(resolve({**base, "model": model, "wtype": wtype}, environ={}))
    filed = run(resolve({**base, "model": str(path)}, environ={}))
    assert filed.header["backend"] == "cuda" and filed.header["model_file"]["arch"] == "llama"
    checks = [c for c in filed.events if isinstance(c, E.OracleCheck)]
    assert checks and all(c.ok for c in checks), [(c.step, c.rel_err) for c in checks if not c.ok]
    assert all(v.ok for v in filed.events if isinstance(v, E.VerifyResult))
    assert decision_stream(filed.events) == decision_stream(preset.events)
    assert filed.tokens == preset.tokens
    print(f"{model} {wtype} from its GGUF: oracle max rel err {max(c.rel_err for c in checks):.3g}")
