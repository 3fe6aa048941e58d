"""The load generator spreads a level's streams over client processes, each item sent exactly once."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from kinfer.bench.load import STREAMS_PER_CLIENT, client_count, send_all, shares


async def whose(client: httpx.AsyncClient, item: int) -> tuple[int, int]:
    await asyncio.sleep(0.01)
    return os.getpid(), item


async def refuses(client: httpx.AsyncClient, item: int) -> int:
    raise ValueError(f"item {item}")


def test_up_to_one_client_worth_of_streams_stays_in_the_calling_process():
    assert client_count(1) == client_count(STREAMS_PER_CLIENT) == 1
    results = asyncio.run(send_all(whose, range(40), concurrency=STREAMS_PER_CLIENT))
    assert {pid for pid, _ in results} == {os.getpid()}
    assert sorted(item for _, item in results) == list(range(40))


def test_shares_deal_items_round_robin_and_split_the_concurrency_exactly():
    parts = shares(list(range(10)), 7, 3)
    assert [items for items, _ in parts] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [concurrency for _, concurrency in parts] == [3, 2, 2]


def test_more_streams_go_out_from_several_processes_each_item_once():
    concurrency = 2 * STREAMS_PER_CLIENT + 1
    results = asyncio.run(send_all(whose, range(100), concurrency=concurrency))
    pids = {pid for pid, _ in results}
    assert len(pids) == client_count(concurrency) == 3
    assert os.getpid() not in pids
    assert sorted(item for _, item in results) == list(range(100))


def test_a_client_process_that_fails_fails_the_level():
    with pytest.raises(RuntimeError, match="ValueError: item"):
        asyncio.run(send_all(refuses, range(80), concurrency=2 * STREAMS_PER_CLIENT))
