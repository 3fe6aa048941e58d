"""An alias (`/api/copy`) and the model it names share one loaded engine on the real bundled SmolLM2,
and every reply names the model as its request did."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import ollama
import openai
import pytest

from kinfer.engines.loader import load_engine
from tests.live_server import LiveServer, running_server, server_settings

HI = [{"role": "user", "content": "Hi."}]
SHORT = {"temperature": 0, "num_predict": 3}


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, list[str]]]:
    """The real server on the bundled SmolLM2, and the name of every engine it loaded, in order."""
    home = tmp_path_factory.mktemp("kinfer-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("OLLAMA_MODELS", str(home / "no-ollama"))
    loads: list[str] = []

    def counting(model, settings, ctx):
        loads.append(model.name)
        return load_engine(model, settings, ctx=ctx)

    try:
        with running_server(server_settings(home, parallel=2), engine_factory=counting) as server:
            yield server, loads
    finally:
        mp.undo()


def test_the_alias_and_the_real_name_share_one_engine_and_each_reply_echoes_its_name(counted):
    server, loads = counted
    client = ollama.Client(host=server.url)
    client.copy("smollm2:135m", "my-smol")

    assert client.chat(model="my-smol", messages=HI, options=SHORT).model == "my-smol"
    assert client.chat(model="smollm2:135m", messages=HI, options=SHORT).model == "smollm2:135m"
    streamed = list(client.chat(model="my-smol", messages=HI, options=SHORT, stream=True))
    assert {part.model for part in streamed} == {"my-smol"}
    assert client.generate(model="my-smol", prompt="Hi.", options=SHORT).model == "my-smol"
    chat = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert chat.chat.completions.create(model="my-smol", messages=HI, max_tokens=3).model == "my-smol"
    messages = httpx.post(
        server.url + "/v1/messages",
        json={"model": "my-smol", "max_tokens": 3, "messages": HI},
        timeout=60,
    )
    assert messages.json()["model"] == "my-smol"

    assert loads == ["my-smol"]  # one engine, loaded by the name first asked
    assert [m.model for m in client.ps().models] == ["my-smol"]


def test_keep_alive_zero_on_the_alias_unloads_the_shared_model(counted):
    server, loads = counted
    client = ollama.Client(host=server.url)
    client.copy("smollm2:135m", "my-smol")  # again: this test can run alone
    client.chat(model="smollm2", messages=HI, options=SHORT)
    assert len(client.ps().models) == 1
    already = len(loads)

    unloaded = client.generate(model="my-smol", prompt="", keep_alive=0)

    assert (unloaded.model, unloaded.done_reason) == ("my-smol", "unload")
    assert client.ps().models == []
    assert len(loads) == already  # the empty generate never loaded a second copy to unload it


def test_deleting_the_alias_a_model_was_loaded_by_keeps_it_loaded_under_its_own_name(counted):
    server, loads = counted
    client = ollama.Client(host=server.url)
    client.generate(model="smollm2", prompt="", keep_alive=0)  # start with nothing loaded
    client.copy("smollm2:135m", "my-smol")
    client.chat(model="my-smol", messages=HI, options=SHORT)
    already = len(loads)

    client.delete("my-smol")

    assert [m.model for m in client.ps().models] == ["smollm2:135m"]
    assert client.chat(model="smollm2", messages=HI, options=SHORT).model == "smollm2:135m"
    assert len(loads) == already  # still the engine the alias loaded
