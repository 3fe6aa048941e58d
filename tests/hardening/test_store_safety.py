"""The store under concurrent and hostile use through the server: pulls of one repo at once, a hub
that lists a file outside the store, and deleting the model the server is generating with."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import httpx
import pytest

from kinfer.store.names import slug_for
from tests.fixtures.hub_server import FakeRepo, HubServer
from tests.fixtures.tiny_gguf import write_tiny_gguf
from tests.live_server import running_server, server_settings

RESUMABLE_VOCAB = 4096  # big enough that a transfer takes several chunks, so two pulls overlap


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with HubServer() as server:
        server.patch_env(monkeypatch, token_dir=str(tmp_path))
        yield server


@pytest.fixture
def gguf_data(tmp_path: Path) -> bytes:
    return write_tiny_gguf(tmp_path / "src" / "m.gguf", n_vocab=RESUMABLE_VOCAB)[0].read_bytes()


def test_concurrent_pulls_of_one_repo_through_the_server_agree_and_download_once(
    tmp_path: Path, hub: HubServer, gguf_data: bytes
):
    hub.repos["o/Busy-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": gguf_data})
    hub.throttle(len(gguf_data) * 4)  # about a quarter second per transfer: long enough to overlap
    home = tmp_path / "home"
    results: list[tuple[int, str]] = []

    with running_server(server_settings(home)) as server:

        def pull(stream: bool) -> None:
            reply = httpx.post(
                server.url + "/api/pull", json={"model": "o/Busy-GGUF", "stream": stream}, timeout=120
            )
            results.append((reply.status_code, reply.text.strip().splitlines()[-1]))

        threads = [threading.Thread(target=pull, args=(i % 2 == 0,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        tags = httpx.get(server.url + "/api/tags", timeout=10).json()["models"]

    assert [(status, json.loads(last)) for status, last in results] == [(200, {"status": "success"})] * 4
    assert sum(r.body_bytes for r in hub.downloads("m-Q4_K_M.gguf")) == len(gguf_data)
    pulled = [m for m in tags if m["name"].startswith("hf.co/o/Busy-GGUF")]
    assert len(pulled) == 1
    files = list((home / "models").rglob("*.gguf"))
    assert (
        len(files) == 1
        and hashlib.sha256(files[0].read_bytes()).digest() == hashlib.sha256(gguf_data).digest()
    )
    leftovers = [p for p in (home / "partial").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert leftovers == []


def test_a_hub_listing_a_file_outside_the_store_writes_nothing_there(
    tmp_path: Path, hub: HubServer, gguf_data: bytes
):
    escape = tmp_path / "outside" / "escaped-Q4_K_M.gguf"
    escape.parent.mkdir()
    hub.repos["o/Evil-GGUF"] = FakeRepo({str(escape): gguf_data})
    with running_server(server_settings(tmp_path / "home")) as server:
        reply = httpx.post(
            server.url + "/api/pull", json={"model": "o/Evil-GGUF", "stream": False}, timeout=60
        )
    assert 400 <= reply.status_code < 500, reply.text
    assert not escape.exists()


def test_deleting_the_loaded_model_unloads_it_and_ends_its_replies(tmp_path: Path, smollm2_gguf: Path):
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    victim = home / "models" / "victim.gguf"
    try:
        os.link(smollm2_gguf, victim)  # the same weights under a name the store may delete
    except OSError:
        victim.write_bytes(smollm2_gguf.read_bytes())
    body = {
        "model": "victim",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "stream": True,
        "options": {"num_predict": 2000, "temperature": 0},
    }
    with (
        running_server(server_settings(home, parallel=2, ctx=2048)) as server,
        httpx.Client(base_url=server.url, timeout=120) as client,
    ):
        lines: list[dict] = []
        with client.stream("POST", "/api/chat", json=body) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if not line.strip():
                    continue
                lines.append(json.loads(line))
                if len(lines) == 3:
                    assert [m["name"] for m in client.get("/api/ps").json()["models"]] == ["victim"]
                    deleted = client.request("DELETE", "/api/delete", json={"model": "victim"})
                    assert deleted.status_code == 200, deleted.text
        # the reply in flight ends with an error line, not a silent cut
        assert "unloaded" in lines[-1].get("error", ""), lines[-1]
        assert client.get("/api/ps").json()["models"] == []
        assert not victim.exists()
        assert [m["name"] for m in client.get("/api/tags").json()["models"]] == ["smollm2:135m"]
        gone = client.post("/api/chat", json={**body, "stream": False})
        assert gone.status_code == 404
        still = client.post(
            "/api/chat", json={**body, "model": "smollm2", "stream": False, "options": {"num_predict": 4}}
        )
        assert still.status_code == 200, still.text
    assert smollm2_gguf.is_file()


PLANTED_LINKS = {
    # what a pull opens in partial/, as a link to a file (or folder) outside the store
    "part-file": lambda staging, outside: (staging / "m-Q4_K_M.gguf.part", outside / "victim.txt"),
    "pull-state": lambda staging, outside: (staging / ".kinfer-pull.json", outside / "victim.txt"),
    "finished-file": lambda staging, outside: (staging / "m-Q4_K_M.gguf", outside / "same-size.bin"),
    "staging-folder": lambda staging, outside: (staging, outside),
    "lock-file": lambda staging, outside: (staging.with_name(staging.name + ".lock"), outside / "new.lock"),
}


@pytest.mark.parametrize("planted", PLANTED_LINKS)
def test_a_link_planted_in_partial_never_reaches_outside_the_store(
    tmp_path: Path, hub: HubServer, gguf_data: bytes, planted: str
):
    hub.repos["o/Linked-GGUF"] = FakeRepo({"m-Q4_K_M.gguf": gguf_data})
    home = tmp_path / "home"
    staging = home / "partial" / slug_for("hf.co/o/Linked-GGUF:q4_k_m")
    staging.parent.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_bytes(b"precious\n")
    (outside / "same-size.bin").write_bytes(b"\0" * len(gguf_data))  # passes a size check
    link, points_at = PLANTED_LINKS[planted](staging, outside)
    if link != staging:
        staging.mkdir()
    link.symlink_to(points_at)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}

    with running_server(server_settings(home)) as server:
        reply = httpx.post(
            server.url + "/api/pull", json={"model": "o/Linked-GGUF", "stream": False}, timeout=60
        )
        names = [m["name"] for m in httpx.get(server.url + "/api/tags", timeout=10).json()["models"]]

    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before
    if planted == "pull-state":  # kinfer's own bookkeeping: the link is replaced, the pull goes on
        assert reply.status_code == 200, reply.text
        assert "hf.co/o/Linked-GGUF:q4_k_m" in names
    else:
        assert reply.status_code == 400 and "symbolic link" in reply.json()["error"], reply.text
        assert "hf.co/o/Linked-GGUF:q4_k_m" not in names


def test_deleting_takes_the_exact_name_or_alias_never_a_prefix(tmp_path: Path):
    home = tmp_path / "home"
    [beta] = write_tiny_gguf(home / "models" / "Beta-GGUF-Q8_0.gguf")
    with (
        running_server(server_settings(home)) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        for prefix in ("beta", "Beta-GGUF", "beta-gguf-q8"):
            reply = client.request("DELETE", "/api/delete", json={"model": prefix})
            assert reply.status_code == 404, reply.text
            assert "did you mean Beta-GGUF-Q8_0?" in reply.json()["error"]
        assert beta.exists()
        assert client.post("/api/copy", json={"source": "beta", "destination": "b"}).status_code == 200
        assert client.request("DELETE", "/api/delete", json={"model": "b"}).status_code == 200  # the alias
        assert beta.exists()
        assert client.request("DELETE", "/api/delete", json={"model": "beta-gguf-q8_0"}).status_code == 200
        assert not beta.exists()
