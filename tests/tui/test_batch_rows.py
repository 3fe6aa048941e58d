"""What a live batch row says about its request (kinfer/tui/widgets/batch_table.py)."""

from __future__ import annotations

from dataclasses import replace

from kinfer.scheduler import RequestSnapshot
from kinfer.tui.widgets.batch_table import make_row

DECODING = RequestSnapshot(
    request_id="chatcmpl-1",
    dialect="openai",
    model="m",
    state="decoding",
    prompt_tokens=40,
    prompt_processed=40,
    generated=30,
    reused=0,
    tokens_per_second=12.0,
    age=2.0,
    tail="the first reply's words",
    finish=None,
)
STATE = 2  # the state column


def test_a_request_for_three_replies_says_so_while_it_runs():
    one, three = (
        make_row(DECODING, "a", fading=False),
        make_row(replace(DECODING, choices=3), "b", fading=False),
    )
    assert one.cells[STATE] == "decoding"
    assert three.cells[STATE] == "decoding x3"
    prefill = make_row(replace(DECODING, state="prefill", prompt_processed=10, choices=3), "c", fading=False)
    assert prefill.cells[STATE] == "prefill 10/40 x3"
    done = make_row(replace(DECODING, state="done", finish="stop", choices=3), "d", fading=True)
    assert done.cells[STATE] == "done (stop)"
