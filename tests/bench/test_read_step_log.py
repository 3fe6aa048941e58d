"""scripts/read_step_log.py: a stall run's step log summed up (the long prompt's chunk steps by thirds)."""

from __future__ import annotations

import gzip

from tests.bench.test_profile_scripts import _load


def _line(prefill: int, decoding: int, total: float, launch: float) -> str:
    return (
        f"1796397758.731 step {total}ms prefill={prefill} decoding={decoding} filling=1 updates=17 "
        f"build=1.0 launch={launch} wait=0.1 other=0.2 total={total}\n"
    )


def test_chunk_steps_beside_the_rows_are_summed_up_by_thirds(tmp_path):
    read = _load("read_step_log")
    lines = [_line(0, 3, 99.0, 90.0)]  # the rows' own prefill: fewer rows decoding, not counted
    lines += [_line(0, 16, 5.0, 3.0), _line(0, 16, 7.0, 4.0)]  # decode-only steps
    lines += [_line(256, 16, t, t - 2) for t in (10.0, 12.0, 20.0, 22.0, 30.0, 50.0)]
    path = tmp_path / "steps.log.gz"
    with gzip.open(path, "wt") as out:
        out.writelines(lines)
    cells = read.summary(read.read_steps(path), rows=16)
    assert cells["chunk_steps"] == 6
    assert [t["total"] for t in cells["thirds"]] == [11.0, 21.0, 40.0]
    assert [t["launch"] for t in cells["thirds"]] == [9.0, 19.0, 38.0]
    assert cells["slowest_ms"] == 50.0 and cells["decode_median_ms"] == 6.0
    assert "ms by third 11.0 / 21.0 / 40.0" in read.line("steps.log.gz", cells)


def test_decode_only_steps_are_summed_up_by_rows_with_the_time_outside_each_step(tmp_path):
    read = _load("read_step_log")
    at = 1796397758.0
    lines = []
    for prefill, decoding, total, gap in (
        (128, 1, 30.0, 0),
        (0, 1, 3.0, 4.0),
        (0, 1, 4.0, 5.0),
        (0, 1, 5.0, 7.0),
        (0, 2, 6.0, 6.5),
    ):
        at += gap / 1000
        lines.append(f"{at:.4f} " + _line(prefill, decoding, total, 1.0).split(" ", 1)[1])
    path = tmp_path / "steps.log"
    path.write_text("".join(lines))
    cells = read.decode_summary(read.read_steps(path))
    assert sorted(cells) == [1, 2]  # the prompt's step is not a decode step
    assert cells[1]["steps"] == 3 and cells[1]["total"] == 4.0 and cells[1]["launch"] == 1.0
    assert abs(cells[1]["outside"] - 1.0) < 0.01  # 4-3, 5-4, 7-5 ms between the ends, less the step
    assert abs(cells[2]["outside"] - 0.5) < 0.01


def test_the_slowest_steps_are_listed_with_the_engine_threads_cpu_time_in_their_launch(tmp_path):
    read = _load("read_step_log")
    lines = [_line(0, 3, 99.0, 90.0)]  # fewer rows decoding: not listed
    lines += [_line(0, 16, 5.0, 3.0), _line(256, 16, 30.0, 28.0)]
    lines.append(_line(0, 16, 22.0, 20.0).replace("\n", " cpu=4.0 cpu_launch=2.5 gc=0.0 reads=steady16\n"))
    lines.append(_line(0, 17, 9.0, 7.0))  # the long prompt's row decoding beside the 16
    path = tmp_path / "steps.log"
    path.write_text("".join(lines))
    listed = read.slowest(read.read_steps(path), rows=16, count=3)
    assert [number for number, _ in listed] == [3, 4, 5]
    assert read.slow_line(*listed[1]) == (
        "  step 4: 22.0 ms, prefill 0, decoding 16, launch 20.0, cpu_launch 2.5, gc 0.0, reads steady16"
    )
    assert read.slow_line(*listed[0]).endswith("launch 28.0")  # an older log: no CPU time


def test_a_step_that_built_graphs_is_set_against_the_next_kernel_by_kernel(tmp_path):
    read = _load("read_step_log")
    recorded = [
        "1796397758.731 step 9.0ms prefill=0 decoding=16\n",  # a step line of the log: not recorded
        "step 32.5 ms prefill 0 fed 769: instantiate 2 x 19.01 ms, update 0, launch 2 x 1.64 ms\n",
        "  graphs launched (kernels each): [4, 2]\n",
        "  new graph (4487 us) 4 kernels: gather, copy_s<float, int, 8> x2, rms_norm\n",
        "  graph 0: gather, copy_s<float, int, 8> x2, rms_norm\n",
        "  graph 1: matmul, add\n",
        "step 9.4 ms prefill 0 fed 770: instantiate 0, update 2 x 0.56 ms, launch 2 x 0.88 ms\n",
        "  graph 0: gather, rms_norm, matmul\n",
        "  graph 1: add\n",
    ]
    path = tmp_path / "steps.log"
    path.write_text("".join(recorded))
    steps = read.recorded_steps(path)
    assert [s["new"] for s in steps] == [2, 0]
    copy = "copy_s<float, int, 8>"  # a template's commas are not the runs'
    assert steps[0]["kernels"] == ["gather", copy, copy, "rms_norm", "matmul", "add"]
    assert read.graph_diffs(steps) == [
        "step 32.5 ms prefill 0 fed 769 (2 new graphs, 6 kernels) against step 9.4 ms prefill 0 fed 770 "
        "(4 kernels):",
        "  only here: copy_s<float, int, 8> x2",
    ]


def test_a_name_cut_at_the_recorders_cap_still_ends_at_its_comma(tmp_path):
    # logs written before kernel_times closed a cut name's brackets: "<" left open, no ">" to come
    read = _load("read_step_log")
    cut = "cublasLt::splitKreduce_kernel<32, 16, int, float, " + "x" * (read.NAME_CAP - 50)
    assert len(cut) == read.NAME_CAP
    assert read._spelled(f"{cut}, rms_norm<8> x2, add") == [cut, "rms_norm<8>", "rms_norm<8>", "add"]
