"""Record the dashboard's samples while the real bundled SmolLM2 answers a burst of requests.

    .venv/bin/python -m tests.tui.record_burst tests/tui/recordings/burst.json

Six streaming requests (two per dialect: Ollama, OpenAI, Anthropic) arrive a moment apart; a
`Recorder` around a `LiveSource` samples the scheduler 4 times a second on the server's own loop, as
the dashboard does. The snapshot tests replay the file, so the screen they check is one a real run
produced. Re-record only when the sample format changes (and review the snapshots it moves).
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from kinfer.tui.live import LiveSource
from kinfer.tui.recording import Recorder, save_recording
from tests.live_server import running_server, server_settings

PROMPTS = (
    ("/api/chat", {"messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "List five kinds of birds."}]}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Why is the sky blue?"}]}),
    ("/api/chat", {"messages": [{"role": "user", "content": "Write a haiku about rain."}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Explain what a CPU does."}]}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Name three rivers in Europe."}]}),
)
MAX_TOKENS = 64
INTERVAL_S = 0.25
WINDOW = 44  # samples kept: about 11 s of history for the sparklines


def window(samples: list) -> list:
    """The samples up to the moment a third request finishes (rows still busy, two fading)."""
    finished = 0
    for index, sample in enumerate(samples):
        finished += len(sample.finished)
        if finished >= 3:
            return samples[max(0, index + 1 - WINDOW) : index + 1]
    return samples[-WINDOW:]


def body(path: str, extra: dict) -> dict:
    out = {"model": "smollm2:135m", "stream": True, **extra}
    if path == "/api/chat":
        out["options"] = {"num_predict": MAX_TOKENS, "temperature": 0}
    else:
        out.update(max_tokens=MAX_TOKENS, temperature=0)
    return out


def main(target: Path) -> None:
    with tempfile.TemporaryDirectory() as home:
        settings = server_settings(Path(home), parallel=4, ctx=2048)
        with running_server(settings) as server:
            source = Recorder(LiveSource(server.runtime.scheduler, server.runtime.requests))

            async def sample():
                return source()

            async def open_source():
                source.open()

            server.call(open_source())
            httpx.post(server.url + "/api/generate", json={"model": "smollm2:135m"}, timeout=120)  # load
            threads = []
            for index, (path, extra) in enumerate(PROMPTS):

                def send(path=path, extra=extra) -> None:
                    with httpx.stream("POST", server.url + path, json=body(path, extra), timeout=120) as r:
                        for _ in r.iter_lines():
                            pass

                thread = threading.Thread(target=send, name=f"client-{index}")
                threads.append(thread)
            started = time.monotonic()
            for thread in threads:
                thread.start()
                server.call(sample())
                time.sleep(INTERVAL_S)
            while any(t.is_alive() for t in threads) or time.monotonic() - started < 2:
                server.call(sample())
                time.sleep(INTERVAL_S)
            for _ in range(8):  # the finished rows' fade-out
                server.call(sample())
                time.sleep(INTERVAL_S)
            source.close()
    kept = window(source.samples)
    save_recording(kept, target)
    print(f"{len(kept)} of {len(source.samples)} samples -> {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
