"""qwen2 / qwen3 GGUF files on the H200 (issue 27, point 1): a preset exported as each architecture runs from
its file on CUDA within the oracle bound, replays what it computed eagerly, and decides and generates as the
preset of that architecture does; a generated qwen3 with head_dim 64 != n_embd / n_head runs too."""

import dataclasses

import pytest

from graphdiag import events as E
from graphdiag.cli.main import main
from graphdiag.config import resolve
from graphdiag.model.arch import get_arch
from graphdiag.model.presets import PRESETS
from graphdiag.runner import run
from support.arch_gguf import MINI_QWEN3_WIDE, write_arch_gguf
from support.decisions import decision_stream, first_difference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("require_gpu")]
pytest.importorskip("gguf")

BASE = {"backend": "cuda", "steps": 8, "prompt_tokens": 8, "oracle": True, "verify": True}


def _checked(res):
    checks = [c for c in res.events if isinstance(c, E.OracleCheck)]
    assert checks and all(c.ok for c in checks), [(c.step, c.rel_err) for c in checks if not c.ok]
    assert all(v.ok for v in res.events if isinstance(v, E.VerifyResult)) and not res.failures
    return max(c.rel_err for c in checks)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_an_exported_qwen_preset_on_the_gpu_runs_and_decides_as_the_preset(tmp_path, monkeypatch, arch, wtype):
    path = tmp_path / f"tiny-{arch}-{wtype}.gguf"
    assert main(["export-gguf", "--model", "tiny", "--wtype", wtype, "--arch", arch, str(path)]) == 0
    name = f"tiny-{arch}"
    monkeypatch.setitem(PRESETS, name, dataclasses.replace(get_arch(arch).preset(PRESETS["tiny"]), name=name))
    preset = run(resolve({**BASE, "model": name, "wtype": wtype}, environ={}))
    filed = run(resolve({**BASE, "model": str(path)}, environ={}))
    assert filed.header["backend"] == "cuda" and filed.header["model_file"]["arch"] == arch
    err = _checked(filed)
    _checked(preset)
    print(f"{arch} {wtype} from its GGUF: oracle max rel err {err:.3g}")
    a, b = decision_stream(preset.events), decision_stream(filed.events)
    assert a == b, first_difference(a, b)
    assert filed.tokens == preset.tokens


def test_a_wide_head_qwen3_file_runs_on_the_gpu(tmp_path):
    p = write_arch_gguf(tmp_path / "wide.gguf", "qwen3", MINI_QWEN3_WIDE, tied=True)
    print(f"qwen3 head_dim 64: oracle max rel err {_checked(run(resolve({**BASE, 'model': str(p)}, environ={}))):.3g}")
