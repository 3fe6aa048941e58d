#!/usr/bin/env python
"""A bounded load test of `kinfer --headless` on loopback: many streaming clients, some leaving early.

    python scripts/load_test.py                         # 256 clients, --parallel 16, 24 tokens each
    python scripts/load_test.py --clients 32 --json out.json
    python scripts/load_test.py --clients 200 --disconnect 0.3 --hang-up-early 0.5 --rounds 3
                                                        # the hang-up benchmark: RSS flat over 3 rounds

It starts its own server (a subprocess on a free 127.0.0.1 port, bundled SmolLM2, a throwaway
KINFER_HOME), computes each prompt's greedy reply alone first, then opens every client at once
(OpenAI SSE and Ollama NDJSON, alternating). A share of the clients (--disconnect) close their
connection at a random point: after some of the reply's chunks, or (--hang-up-early) at a random
moment that may fall while the request is still queued or prefilling. --rounds repeats the burst on
the same server. It checks that

- every reply that finished is whole: the same text as that prompt's reply computed alone;
- no answer was a 5xx, except deliberate 503s (a full queue, with Retry-After);
- the server counted no request as an error that no client saw fail (a client that leaves is a
  cancellation);
- after each round every row is free, no request is active, and the server's RSS is back near its
  baseline (measured after the warm-up, before the first burst) and flat from round to round.

Everything is bounded: the counts are fixed, each client has a timeout, and --time-limit stops the
whole run. Exit status 0 when every check holds, 1 otherwise; --json writes the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil
from load_test_clients import DIALECTS, PROMPTS, ClientResult, reference, run_client

from kinfer.bench.servers import start_kinfer

SETTLE_S = 60.0
RSS_SLACK_BYTES = 64 * 1024 * 1024
RSS_SLACK_RATIO = 0.15
# from the first round's RSS to the last's: a leak per round shows, allocator noise does not
ROUND_RSS_SLACK_BYTES = 32 * 1024 * 1024
ROUND_RSS_SLACK_RATIO = 0.05
HANG_UP_WINDOW_S = (0.01, 2.0)  # when an early hang-up happens, after the request is sent


@dataclass
class Round:
    """The server after one burst."""

    number: int
    wall_s: float = 0.0
    rows_busy_after: float = -1.0
    requests_active_after: float = -1.0
    cancelled: float = 0.0
    errors: float = 0.0  # requests the server ended as "error"
    generated_tokens: float = 0.0
    rss_after_mb: float = 0.0


@dataclass
class Report:
    command: str
    machine: dict
    clients: int
    parallel: int
    max_tokens: int
    disconnect_share: float
    rounds: list[Round] = field(default_factory=list)
    wall_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    finished: int = 0
    left_early: int = 0
    hung_up_before_headers: int = 0
    planned_leavers: int = 0
    busy_503: int = 0
    mismatched: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)
    client_errors: list[str] = field(default_factory=list)
    max_rows_busy: float = 0.0
    max_queue_depth: float = 0.0
    rows_busy_after: float = -1.0
    requests_active_after: float = -1.0
    cancelled: float = 0.0
    errors: float = 0.0
    generated_tokens: float = 0.0
    tokens_per_second: float = 0.0
    first_token_p50_s: float | None = None
    first_token_p95_s: float | None = None
    total_p50_s: float | None = None
    total_p95_s: float | None = None
    rss_baseline_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_after_mb: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


async def watch(url: str, report: Report, stop: asyncio.Event, process: subprocess.Popen) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while not stop.is_set():
            try:
                text = (await client.get("/metrics")).text
                report.max_rows_busy = max(report.max_rows_busy, metric(text, "kinfer_rows_busy"))
                report.max_queue_depth = max(report.max_queue_depth, metric(text, "kinfer_queue_depth"))
                report.rss_peak_mb = max(report.rss_peak_mb, rss(process) / 2**20)
            except (httpx.HTTPError, psutil.Error):
                pass
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


async def burst(url: str, args: argparse.Namespace, report: Report, process: subprocess.Popen) -> None:
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=args.client_timeout, limits=limits) as client:
        wanted = sorted({(DIALECTS[i % 2], i % len(PROMPTS)) for i in range(args.clients)})
        solo = {key: await reference(client, key[0], key[1], args.max_tokens) for key in wanted}
    await asyncio.sleep(1.0)
    report.rss_baseline_mb = rss(process) / 2**20
    rng = random.Random(args.seed)
    everyone: list[ClientResult] = []
    for number in range(1, args.rounds + 1):
        before = httpx.get(url + "/metrics", timeout=10).text
        results = plan_clients(args, solo, rng, first_index=len(everyone))
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(url, report, stop, process))
        started = time.monotonic()
        async with httpx.AsyncClient(base_url=url, timeout=args.client_timeout, limits=limits) as client:
            await asyncio.gather(*(run_client(client, r, args.max_tokens) for r in results))
        wall = time.monotonic() - started
        stop.set()
        await watcher
        report.rounds.append(settle(url, process, before, Round(number=number, wall_s=round(wall, 2))))
        everyone += results
    judge(everyone, solo, report)
    add_up_rounds(report)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of `name` over the series whose labels include `labels` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if match:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(match.group(2))
    return total


def rss(process: subprocess.Popen) -> int:
    return psutil.Process(process.pid).memory_info().rss


def plan_clients(
    args: argparse.Namespace, solo: dict, rng: random.Random, first_index: int
) -> list[ClientResult]:
    """One round's clients. A leaver closes its connection before the reply's last chunk: right after
    the headers (0) or after some of the text, at a point drawn from the length of that reply alone;
    an early one (--hang-up-early) hangs up at a random moment, queued, prefilling or streaming."""
    results = []
    for i in range(args.clients):
        key = (DIALECTS[i % 2], i % len(PROMPTS))
        result = ClientResult(index=first_index + i, dialect=key[0], prompt=key[1], leave_after=None)
        if rng.random() < args.disconnect:
            if rng.random() < args.hang_up_early:
                result.leave_at_s = rng.uniform(*HANG_UP_WINDOW_S)
            else:
                result.leave_after = rng.randint(0, solo[key][1] - 1)
        results.append(result)
    return results


def judge(results: list[ClientResult], solo: dict, report: Report) -> None:
    report.planned_leavers = sum(1 for r in results if r.leave_after is not None or r.leave_at_s is not None)
    for r in results:
        report.statuses[str(r.status)] = report.statuses.get(str(r.status), 0) + 1
        where = f"client {r.index} ({r.dialect}, prompt {r.prompt})"
        if r.status == 0 and r.left:
            report.left_early += 1  # hung up before any answer came
            report.hung_up_before_headers += 1
        elif r.status == 503:
            report.busy_503 += 1
        elif r.status >= 500 or (r.status == 200 and r.error):
            report.server_errors.append(f"{where}: {r.status} {r.error}")
        elif r.status != 200:
            report.client_errors.append(f"{where}: {r.status} {r.error}")
        elif r.left:
            report.left_early += 1
        elif r.error:
            report.client_errors.append(f"{where}: {r.error}")
        else:
            report.finished += 1
            expected = solo[(r.dialect, r.prompt)][0]
            if r.text != expected or r.finish not in ("stop", "length"):
                report.mismatched.append(f"{where}: {r.text!r} ({r.finish}) != {expected!r}")
    firsts = sorted(r.first_token_s for r in results if r.first_token_s is not None and not r.left)
    totals = sorted(r.total_s for r in results if r.status == 200 and not r.left)
    if firsts:
        report.first_token_p50_s = round(statistics.median(firsts), 3)
        report.first_token_p95_s = round(firsts[int(0.95 * (len(firsts) - 1))], 3)
    if totals:
        report.total_p50_s = round(statistics.median(totals), 3)
        report.total_p95_s = round(totals[int(0.95 * (len(totals) - 1))], 3)


def settle(url: str, process: subprocess.Popen, before: str, result: Round) -> Round:
    """Wait (bounded) for the rows and requests to drain, then read the numbers after the burst."""
    deadline = time.monotonic() + SETTLE_S
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=10).text
        if metric(text, "kinfer_rows_busy") == 0 and metric(text, "kinfer_requests_active") == 0:
            break
        time.sleep(0.2)
    result.rows_busy_after = metric(text, "kinfer_rows_busy")
    result.requests_active_after = metric(text, "kinfer_requests_active")

    def rose(name: str, **labels: str) -> float:
        return metric(text, name, **labels) - metric(before, name, **labels)

    result.cancelled = rose("kinfer_requests_total", outcome="cancelled")
    result.errors = rose("kinfer_requests_total", outcome="error")
    result.generated_tokens = rose("kinfer_generated_tokens_total")
    time.sleep(2.0)  # let freed buffers go back before reading RSS
    result.rss_after_mb = round(rss(process) / 2**20, 1)
    return result


def add_up_rounds(report: Report) -> None:
    """The rounds added up; "after" numbers are the last round's."""
    last = report.rounds[-1]
    report.wall_s = round(sum(r.wall_s for r in report.rounds), 2)
    report.rows_busy_after = last.rows_busy_after
    report.requests_active_after = last.requests_active_after
    report.cancelled = sum(r.cancelled for r in report.rounds)
    report.errors = sum(r.errors for r in report.rounds)
    report.generated_tokens = sum(r.generated_tokens for r in report.rounds)
    report.tokens_per_second = round(report.generated_tokens / report.wall_s, 1) if report.wall_s else 0.0
    report.rss_after_mb = last.rss_after_mb


def check(report: Report) -> None:
    if report.server_errors:
        report.failures.append(f"{len(report.server_errors)} server errors (5xx other than 503)")
    if report.client_errors:
        report.failures.append(f"{len(report.client_errors)} unexpected answers")
    if report.mismatched:
        report.failures.append(f"{len(report.mismatched)} finished replies differ from the reply alone")
    if report.finished == 0:
        report.failures.append("no reply finished")
    for r in report.rounds:
        if r.rows_busy_after != 0 or r.requests_active_after != 0:
            report.failures.append(
                f"round {r.number} not drained: {r.rows_busy_after} rows busy, "
                f"{r.requests_active_after} active"
            )
    # a queue deadline is a 503 the client sees and an "error" the server counts; anything more is a
    # request that failed without anyone being told (or a client's hang-up counted as a failure)
    if report.errors > report.busy_503:
        report.failures.append(
            f"the server counted {report.errors:.0f} errors but clients saw {report.busy_503} (503s)"
        )
    # a client that leaves after its reply was fully generated is not a cancellation, so this is an
    # upper bound only; tests/hardening/test_disconnects.py checks cancellations exactly
    if report.cancelled > report.left_early:
        report.failures.append(f"{report.cancelled} cancellations but only {report.left_early} clients left")
    limit = report.rss_baseline_mb * (1 + RSS_SLACK_RATIO) + RSS_SLACK_BYTES / 2**20
    if report.rss_after_mb > limit:
        report.failures.append(
            f"RSS after the burst {report.rss_after_mb:.0f} MiB > {limit:.0f} MiB "
            f"(baseline {report.rss_baseline_mb:.0f} MiB)"
        )
    first, last = report.rounds[0], report.rounds[-1]
    flat = first.rss_after_mb * (1 + ROUND_RSS_SLACK_RATIO) + ROUND_RSS_SLACK_BYTES / 2**20
    if last.rss_after_mb > flat:
        report.failures.append(
            f"RSS grew from round to round: {first.rss_after_mb:.0f} MiB after round 1, "
            f"{last.rss_after_mb:.0f} MiB after round {last.number} (> {flat:.0f} MiB)"
        )


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=256, help="concurrent streaming clients")
    parser.add_argument("--parallel", type=int, default=16, help="rows the server decodes together")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per reply")
    parser.add_argument("--ctx", type=int, default=512, help="context per row")
    parser.add_argument("--disconnect", type=float, default=0.1, help="share of clients that leave early")
    parser.add_argument(
        "--hang-up-early",
        type=float,
        default=0.0,
        help="share of the leavers that hang up at a random moment (queued, prefilling or streaming)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="bursts, one after another, on the same server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--client-timeout", type=float, default=600.0, help="seconds per client request")
    parser.add_argument("--time-limit", type=float, default=1200.0, help="seconds for the whole run")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(
        command=" ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        machine=machine(),
        clients=args.clients,
        parallel=args.parallel,
        max_tokens=args.max_tokens,
        disconnect_share=args.disconnect,
    )
    with tempfile.TemporaryDirectory(prefix="kinfer-load-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        # a throwaway home that borrows no Ollama models: the store holds the bundled model only
        env = {"KINFER_HOME": str(home), "OLLAMA_MODELS": str(home / "no-ollama"), "HF_HUB_OFFLINE": "1"}
        server = start_kinfer(parallel=args.parallel, ctx=args.ctx, log_dir=Path(tmp), env=env)
        process = server.process
        assert process is not None
        try:
            asyncio.run(asyncio.wait_for(burst(server.target.url, args, report, process), args.time_limit))
        except TimeoutError:
            report.failures.append(f"the run passed its time limit of {args.time_limit:.0f}s")
        finally:
            server.stop()
            server_log = server.log_path.read_text(errors="replace")
        if "Traceback" in server_log and report.server_errors:
            report.failures.append("the server logged tracebacks")
    check(report)
    if args.json:
        args.json.write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    if not args.quiet:
        print(json.dumps({k: v for k, v in asdict(report).items() if k not in ("mismatched",)}, indent=2))
    print("PASS" if report.ok else "FAIL: " + "; ".join(report.failures))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
