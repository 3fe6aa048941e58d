"""`kinfer pull` and `kinfer can-run` from the command line, and the progress they draw."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest

from kinfer import cli
from kinfer.store import transfer
from kinfer.store.progress import ProgressPrinter, PullProgress
from tests.fixtures.hub_server import FakeRepo, HubServer


@pytest.fixture
def kinfer(kinfer_home, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """Run `kinfer ARGS...` in-process with only the pull commands registered; returns (rc, out, err)."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("pull",))

    def run(*argv: str) -> tuple[int, str, str]:
        rc = cli.main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return run


@pytest.fixture
def gguf_repo(hub: HubServer, gguf_bytes) -> str:
    hub.repos["o/Tiny-GGUF"] = FakeRepo(
        {"Tiny-Q4_K_M.gguf": gguf_bytes("Q8_0"), "Tiny-Q8_0.gguf": gguf_bytes("F32")}
    )
    return "o/Tiny-GGUF"


def test_pull_prints_the_model_and_plain_progress_when_not_on_a_terminal(kinfer, gguf_repo: str) -> None:
    rc, out, err = kinfer("pull", gguf_repo)

    assert rc == 0
    assert out.startswith("pulled hf.co/o/Tiny-GGUF:q4_k_m (")
    lines = err.splitlines()
    assert "pulling manifest" in lines
    assert any(line.startswith("pulling Tiny-Q4_K_M.gguf ") for line in lines)
    assert "verifying sha256 digest" in lines and lines[-1] == "success"
    assert "\r" not in err


def test_pull_of_a_missing_repo_is_one_line_and_exit_1(kinfer, hub: HubServer) -> None:
    rc, out, err = kinfer("pull", "nobody/nothing")
    assert rc == 1 and out == ""
    assert err.splitlines()[-1].startswith("kinfer: no such repo on the hub: nobody/nothing")


def test_pull_of_a_gated_repo_says_what_to_do(kinfer, hub: HubServer, gguf_bytes) -> None:
    hub.repos["meta/Gated-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": gguf_bytes()}, gated=True)
    rc, _out, err = kinfer("pull", "meta/Gated-GGUF")
    assert rc == 1
    assert err.splitlines()[-1] == (
        f"kinfer: meta/Gated-GGUF is gated/private: set HF_TOKEN and accept the license at "
        f"{hub.url}/meta/Gated-GGUF"
    )


def test_pull_without_a_hub_says_it_cannot_reach_it(
    kinfer, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    with HubServer() as gone:
        gone.patch_env(monkeypatch, token_dir=str(tmp_path))
    rc, _out, err = kinfer("pull", "o/r")
    assert rc == 1
    assert err.splitlines()[-1].startswith("kinfer: cannot reach the hub at http://127.0.0.1:")


class FillingDisk:
    """Writes to `*.part` files fail with ENOSPC once `room` bytes went in, as on a full disk.

    The store opens a partial file with `open_nofollow` and wraps the descriptor with `os.fdopen`;
    the file objects made for `.part` descriptors are wrapped in turn."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, room: int) -> None:
        self.room = room
        parts: set[int] = set()
        real_open, real_fdopen = transfer.open_nofollow, os.fdopen

        def open_nofollow(path: Path, flags: int, *args):
            fd = real_open(path, flags, *args)
            if path.name.endswith(".part") and flags & os.O_WRONLY:
                parts.add(fd)
            return fd

        def fdopen(fd: int, *args, **kwargs):
            handle = real_fdopen(fd, *args, **kwargs)
            return _Filling(handle, self) if fd in parts else handle

        monkeypatch.setattr(transfer, "open_nofollow", open_nofollow)
        monkeypatch.setattr(os, "fdopen", fdopen)


class _Filling:
    def __init__(self, handle, disk: FillingDisk) -> None:
        self._handle, self._disk = handle, disk

    def write(self, data: bytes) -> int:
        if len(data) > self._disk.room:
            raise OSError(errno.ENOSPC, "No space left on device", self._handle.name)
        self._disk.room -= len(data)
        return self._handle.write(data)

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._handle.close()


def test_pull_on_a_full_disk_says_so_in_one_line_and_resumes_once_there_is_room(
    kinfer, gguf_repo: str, kinfer_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patched:
        FillingDisk(patched, room=100)
        rc, out, err = kinfer("pull", gguf_repo)

    assert rc == 1 and out == ""
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("kinfer: the disk is full: hf.co/o/Tiny-GGUF:q4_k_m needs ")
    assert f"more at {kinfer_home}" in last and "run the same pull again to resume" in last
    assert list((kinfer_home / "partial").rglob("*.part"))  # the partial file stays for the next pull

    rc, out, _err = kinfer("pull", gguf_repo)
    assert rc == 0 and out.startswith("pulled hf.co/o/Tiny-GGUF:q4_k_m")


def test_can_run_json_uses_the_ctx_and_parallel_flags(kinfer, gguf_repo: str) -> None:
    rc, out, _err = kinfer("can-run", gguf_repo, "--json", "--ctx", "1024", "--parallel", "2")
    assert rc == 0
    report = json.loads(out)
    assert (report["ctx"], report["parallel"]) == (1024, 2)
    assert [v["tag"] for v in report["variants"]] == ["Q4_K_M", "Q8_0"]  # smallest first
    assert {v["verdict"] for v in report["variants"]} <= {"comfortable", "tight", "too large"}
    assert report["machine"]["ram_total"] > 0


def test_can_run_prints_a_table_and_the_command_to_pull(kinfer, gguf_repo: str) -> None:
    rc, out, _err = kinfer("can-run", gguf_repo)
    assert rc == 0
    assert "estimate for 4096 tokens x 4 rows" in out
    assert "VARIANT" in out and "Q4_K_M" in out and "Q8_0" in out
    # two tiny files fit any machine that runs the tests; the larger one is the better pick
    assert out.rstrip().endswith("best fit: kinfer pull hf.co/o/Tiny-GGUF:q8_0")


def _events(total: int, steps: int) -> list[PullProgress]:
    return [
        PullProgress(
            status="pulling 0123456789ab",
            phase="downloading",
            file="model-Q4_K_M.gguf",
            completed=total * i // steps,
            total=total,
            overall_completed=total * i // steps,
            overall_total=total * 2,
        )
        for i in range(1, steps + 1)
    ]


def test_the_progress_bar_redraws_one_line_on_a_terminal() -> None:
    now = [0.0]
    stream = io.StringIO()
    printer = ProgressPrinter(stream, tty=True, clock=lambda: now[0])
    for event in _events(100 * 1024 * 1024, 10):
        now[0] += 1.0
        printer(event)

    text = stream.getvalue()
    assert text.count("\r") == 10 and text.endswith("\n")
    last = text.split("\r\x1b[2K")[-1]
    assert "100.0%" in last and "100.0 MiB/100.0 MiB" in last
    assert "10.0 MiB/s" in last and "ETA 00:00" in last
    assert "total 100.0 MiB/200.0 MiB ETA 00:10" in last


def test_plain_progress_writes_few_whole_lines() -> None:
    now = [0.0]
    stream = io.StringIO()
    printer = ProgressPrinter(stream, tty=False, clock=lambda: now[0])
    for event in _events(1000, 100):
        now[0] += 0.1  # 10 s in all: a line every 5 s, plus the first and the last
        printer(event)

    lines = stream.getvalue().splitlines()
    assert lines[0] == "pulling model-Q4_K_M.gguf 1000 B"
    assert 2 <= len(lines) <= 5
    assert lines[-1].startswith("model-Q4_K_M.gguf") and "100.0%" in lines[-1]
