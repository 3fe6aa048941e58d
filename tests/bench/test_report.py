"""Tables, bars and the JSON document a benchmark writes."""

from __future__ import annotations

import json

from kinfer.bench.clients import Target
from kinfer.bench.memory import engine_memory
from kinfer.bench.prefix import PrefixConfig, PrefixRun, PrefixStep
from kinfer.bench.prompts import PromptSizer
from kinfer.bench.report import (
    bar,
    comparison_table,
    machine_line,
    markdown_table,
    plot,
    prefix_table,
    report_json,
    sweep_table,
    text_table,
)
from kinfer.bench.stats import MemoryPeak, RequestResult, summarize_level
from kinfer.bench.sweep import SweepConfig, SweepRun

MACHINE = {
    "cpu": "Test CPU",
    "cores": 2,
    "memory_gib": 8.0,
    "gpus": [],
    "os": "Linux 6",
    "python": "3.11.7",
    "kinfer": "0.1.0",
}


def result(tokens: int, ttft: float, span: float, *, prompt: int = 64, cached: int = 0) -> RequestResult:
    return RequestResult(
        started=0.0,
        finished=ttft + span,
        first_token=ttft,
        last_token=ttft + span,
        prompt_tokens=prompt,
        completion_tokens=tokens,
        cached_tokens=cached,
    )


def sweep(label: str, rates: dict[int, float]) -> SweepRun:
    levels = []
    for c, seconds in rates.items():
        results = [result(9, 0.1, seconds) for _ in range(c)]
        memory = MemoryPeak(rss_bytes=300 * 2**20, engine_bytes={"kv": 50 * 2**20, "model": 70 * 2**20})
        levels.append(summarize_level(c, results, max_tokens=9, memory=memory))
    target = Target(label, "http://127.0.0.1:1", model="smollm2:135m")
    return SweepRun(
        target, SweepConfig(concurrency=tuple(rates), max_tokens=9), PromptSizer(), tuple(levels), "T"
    )


def test_text_tables_pad_columns_and_right_align_numbers():
    table = text_table(["name", "tok/s"], [["a", "1.0"], ["longer", "123.4"]])
    assert table.splitlines() == ["name    tok/s", "a         1.0", "longer  123.4"]


def test_markdown_tables_right_align_every_column_but_the_first():
    table = markdown_table(["c", "tok/s"], [["1", "2.0"]])
    assert table.splitlines() == ["| c | tok/s |", "|---|---:|", "| 1 | 2.0 |"]


def test_a_sweep_table_has_a_row_per_level_with_its_numbers():
    run = sweep("kinfer", {1: 0.8, 4: 0.8})
    lines = sweep_table(run).splitlines()
    assert lines[0].startswith("kinfer (openai at http://127.0.0.1:1, model smollm2:135m)")
    assert "agg tok/s" in lines[1] and "TTFT p50" in lines[1]
    one = lines[2].split()
    # 9 tokens: first at 0.1 s, 8 more in 0.8 s -> 10 tok/s per stream; 9 tokens in 0.9 s aggregate
    assert one[:6] == ["1", "1", "0", "10.0", "10.0", "100"]
    assert one[-2:] == ["300", "120"]  # RSS and engine memory, MiB
    assert lines[3].split()[:4] == ["4", "4", "0", "40.0"]  # 36 tokens in 0.9 s


def test_the_comparison_puts_targets_side_by_side_per_level():
    table = comparison_table([sweep("kinfer", {1: 0.8, 4: 0.8}), sweep("peer", {1: 0.8})])
    lines = table.splitlines()
    assert lines[0].split() == ["concurrency", "kinfer", "peer"]
    assert lines[1].split() == ["1", "10.0", "10.0"]
    assert lines[2].split() == ["4", "40.0", "-"]


def test_bars_scale_to_the_largest_value_in_eighths():
    assert bar(10, 10, width=4) == "████"
    assert bar(5, 10, width=4) == "██"
    assert bar(1, 16, width=4) == "▎"  # 2 eighths
    assert bar(0, 10) == "" and bar(5, 0) == ""


def test_the_plot_draws_one_bar_per_target_and_level():
    text = plot([sweep("kinfer", {1: 0.8, 4: 0.8}), sweep("peer", {1: 0.8})])
    lines = text.splitlines()
    assert lines[0] == "aggregate tok/s"
    assert lines[1].startswith("c=1") and "kinfer" in lines[1] and lines[1].endswith("10.0")
    assert "peer" in lines[2] and lines[3].startswith("c=4") and lines[3].endswith("40.0")
    assert lines[3].count("█") > lines[1].count("█")


def prefix_run() -> PrefixRun:
    steps = (
        PrefixStep("turn 1 (cold)", result(8, 4.0, 1.0, prompt=9000)),
        PrefixStep("turn 2", result(8, 0.5, 1.0, prompt=9100, cached=9050)),
        PrefixStep("new conversation", result(8, 0.4, 1.0, prompt=9020, cached=9000)),
    )
    return PrefixRun(Target("kinfer", "http://127.0.0.1:1"), PrefixConfig(), steps, "T")


def test_the_prefix_table_compares_each_step_with_the_cold_one():
    lines = prefix_table(prefix_run()).splitlines()
    assert "system prompt ~9000 tokens" in lines[0]
    assert lines[2].split()[:6] == ["turn", "1", "(cold)", "9000", "0", "4.00"]
    assert "8.0x faster" in lines[3] and "9050" in lines[3]
    assert "10.0x faster" in lines[4]


def test_the_json_document_holds_machine_settings_and_every_level():
    document = report_json([sweep("kinfer", {1: 0.8}), prefix_run()], command="kinfer bench", machine=MACHINE)
    data = json.loads(json.dumps(document))  # it must survive a round trip
    assert data["kind"] == "kinfer-bench" and data["version"] == 1
    assert data["command"] == "kinfer bench" and data["machine"]["cpu"] == "Test CPU"
    sweep_run, prefix = data["runs"]
    assert sweep_run["scenario"] == "sweep"
    assert sweep_run["target"]["label"] == "kinfer" and sweep_run["config"]["max_tokens"] == 9
    level = sweep_run["levels"][0]
    assert level["concurrency"] == 1 and level["aggregate_tps"] == 10.0
    assert level["memory"]["engine_total_bytes"] == 120 * 2**20
    assert {"ttft_p50", "ttft_p95", "stream_tps_p50", "prompt_tps_p50", "errors"} <= set(level)
    assert prefix["scenario"] == "prefix"
    assert [s["cached_tokens"] for s in prefix["steps"]] == [0, 9050, 9000]
    assert prefix["steps"][0]["ttft_s"] == 4.0


def test_the_machine_line_names_cpu_cores_and_versions():
    assert machine_line(MACHINE) == "Test CPU, 2 cores, 8.0 GiB; Linux 6; Python 3.11.7; kinfer 0.1.0"
    assert "H200" in machine_line({**MACHINE, "gpus": ["NVIDIA H200"]})


def test_engine_memory_is_read_from_prometheus_text_and_summed_over_models():
    text = (
        "# HELP kinfer_engine_memory_bytes Engine memory by kind\n"
        "# TYPE kinfer_engine_memory_bytes gauge\n"
        'kinfer_engine_memory_bytes{kind="kv",model="a"} 1000.0\n'
        'kinfer_engine_memory_bytes{kind="kv",model="b"} 500.0\n'
        'kinfer_engine_memory_bytes{kind="model",model="a"} 2e+06\n'
        "# TYPE kinfer_rows_busy gauge\n"
        'kinfer_rows_busy{model="a"} 2.0\n'
    )
    assert engine_memory(text) == {"kv": 1500, "model": 2_000_000}


def test_a_prefix_step_without_usage_shows_no_counts():
    blind = RequestResult(started=0.0, finished=2.0, first_token=1.0, last_token=2.0, usage_source="chunks")
    run = PrefixRun(
        Target("peer", "http://127.0.0.1:1"), PrefixConfig(), (PrefixStep("turn 1 (cold)", blind),), "T"
    )
    row = prefix_table(run).splitlines()[2].split()
    assert row[:5] == ["turn", "1", "(cold)", "-", "-"]  # prompt and reused tokens unknown, not 0
