"""kinfer.json: written atomically, read back exactly, and refused with a clear message when broken."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinfer.store.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    ManifestFile,
    read_manifest,
    write_manifest,
)

MANIFEST = Manifest(
    name="hf.co/owner/repo:q4_k_m",
    format="gguf",
    source="hf.co/owner/repo",
    revision="abc123",
    files=(ManifestFile("model-Q4_K_M.gguf", 1234, "ab" * 32),),
    pulled_at="2026-11-29T20:00:00+00:00",
)


def test_round_trip(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, MANIFEST)

    assert path == tmp_path / MANIFEST_NAME
    assert read_manifest(path) == MANIFEST
    assert json.loads(path.read_text())["files"][0] == {
        "path": "model-Q4_K_M.gguf",
        "size": 1234,
        "sha256": "ab" * 32,
    }


def test_rewrite_leaves_no_temporary_files(tmp_path: Path) -> None:
    write_manifest(tmp_path, MANIFEST)
    newer = Manifest(**{**MANIFEST.__dict__, "revision": "def456"})

    write_manifest(tmp_path, newer)

    assert read_manifest(tmp_path / MANIFEST_NAME).revision == "def456"
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_NAME]


def test_pulled_at_is_a_timestamp() -> None:
    assert MANIFEST.pulled_timestamp == 1_795_982_400.0


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / MANIFEST_NAME
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": None}, "field 'name' should be str"),
        ({"format": "onnx"}, "format 'onnx' should be 'gguf' or 'mlx'"),
        ({"files": []}, "lists no files"),
        ({"files": [{"path": "../../etc/passwd", "size": 1}]}, "not a plain relative path"),
        ({"files": [{"path": "/etc/passwd", "size": 1}]}, "not a plain relative path"),
        ({"files": [{"path": "a.gguf", "size": "big"}]}, "field 'size' should be int"),
        ({"pulled_at": "yesterday"}, "not an ISO 8601 time"),
    ],
)
def test_bad_fields_are_named(tmp_path: Path, change: dict, message: str) -> None:
    data = {**MANIFEST.to_dict(), **change}
    path = _write(tmp_path, data)

    with pytest.raises(ManifestError, match=message):
        read_manifest(path)


def test_missing_field_is_named(tmp_path: Path) -> None:
    data = MANIFEST.to_dict()
    del data["pulled_at"]

    with pytest.raises(ManifestError, match="missing field 'pulled_at'"):
        read_manifest(_write(tmp_path, data))


def test_bad_json_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"name": "x", ')

    with pytest.raises(ManifestError) as caught:
        read_manifest(path)

    assert str(path) in caught.value.message
    assert "not valid JSON" in caught.value.message
