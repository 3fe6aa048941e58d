"""`pull()` against a fake Hub: which files it picks, how it resumes, verifies, refuses and reports."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from kinfer.errors import ModelNotFound, StoreError
from kinfer.store.catalog import Store
from kinfer.store.hub import GatedRepo, HubClient, HubUnreachable
from kinfer.store.progress import PullProgress
from kinfer.store.pull import NotEnoughSpace, PullBusy, iter_pull, pull
from kinfer.store.pull_plan import UnsupportedModel
from kinfer.store.transfer import ChecksumMismatch, PullCancelled
from tests.fixtures.hub_server import FakeRepo, HubServer
from tests.store.pull.conftest import RESUMABLE_VOCAB, mlx_repo_files


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetched(hub: HubServer) -> set[str]:
    """Repo paths whose bytes the hub sent (LFS files come from /_cdn/, small ones from /resolve/)."""
    paths = set()
    hub.settle()
    for r in hub.requests:
        if r.method != "GET" or r.status not in (200, 206):
            continue
        if r.path.startswith("/_cdn/"):  # /_cdn/{owner}/{repo}/{path}
            paths.add(unquote(r.path.split("/", 4)[-1]))
        elif "/resolve/" in r.path:  # /{owner}/{repo}/resolve/{revision}/{path}
            paths.add(unquote(r.path.split("/", 5)[-1]))
    return paths


def names(store: Store) -> list[str]:
    return [m.name for m in store.list()]


@pytest.fixture
def quant_repo(hub: HubServer, gguf_bytes) -> dict[str, bytes]:
    """A GGUF repo with four quants (sizes differ), a projector and an imatrix."""
    files = {
        "model-Q2_K.gguf": gguf_bytes("Q8_0", n_vocab=64),
        "model-Q4_K_M.gguf": gguf_bytes("F16", n_vocab=128),
        "model-Q8_0.gguf": gguf_bytes("F32", n_vocab=128),
        "model-F16.gguf": gguf_bytes("F32", n_vocab=256),
        "mmproj-model-f16.gguf": gguf_bytes("Q8_0", n_vocab=32),  # the smallest, never picked
        "imatrix.gguf": gguf_bytes("Q8_0", n_vocab=32),
        "README.md": b"# quants",
    }
    hub.repos["bartowski/Tiny-GGUF"] = FakeRepo(files)
    return files


@pytest.mark.parametrize(
    ("ref", "expected_file", "expected_name"),
    [
        ("bartowski/Tiny-GGUF", "model-Q4_K_M.gguf", "hf.co/bartowski/Tiny-GGUF:q4_k_m"),
        ("bartowski/Tiny-GGUF:q8_0", "model-Q8_0.gguf", "hf.co/bartowski/Tiny-GGUF:q8_0"),
        ("hf.co/bartowski/Tiny-GGUF:F16", "model-F16.gguf", "hf.co/bartowski/Tiny-GGUF:f16"),
        ("bartowski/Tiny-GGUF:model-Q2_K.gguf", "model-Q2_K.gguf", "hf.co/bartowski/Tiny-GGUF:q2_k"),
    ],
)
def test_quant_selection_fetches_only_the_chosen_file(
    hub: HubServer,
    store: Store,
    quant_repo: dict[str, bytes],
    ref: str,
    expected_file: str,
    expected_name: str,
) -> None:
    model = pull(store, ref)

    assert model.name == expected_name
    assert model.path.name == expected_file
    assert model.path.read_bytes() == quant_repo[expected_file]
    assert fetched(hub) == {expected_file}
    assert names(store) == [expected_name]


def test_without_q4_k_m_the_smallest_model_file_is_picked(hub: HubServer, store: Store, gguf_bytes) -> None:
    hub.repos["o/NoDefault-GGUF"] = FakeRepo(
        {
            "m-Q8_0.gguf": gguf_bytes("F32", n_vocab=128),
            "m-Q5_K_S.gguf": gguf_bytes("F16", n_vocab=64),
            "mmproj-m-Q8_0.gguf": gguf_bytes("Q8_0", n_vocab=32),
        }
    )
    assert pull(store, "o/NoDefault-GGUF").name == "hf.co/o/NoDefault-GGUF:q5_k_s"


def test_an_unknown_quant_lists_the_ones_there_are(hub: HubServer, store: Store, quant_repo) -> None:
    with pytest.raises(ModelNotFound, match=r"Q3_K_L.*available: F16, Q2_K, Q4_K_M, Q8_0"):
        pull(store, "bartowski/Tiny-GGUF:Q3_K_L")
    assert names(store) == []


def test_every_shard_of_a_split_gguf_is_fetched_and_listed_as_one_model(
    hub: HubServer, store: Store, gguf_bytes
) -> None:
    shards = gguf_bytes("F32", n_vocab=64, split=3)
    files = {f"Q8_0/Big-Q8_0-{i:05d}-of-00003.gguf": data for i, data in enumerate(shards, 1)}
    files["Big-Q2_K.gguf"] = gguf_bytes("Q8_0")
    hub.repos["o/Big-GGUF"] = FakeRepo(files)

    model = pull(store, "o/Big-GGUF:Q8_0")

    assert model.name == "hf.co/o/Big-GGUF:q8_0"
    assert [f.name for f in model.files] == [f"Big-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert model.path.name == "Big-Q8_0-00001-of-00003.gguf"
    assert [f.read_bytes() for f in model.files] == shards
    assert model.size == sum(len(s) for s in shards)
    assert names(store) == ["hf.co/o/Big-GGUF:q8_0"]


def test_an_mlx_directory_brings_only_the_weights_and_what_describes_them(
    hub: HubServer, store: Store
) -> None:
    files = mlx_repo_files()
    hub.repos["mlx-community/Tiny-Llama-bf16"] = FakeRepo(files)

    model = pull(store, "mlx-community/Tiny-Llama-bf16")

    assert model.name == "hf.co/mlx-community/Tiny-Llama-bf16"
    assert model.format == "mlx"
    kept = {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    }
    on_disk = {str(p.relative_to(model.path)) for p in model.path.rglob("*") if p.is_file()}
    assert on_disk == kept | {"kinfer.json"}
    assert all((model.path / name).read_bytes() == files[name] for name in kept)
    assert fetched(hub) == kept


def test_a_dropped_connection_is_resumed_by_the_next_pull_with_a_range_request(
    hub: HubServer, store: Store, gguf_bytes
) -> None:
    data = gguf_bytes("F32", n_vocab=RESUMABLE_VOCAB)
    hub.repos["o/Cut-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": data})
    hub.cut_after("o/Cut-GGUF", "m-Q4_K_M.gguf", len(data) // 3)

    with pytest.raises(HubUnreachable, match="run the same pull again to resume"):
        pull(store, "o/Cut-GGUF", retries=0)
    assert names(store) == []
    partial = store.partial_dir / store.slug_for("hf.co/o/Cut-GGUF:q4_k_m") / "m-Q4_K_M.gguf.part"
    kept = partial.stat().st_size
    assert 0 < kept < len(data)

    model = pull(store, "o/Cut-GGUF", retries=0)

    first, second = hub.downloads("m-Q4_K_M.gguf")
    assert first.range is None and first.body_bytes == kept
    assert second.range == f"bytes={kept}-" and second.status == 206
    assert second.body_bytes == len(data) - kept < len(data)
    assert model.path.read_bytes() == data
    assert names(store) == ["hf.co/o/Cut-GGUF:q4_k_m"]


def test_one_pull_reconnects_by_itself_after_a_dropped_connection(
    hub: HubServer, store: Store, gguf_bytes
) -> None:
    data = gguf_bytes("F32", n_vocab=RESUMABLE_VOCAB)
    hub.repos["o/Cut-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": data})
    hub.cut_after("o/Cut-GGUF", "m-Q4_K_M.gguf", len(data) // 2)

    model = pull(store, "o/Cut-GGUF")

    first, second = hub.downloads("m-Q4_K_M.gguf")
    assert second.range == f"bytes={first.body_bytes}-"
    assert first.body_bytes + second.body_bytes == len(data)
    assert model.path.read_bytes() == data


def test_a_pull_killed_with_sigkill_is_resumed_by_the_next_one(
    hub: HubServer, store: Store, gguf_bytes, tmp_path: Path
) -> None:
    data = gguf_bytes("F32", n_vocab=RESUMABLE_VOCAB)
    hub.repos["o/Killed-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": data})
    hub.throttle(len(data) / 4)  # about 4 s for the whole file: time to kill it part way
    script = (
        "from kinfer.store.catalog import Store\n"
        "from kinfer.store.pull import pull\n"
        f"pull(Store({str(store.home)!r}, ollama_models=None, bundled=False), 'o/Killed-GGUF')\n"
    )
    env = {**os.environ, "HF_TOKEN_PATH": str(tmp_path / "no-token")}
    child = subprocess.Popen([sys.executable, "-c", script], env=env)
    part = store.partial_dir / store.slug_for("hf.co/o/Killed-GGUF:q4_k_m") / "m-Q4_K_M.gguf.part"
    deadline = time.monotonic() + 60
    while not (part.is_file() and part.stat().st_size > 0):
        assert child.poll() is None, "the pull ended before it could be killed"
        assert time.monotonic() < deadline, "the pull never started writing"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    hub.throttle(None)
    kept = part.stat().st_size
    assert names(store) == []

    model = pull(store, "o/Killed-GGUF")  # the dead pull's lock went with its process

    # the killed transfer's own record may land late (its server thread notices the dead socket
    # whenever it next writes), so look for the resumed request rather than the last one
    resumed = [d for d in hub.downloads("m-Q4_K_M.gguf") if d.range]
    assert resumed and resumed[-1].range == f"bytes={kept}-" and resumed[-1].body_bytes == len(data) - kept
    assert model.path.read_bytes() == data


def test_a_cancelled_pull_keeps_its_partial_file_and_the_next_one_resumes(
    hub: HubServer, store: Store, gguf_bytes
) -> None:
    data = gguf_bytes("F32", n_vocab=RESUMABLE_VOCAB)
    hub.repos["o/Slow-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": data})
    cancel = threading.Event()

    def cancel_once_bytes_arrive(event: PullProgress) -> None:
        if event.phase == "downloading" and event.completed > 0:
            cancel.set()

    with pytest.raises(PullCancelled):
        pull(store, "o/Slow-GGUF", on_progress=cancel_once_bytes_arrive, cancel=cancel)
    assert names(store) == []

    events: list[PullProgress] = []
    model = pull(store, "o/Slow-GGUF", on_progress=events.append)

    second = hub.downloads("m-Q4_K_M.gguf")[-1]
    assert second.range is not None and second.body_bytes < len(data)
    assert next(e for e in events if e.phase == "downloading").resumed_from > 0
    assert model.path.read_bytes() == data


def test_a_wrong_sha256_removes_the_file_and_fails_loudly(hub: HubServer, store: Store, gguf_bytes) -> None:
    hub.repos["o/Bad-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": gguf_bytes()})
    hub.corrupt_sha256("o/Bad-GGUF", "m-Q4_K_M.gguf")

    with pytest.raises(ChecksumMismatch, match="sha256 mismatch"):
        pull(store, "o/Bad-GGUF")

    assert names(store) == []
    leftovers = [p.name for p in store.partial_dir.rglob("*.gguf*")]
    assert leftovers == []


def test_a_missing_repo_says_so(hub: HubServer, store: Store) -> None:
    with pytest.raises(ModelNotFound, match="no such repo on the hub: nobody/nothing"):
        pull(store, "nobody/nothing")


def test_a_gated_repo_asks_for_a_token_and_works_with_one(
    hub: HubServer, store: Store, gguf_bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = FakeRepo({"m-Q4_K_M.gguf": gguf_bytes()}, gated=True)
    hub.repos["meta/Gated-GGUF"] = repo

    with pytest.raises(GatedRepo) as refused:
        pull(store, "meta/Gated-GGUF")
    assert refused.value.message == (
        f"meta/Gated-GGUF is gated/private: set HF_TOKEN and accept the license at {hub.url}/meta/Gated-GGUF"
    )
    assert names(store) == []

    monkeypatch.setenv("HF_TOKEN", repo.token)
    model = pull(store, "meta/Gated-GGUF")
    assert model.name == "hf.co/meta/Gated-GGUF:q4_k_m"
    assert hub.downloads("m-Q4_K_M.gguf")[-1].authorization == f"Bearer {repo.token}"


def test_a_safetensors_repo_mlx_cannot_serve_suggests_gguf_conversions(
    hub: HubServer, store: Store, gguf_bytes
) -> None:
    config = {"model_type": "t5", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    hub.repos["google/tiny-bert"] = FakeRepo(mlx_repo_files(config))
    hub.repos["someone/tiny-bert-GGUF"] = FakeRepo({"tiny-bert-Q4_K_M.gguf": gguf_bytes()})

    with pytest.raises(UnsupportedModel) as refused:
        pull(store, "google/tiny-bert")

    assert "MLX cannot serve google/tiny-bert" in refused.value.message
    assert "'t5'" in refused.value.message
    assert refused.value.suggestions == ("someone/tiny-bert-GGUF",)
    assert "kinfer pull someone/tiny-bert-GGUF" in refused.value.message
    hub.settle()
    assert not any(r.path.endswith(".safetensors") for r in hub.requests)


def test_a_pull_that_will_not_fit_on_disk_is_refused_before_downloading(
    hub: HubServer, store: Store, quant_repo
) -> None:
    with pytest.raises(NotEnoughSpace, match=r"not enough disk space for hf\.co/bartowski/Tiny-GGUF:q4_k_m"):
        pull(store, "bartowski/Tiny-GGUF", free_space=lambda _path: 100 * 1024 * 1024)
    assert fetched(hub) == set()
    assert names(store) == []


def test_a_url_to_one_file_pulls_that_file(hub: HubServer, store: Store, quant_repo) -> None:
    model = pull(store, f"{hub.url}/bartowski/Tiny-GGUF/resolve/main/model-Q8_0.gguf")
    assert model.name == "hf.co/bartowski/Tiny-GGUF:q8_0"
    assert fetched(hub) == {"model-Q8_0.gguf"}


def test_progress_events_cover_the_pull_in_order(hub: HubServer, store: Store, gguf_bytes) -> None:
    shards = gguf_bytes("F32", n_vocab=64, split=2)
    files = {f"M-Q4_K_M-0000{i}-of-00002.gguf": data for i, data in enumerate(shards, 1)}
    hub.repos["o/Two-GGUF"] = FakeRepo(files)
    events: list[PullProgress] = []

    pull(store, "o/Two-GGUF", on_progress=events.append)

    phases = [e.phase for e in events]
    assert phases[0] == "resolving" and phases[-2:] == ["installing", "success"]
    total = sum(len(d) for d in shards)
    for path, data in files.items():
        mine = [e for e in events if e.file == path and e.phase == "downloading"]
        assert mine[-1].completed == mine[-1].total == len(data)
        assert mine[-1].ollama_status() == {
            "status": f"pulling {sha256(data)[:12]}",
            "digest": f"sha256:{sha256(data)}",
            "total": len(data),
            "completed": len(data),
        }
    assert all(e.overall_total == total for e in events[1:])
    overall = [e.overall_completed for e in events]
    assert overall == sorted(overall) and overall[-1] == total
    assert events[-1].ollama_status() == {"status": "success"}
    assert events[-1].model == "hf.co/o/Two-GGUF:q4_k_m"
    assert {"status": "verifying sha256 digest"} in [e.ollama_status() for e in events]


def test_iter_pull_yields_the_events_and_ends_in_success(hub: HubServer, store: Store, quant_repo) -> None:
    events = list(iter_pull(store, "bartowski/Tiny-GGUF"))
    assert events[-1].phase == "success"
    assert names(store) == ["hf.co/bartowski/Tiny-GGUF:q4_k_m"]


def test_iter_pull_raises_what_the_pull_raised(hub: HubServer, store: Store) -> None:
    with pytest.raises(ModelNotFound):
        list(iter_pull(store, "nobody/nothing"))


def test_pulling_what_is_already_installed_downloads_nothing(
    hub: HubServer, store: Store, quant_repo
) -> None:
    first = pull(store, "bartowski/Tiny-GGUF")
    before = len(hub.downloads(".gguf"))
    again = pull(store, "bartowski/Tiny-GGUF")
    assert again.path == first.path
    assert len(hub.downloads(".gguf")) == before


def test_two_pulls_of_one_model_at_once_download_it_once(hub: HubServer, store: Store, gguf_bytes) -> None:
    data = gguf_bytes("F32", n_vocab=RESUMABLE_VOCAB)
    hub.repos["o/Busy-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": data})
    hub.throttle(len(data) * 4)  # about a quarter second per transfer: long enough to overlap
    results: list[object] = []

    def worker() -> None:
        try:
            results.append(pull(store, "o/Busy-GGUF"))
        except Exception as exc:  # reported below
            results.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert [getattr(r, "name", r) for r in results] == ["hf.co/o/Busy-GGUF:q4_k_m"] * 2
    assert sum(r.body_bytes for r in hub.downloads("m-Q4_K_M.gguf")) == len(data)
    assert results[0].path.read_bytes() == data


def test_a_pull_that_may_not_wait_for_another_is_refused(hub: HubServer, store: Store, quant_repo) -> None:
    slug = store.slug_for("hf.co/bartowski/Tiny-GGUF:q4_k_m")
    store.partial_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(store.partial_dir / f"{slug}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what another kinfer process pulling it would hold
        with pytest.raises(PullBusy, match=r"another pull of hf\.co/bartowski/Tiny-GGUF:q4_k_m"):
            pull(store, "bartowski/Tiny-GGUF", wait=False)
    finally:
        os.close(fd)
    assert pull(store, "bartowski/Tiny-GGUF", wait=False).name == "hf.co/bartowski/Tiny-GGUF:q4_k_m"


def test_offline_mode_is_reported(hub: HubServer, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubUnreachable, match="offline mode"):
        pull(store, "bartowski/Tiny-GGUF")


def test_an_unreachable_hub_is_reported(
    store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with HubServer() as gone:
        gone.patch_env(monkeypatch, token_dir=str(tmp_path))
    # the server has stopped: nothing listens at HF_ENDPOINT any more
    with pytest.raises(HubUnreachable, match="cannot reach the hub"):
        pull(store, "o/r")


def test_gguf_suggestions_fall_back_to_the_gguf_tag(hub: HubServer, gguf_bytes) -> None:
    hub.repos["google/tiny-bert"] = FakeRepo(mlx_repo_files({"model_type": "bert"}))
    hub.repos["someone/tiny-bert-quantized"] = FakeRepo({"tiny-bert-Q4_K_M.gguf": gguf_bytes()})
    hub.repos["someone/tiny-bert-onnx"] = FakeRepo({"model.onnx": b"\0"})

    assert HubClient().search_gguf("tiny-bert", exclude="google/tiny-bert") == ["someone/tiny-bert-quantized"]


def test_a_hub_file_name_too_long_for_a_model_name_is_refused(
    hub: HubServer, store: Store, gguf_bytes
) -> None:
    # without a quant tag the file's stem becomes the tag: the hub chooses the name's length
    hub.repos["o/Long-GGUF"] = FakeRepo({"m" * 300 + ".gguf": gguf_bytes()})
    with pytest.raises(StoreError, match="at most 256 characters"):
        pull(store, "o/Long-GGUF")
    assert names(store) == []
    assert fetched(hub) == set()


def test_a_hub_that_sends_more_than_it_lists_fails_the_pull_once(
    hub: HubServer, store: Store, gguf_bytes
) -> None:
    data = gguf_bytes("F32", RESUMABLE_VOCAB)
    hub.repos["o/Oversize-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": data})
    hub.serve_extra("o/Oversize-GGUF", "m-Q4_K_M.gguf", 1000)
    outcome: list[BaseException] = []
    cancel = threading.Event()

    def run() -> None:
        try:
            pull(store, "o/Oversize-GGUF", cancel=cancel)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(30)
    cancel.set()  # (a pull that loops for ever is stopped here, and the test fails below)

    assert not worker.is_alive() and len(outcome) == 1
    assert isinstance(outcome[0], ChecksumMismatch)
    assert "consistency check failed" in outcome[0].message and "m-Q4_K_M.gguf" in outcome[0].message
    assert len(hub.downloads("m-Q4_K_M.gguf")) == 1  # one download, not one after another
    assert names(store) == [] and list(store.partial_dir.rglob("*.gguf*")) == []
