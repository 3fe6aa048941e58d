"""Benchmark constrained decoding: rows under a JSON Schema vs free rows, and the grammar mask's CPU cost.

    .venv/bin/python scripts/bench_constrained.py                      # llama.cpp engine, 16 rows
    .venv/bin/python scripts/bench_constrained.py --engine mlx         # MLX engine (SmolLM2 in float32)
    .venv/bin/python scripts/bench_constrained.py --llama-server /path/to/llama-server
    .venv/bin/python scripts/bench_constrained.py --rows 2 --tokens 16 # a smoke run

1. The engine driven directly: `--rows` replies at once, all under the schema, then all free (the same
   prompts). Aggregate tok/s over the decode phase; the mask's CPU time per constrained step (computed
   by llguidance while the forward pass runs, so part of it is hidden) and per masked token.
2. With `--llama-server PATH` (or `--http` for kinfer alone): the same schema over HTTP, `--rows`
   concurrent requests, kinfer (response_format) vs llama.cpp's own server (its `json_schema` body
   field), same GGUF weights. `--rounds N` alternates schema and free runs N times.

Constrained replies end when their JSON is complete; free replies run to `--tokens` (end of turn
ignored). The schema's array of records keeps constrained replies long enough to measure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from kinfer.chat.template import render_prompt
from kinfer.constrain.build import build_constraint
from kinfer.engines.base import Engine, GenerationJob
from kinfer.protocol import ChatRequest, Message, ResponseFormat, Sampling
from kinfer.store.bundled import bundled_gguf

SECTION = "## Constrained decoding (this machine)"
GREEDY = Sampling(temperature=0.0)
CITIES = ["Paris", "Lyon", "Oslo", "Lima", "Kyoto", "Quito", "Accra", "Hanoi"]
SCHEMA = {
    "type": "object",
    "properties": {
        "trip": {"type": "string", "maxLength": 40},
        "stops": {
            "type": "array",
            "minItems": 4,
            "maxItems": 8,
            "items": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "nights": {"type": "integer", "minimum": 1, "maximum": 14},
                    "transport": {"enum": ["train", "plane", "bus", "boat"]},
                    "budget": {"type": "integer", "minimum": 0, "maximum": 5000},
                },
                "required": ["city", "nights", "transport", "budget"],
            },
        },
    },
    "required": ["trip", "stops"],
}


def question(i: int) -> str:
    return f"Plan a trip of several stops starting in {CITIES[i % len(CITIES)]}. Answer as JSON."


@dataclass(frozen=True)
class Run:
    label: str
    rows: int
    generated: int
    decode_s: float
    mask_s: float = 0.0
    masked_steps: int = 0
    masks: int = 0
    valid: int = 0

    @property
    def tok_s(self) -> float:
        return self.generated / self.decode_s if self.decode_s else 0.0


def make_engine(args: argparse.Namespace) -> Engine:
    if args.engine == "mlx":
        from kinfer.engines.mlx.engine import MlxEngine
        from kinfer.testing.smollm_f32 import build_smollm_f32

        directory = args.model or build_smollm_f32(bundled_gguf()).hf_dir
        return MlxEngine(directory, name="bench", rows=args.rows, ctx=args.ctx, prefix_cache=False)
    from kinfer.engines.llama.engine import LlamaEngine

    return LlamaEngine(
        args.model or bundled_gguf(),
        name="bench",
        rows=args.rows,
        ctx=args.ctx,
        threads=args.threads,
        prefix_cache=False,
    )


def jobs(engine: Engine, rows: int, tokens: int, constrained: bool) -> list[GenerationJob]:
    out = []
    for i in range(rows):
        request = ChatRequest(
            model="bench",
            messages=(Message("user", question(i)),),
            response_format=ResponseFormat("json_schema", SCHEMA) if constrained else None,
        )
        info = engine.info
        rendered = render_prompt(
            info.chat_template, request, bos_token=info.bos_token, eos_token=info.eos_token
        )
        out.append(
            GenerationJob(
                f"{'c' if constrained else 'f'}{i}",
                tuple(engine.tokenize(rendered.text)),
                GREEDY,
                tokens,
                ignore_eos=not constrained,
                constraint=build_constraint(request, rendered),
            )
        )
    return out


def run_engine(engine: Engine, batch: list[GenerationJob], label: str) -> Run:
    masks = getattr(engine, "_masks", None) or getattr(getattr(engine, "_logits", None), "masks", None)
    mask_before = (masks.seconds, masks.filled) if masks is not None else (0.0, 0)
    texts = {job.job_id: "" for job in batch}
    for job in batch:
        engine.submit(job)
    prompt_total = sum(len(job.prompt) for job in batch)
    generated = steps = 0
    while engine.has_work and engine.stats().prompt_tokens_total < prompt_total:
        for update in engine.step():
            generated += update.new_tokens
            texts[update.job_id] += update.text
    started, first = time.perf_counter(), generated
    while engine.has_work:
        for update in engine.step():
            generated += update.new_tokens
            texts[update.job_id] += update.text
        steps += 1
    decode_s = time.perf_counter() - started
    masks = getattr(engine, "_masks", None) or getattr(getattr(engine, "_logits", None), "masks", None)
    mask_s, masked = (masks.seconds - mask_before[0], masks.filled - mask_before[1]) if masks else (0.0, 0)
    valid = sum(1 for text in texts.values() if _valid(text))
    return Run(label, len(batch), generated - first, decode_s, mask_s, steps if masked else 0, masked, valid)


def _valid(text: str) -> bool:
    try:
        import jsonschema

        jsonschema.validate(json.loads(text), SCHEMA)
    except Exception:
        return False
    return True


# ---- over HTTP: kinfer vs llama-server ---------------------------------------------------------


def http_run(url: str, label: str, rows: int, tokens: int, body_for) -> Run:
    def one(i: int) -> tuple[int, str]:
        reply = httpx.post(url + "/v1/chat/completions", json=body_for(i), timeout=3600).json()
        if "usage" not in reply:  # an error: say which server refused what, count it as nothing made
            print(f"{label}: {str(reply)[:300]}", file=sys.stderr)
            return 0, ""
        return reply["usage"]["completion_tokens"], reply["choices"][0]["message"]["content"] or ""

    # one short request first, out of the timing: a server's first constrained request builds its
    # grammar tables over the whole vocabulary (seconds for 150k tokens), once per model load
    httpx.post(url + "/v1/chat/completions", json={**body_for(0), "max_tokens": 4}, timeout=3600)
    started = time.perf_counter()
    with ThreadPoolExecutor(rows) as pool:
        results = list(pool.map(one, range(rows)))
    wall = time.perf_counter() - started
    return Run(label, rows, sum(n for n, _ in results), wall, valid=sum(_valid(text) for _, text in results))


@contextlib.contextmanager
def _nothing():
    yield None


def compare_servers(args: argparse.Namespace, gguf: Path) -> list[Run]:
    from kinfer.bench.servers import free_port, start_kinfer, wait_ready

    model = {"kinfer": gguf.stem, "llama-server": "bench"}  # kinfer serves the GGUF under its file name

    def body(i: int, constrained: bool, server: str) -> dict:
        fields = {
            "model": model[server],
            "messages": [{"role": "user", "content": question(i)}],
            "temperature": 0,
            "max_tokens": args.tokens,
        }
        if not constrained:
            return {**fields, "ignore_eos": True}
        if server == "llama-server":
            return {**fields, "json_schema": SCHEMA}
        return {
            **fields,
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}},
        }

    runs = []
    logs = Path(tempfile.mkdtemp(prefix="kinfer-bench-constrained-"))
    with (
        start_kinfer(weights=gguf, parallel=args.rows, ctx=args.ctx, threads=args.threads, log_dir=logs)
        if not args.peer_only
        else _nothing() as kinfer
    ):
        for constrained in (True, False) * args.rounds if kinfer else ():
            label = f"kinfer, {'schema' if constrained else 'free'}"
            runs.append(
                http_run(
                    kinfer.target.url, label, args.rows, args.tokens,
                    lambda i, c=constrained: body(i, c, "kinfer"),
                )
            )  # fmt: skip
    if args.llama_server is None:
        return runs
    port = free_port()
    command = [
        str(args.llama_server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(args.rows), "-c", str(args.ctx * args.rows), "-t", str(args.threads or os.cpu_count()),
        "-ngl", "999",  # every layer on the GPU where there is one (a CPU build ignores it), as kinfer does
    ]  # fmt: skip
    with open(logs / "llama-server.log", "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        from kinfer.bench.clients import Target
        from kinfer.bench.servers import LaunchedServer

        server = LaunchedServer(
            "llama-cpp-server",
            Target("llama-server", f"http://127.0.0.1:{port}", "openai", None, {}, process.pid),
            process,
            logs / "llama-server.log",
            tuple(command),
        )
        wait_ready(server, "/health")
        for constrained in (True, False):
            label = f"llama-server, {'schema' if constrained else 'free'}"
            url = server.target.url
            runs.append(
                http_run(
                    url, label, args.rows, args.tokens, lambda i, c=constrained: body(i, c, "llama-server")
                )
            )
    finally:
        process.terminate()
        process.wait(30)
    return runs


# ---- report -----------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, load avg {load:.1f}"


def render(engine_runs: list[Run], http_runs: list[Run], args: argparse.Namespace) -> str:
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python scripts/bench_constrained.py {' '.join(args.argv)}`".rstrip() + "  ",
        f"Machine: {machine()}  ",
        f"Engine: {args.engine}, {args.rows} rows, greedy; free rows run {args.tokens} tokens (end of turn "
        "ignored), constrained rows until their JSON is complete.",
        "",
        "| rows | kind | generated | decode s | aggregate tok/s | valid | mask ms/step | mask us/token |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in engine_runs:
        per_step = f"{run.mask_s / run.masked_steps * 1e3:.2f}" if run.masked_steps else "-"
        per_mask = f"{run.mask_s / run.masks * 1e6:.0f}" if run.masks else "-"
        valid = f"{run.valid}/{run.rows}" if run.label == "schema" else "-"
        lines.append(
            f"| {run.rows} | {run.label} | {run.generated} | {run.decode_s:.2f} | {run.tok_s:.1f} "
            f"| {valid} | {per_step} | {per_mask} |"
        )
    if http_runs:
        lines += [
            "",
            f"Over HTTP, {args.rows} concurrent requests, same GGUF "
            "(wall time from the first request to the last reply):",
            "",
            "| server | kind | generated | wall s | aggregate tok/s | valid |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for run in http_runs:
            server, kind = run.label.split(", ")
            valid = f"{run.valid}/{run.rows}" if kind == "schema" else "-"
            lines.append(
                f"| {server} | {kind} | {run.generated} | {run.decode_s:.2f} | {run.tok_s:.1f} | {valid} |"
            )
    return "\n".join(lines) + "\n"


def write_docs(section: str) -> Path:
    """Replace this script's section of docs/benchmarks.md (other sections are left alone)."""
    path = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text.rstrip("\n") + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("llama", "mlx"), default="llama")
    parser.add_argument("--model", type=Path, default=None, help="GGUF (llama) or model directory (mlx)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument(
        "--tokens", type=int, default=256, help="tokens per free row; cap for constrained rows"
    )
    parser.add_argument("--ctx", type=int, default=1024, help="tokens per row")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--llama-server", type=Path, default=None, help="llama.cpp's llama-server binary")
    parser.add_argument("--peer-only", action="store_true", help="over HTTP, measure llama-server only")
    parser.add_argument("--http", action="store_true", help="also measure kinfer over HTTP (no peer needed)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="schema and free runs, alternating, this many times"
    )
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args(argv)
    args.argv = argv
    engine = make_engine(args)
    try:
        # the grammar vocabulary is built with the first constrained job: keep it out of the timing
        run_engine(engine, jobs(engine, 1, 4, constrained=True), "warm-up")
        runs = []
        for _ in range(args.rounds):  # alternating, so a noisy machine slows both kinds alike
            runs.append(run_engine(engine, jobs(engine, args.rows, args.tokens, constrained=True), "schema"))
            runs.append(run_engine(engine, jobs(engine, args.rows, args.tokens, constrained=False), "free"))
    finally:
        engine.close()
    http = []
    if args.llama_server is not None or args.http:
        if args.engine != "llama":
            parser.error("over HTTP the benchmark serves a GGUF: use it with --engine llama")
        http = compare_servers(args, args.model or bundled_gguf())
    section = render(runs, http, args)
    print(section)
    if args.write_docs:
        print(f"wrote {write_docs(section)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
