"""The differential test's seed line (tests/support/diff_seeds.py): every seed that ran, its outcomes, the
failed files named."""

from types import SimpleNamespace as R

from tests.support.diff_seeds import seed_summary

T = "tests/gpu/test_llama_differential.py::test_generated_timeline_decides_as_llama_cpp"


def test_seeds_and_outcomes_from_reports():
    stats = {"passed": [R(nodeid=f"{T}[tiny-llama-f16-seed19]", when="call"),
                        R(nodeid=f"{T}[tiny-qwen2-q8_0-seed7]", when="call"),
                        R(nodeid=f"{T}[tiny-qwen2-q8_0-seed7]", when="setup")],      # not a call: not counted
             "failed": [R(nodeid=f"{T}[qwen3moe-tiny-qwen3moe-f16-seed19]", when="call")],
             "skipped": [R(nodeid=f"{T}[gemma3-seed19]", when="setup")],
             "": [R(nodeid="tests/gpu/test_kernels.py::test_x", when="call")]}
    assert seed_summary(stats) == ("differential seeds: 7 (1 passed); 19 (1 passed, 1 failed: "
                                   "qwen3moe-tiny-qwen3moe-f16, 1 skipped)")


def test_nothing_without_differential_cases():
    assert seed_summary({"passed": [R(nodeid="tests/gpu/test_kernels.py::test_x", when="call")]}) == ""
