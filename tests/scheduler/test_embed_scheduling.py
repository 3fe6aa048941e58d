"""Embedding requests through the scheduler on the real llama.cpp engine (the tiny BERT GGUF): inputs
are tokenized in each request's own task, never on the engine thread, and many concurrent requests
are embedded by the parallel contexts, each vector equal to its input's solo one."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kinfer.config import Settings
from kinfer.embedding import EmbedRequest
from kinfer.engines.llama.embed import LlamaEmbeddingEngine, gguf_pooling
from kinfer.errors import InvalidRequest
from kinfer.scheduler import Scheduler
from tests.fixtures.tiny_embed import write_tiny_bert_gguf
from tests.scheduler.test_scheduler import FakeModel

pytestmark = pytest.mark.asyncio
SAME = 0.9999  # cosine similarity that counts as the same vector


class RecordingEngine(LlamaEmbeddingEngine):
    """The real engine; remembers which threads tokenized its inputs."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tokenize_threads: set[str] = set()

    def embed_tokenize(self, text: str) -> list[int]:
        self.tokenize_threads.add(threading.current_thread().name)
        return super().embed_tokenize(text)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_bert_gguf(tmp_path_factory.mktemp("tiny-embed") / "tiny-embed.gguf")


def make_scheduler(gguf: Path, threads: int) -> tuple[Scheduler, list[RecordingEngine]]:
    settings = replace(Settings(home=Path("/tmp/unused"), keep_alive="-1"), threads=threads)
    engines: list[RecordingEngine] = []

    def factory(model, settings, ctx):
        engine = RecordingEngine(gguf, name=model.name, pooling=gguf_pooling(gguf), threads=settings.threads)
        engines.append(engine)
        return engine

    # every name is the one GGUF: "tiny-embed" and its aliases
    return Scheduler(settings, lambda name: FakeModel(name or "tiny-embed", path=gguf), factory), engines


def texts(request: int) -> tuple[str, ...]:
    return tuple(f"the quick brown fox {request} {' '.join(['dog'] * (i % 7))} {i}" for i in range(6))


async def test_inputs_are_tokenized_off_the_engine_thread_and_refusals_stay_400s(gguf: Path) -> None:
    scheduler, engines = make_scheduler(gguf, threads=1)
    await asyncio.gather(*(scheduler.embed(EmbedRequest("tiny-embed", texts(r))) for r in range(4)))
    threads = engines[0].tokenize_threads
    assert threads and not any(name.startswith("engine:") for name in threads), threads
    with pytest.raises(InvalidRequest):  # too long, told not to truncate: refused before the engine
        await scheduler.embed(EmbedRequest("tiny-embed", ("row " * 300,), truncate=False))
    await scheduler.close()


async def test_concurrent_requests_spread_over_the_contexts_and_equal_their_solo_vectors(gguf: Path) -> None:
    scheduler, engines = make_scheduler(gguf, threads=3)
    results = await asyncio.gather(
        *(scheduler.embed(EmbedRequest("tiny-embed", texts(r), normalize=False)) for r in range(16))
    )
    passes = engines[0]._embedder.passes_by_context()
    assert len(passes) == 3 and all(n > 0 for n in passes), passes
    solo = LlamaEmbeddingEngine(gguf, name="solo", pooling=gguf_pooling(gguf), threads=1)
    try:
        for r, result in enumerate(results):
            for text, vector in zip(texts(r), result.embeddings, strict=True):
                alone = solo.embed([tuple(solo.embed_tokenize(text))])[0]
                cosine = float(vector @ alone / (np.linalg.norm(vector) * np.linalg.norm(alone)))
                assert cosine >= SAME, (r, text, cosine)
    finally:
        solo.close()
        await scheduler.close()


async def test_an_alias_embeds_on_its_models_engine_and_the_result_names_the_alias(gguf: Path) -> None:
    scheduler, engines = make_scheduler(gguf, threads=1)
    first = await scheduler.embed(EmbedRequest("tiny-embed", ("a fox",)))
    second = await scheduler.embed(EmbedRequest("my-embed", ("a fox",)))
    assert (first.model, second.model) == ("tiny-embed", "my-embed")
    assert len(engines) == 1
    assert np.allclose(first.embeddings[0], second.embeddings[0])
    await scheduler.close()
