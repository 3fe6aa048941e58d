"""Where time to first token goes under a burst: N streaming chats at once against `kinfer --headless`,
per request the wall-clock times of sending, response headers, first and last text.

    python3 scripts/trace_ttft.py 256 256 MODEL_DIR out.json
    KINFER_STEP_HOOK=steps.log KINFER_STEP_SLOW=0 PYTHONPATH=scripts/step_log:$PWD \
        python3 scripts/trace_ttft.py 256 256 MODEL_DIR out.json      # with the engine's step log
    PYSPY=/path/to/py-spy PYSPY_S=8 python3 scripts/trace_ttft.py ...   # and py-spy on the server

Arguments: streams, tokens per reply, model (a GGUF or model directory), the JSON to write (times per
request), then optional extra server arguments in one string. Prompts are ~128 tokens (WORDS words,
default 22, of the bench's prompt text), each different; a warm-up round of 8-token replies first.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from kinfer.bench.load import send_all
from kinfer.bench.prompts import prompt_text
from kinfer.bench.servers import start_kinfer
from kinfer.bench.stats import percentile


async def one(client: httpx.AsyncClient, seed: int, *, url: str, extra: dict, tokens: int) -> dict:
    """One streamed chat's times (a `load.send_all` job: client and item first)."""
    words = int(os.environ.get("WORDS", "22"))
    body = {
        "messages": [{"role": "user", "content": prompt_text(words, seed)}],
        "stream": True,
        "max_tokens": tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
        **extra,
    }
    record: dict = {"sent": time.time(), "chunks": 0}
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        record["headers"] = time.time()
        if response.status_code != 200:
            await response.aread()
            record["error"] = f"HTTP {response.status_code}: {response.text[:200]}"
            return record
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            for choice in data.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    record["chunks"] += 1
                    record.setdefault("first", time.time())
                    record["last"] = time.time()
            if data.get("usage"):
                record["tokens"] = data["usage"]["completion_tokens"]
    return record


def summary(values: list[float]) -> str:
    values = sorted(values)
    return " ".join(f"p{p}={percentile(values, p):.2f}" for p in (5, 50, 95)) + f" max={values[-1]:.2f}"


async def trace(url: str, extra: dict, pid: int | None, streams: int, tokens: int, out: Path) -> None:
    # from several client processes past load.STREAMS_PER_CLIENT streams: one would be the bottleneck
    warm = functools.partial(one, url=url, extra=extra, tokens=8)
    await send_all(warm, range(streams), concurrency=streams)
    spy = None
    if os.environ.get("PYSPY") and pid:
        command = [os.environ["PYSPY"], "record", "-p", str(pid), "-o", str(out.with_suffix(".pyspy.txt"))]
        command += ["-f", "raw", "-r", "100", "--threads", "-d", os.environ.get("PYSPY_S", "6")]
        # PYSPY_NATIVE=1: C/C++ frames too (inside MLX); py-spy must pause the process for those
        command += ["--native"] if os.environ.get("PYSPY_NATIVE") else ["--nonblocking"]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job = functools.partial(one, url=url, extra=extra, tokens=tokens)
    records = await send_all(job, range(1000, 1000 + streams), concurrency=streams)
    if spy:
        spy.wait()
    began = min(r["sent"] for r in records)  # the client processes start before the first request
    ended = max(r.get("last", r["headers"]) for r in records)
    done = [r for r in records if "first" in r]
    generated = sum(r.get("tokens", 0) for r in records)
    print(
        f"streams={streams} errors={len(records) - len(done)} tokens={generated} wall={ended - began:.2f}s "
        f"tok/s={generated / (ended - began):.0f}"
    )
    print(" sent     ", summary([r["sent"] - began for r in records]))
    print(" headers  ", summary([r["headers"] - began for r in records]))
    print(" TTFT     ", summary([r["first"] - r["sent"] for r in done]))
    print(" last     ", summary([r["last"] - began for r in done]))
    out.write_text(json.dumps({"began": began, "ended": ended, "requests": records}))


def main() -> None:
    streams, tokens, model, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    extra_args = sys.argv[5].split() if len(sys.argv) > 5 else []
    server = start_kinfer(
        weights=model, parallel=streams, ctx=512 + tokens, log_dir=out.parent / "logs", extra_args=extra_args
    )
    try:
        asyncio.run(
            trace(server.target.url, dict(server.target.extra_body), server.pid, streams, tokens, out)
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
