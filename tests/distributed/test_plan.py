"""The pieces of a distributed server that need no second rank: the plan's round trip through the
broadcast (on a group of one, where all_sum is the identity), the shared prefill budget, the hostfile,
the launch commands and the heartbeat."""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pytest

from kinfer.distributed.health import ClusterHealth, HealthServer
from kinfer.distributed.hostfile import launch_commands, read_hostfile
from kinfer.distributed.plan import Cancel, Load, Plan, Submit, broadcast
from kinfer.distributed.replica import PlannedBudget
from kinfer.engines.prefill_budget import PrefillBudget
from kinfer.errors import InvalidRequest
from tests.engines.driver import job

mx = pytest.importorskip("mlx.core")


def test_a_plan_comes_back_whole_from_the_broadcast():
    group = mx.distributed.init()  # no launcher: a group of one
    plan = Plan(
        "step",
        budget=(24, 0.0125, None),
        calls=(Submit(job("a", [1, 2, 3], max_tokens=9)), Cancel("b")),
    )
    assert broadcast(plan, group) == plan
    assert broadcast(Plan("close"), group) == Plan("close")  # no body: the header alone
    load = Plan("load", load=Load("tiny", {"rows": 4, "ctx": 512}, size=None))
    assert broadcast(load, group) == load


def test_a_follower_s_budget_answers_as_rank_0_s_and_only_rank_0_learns():
    leader = PlannedBudget(PrefillBudget(step_ms=0, max_tokens=128))
    follower = PlannedBudget(PrefillBudget(step_ms=0, max_tokens=128))
    leader.prefilled(64, 0.5)
    leader.decoded(0.2)
    leader.took(40)
    follower.follow(leader.state())
    assert follower.state() == leader.state() == (40, 0.5 / 64, 0.2)
    for decoding, burst in ((True, 1.0), (True, 3.5), (False, 1.0)):
        assert follower.room(128, decoding, burst=burst) == leader.room(128, decoding, burst=burst)
    follower.prefilled(64, 5.0)  # a follower's own clock is never asked
    follower.took(4)
    assert follower.state() == leader.state()


def test_the_hostfile_gives_the_backend_and_the_commands(tmp_path: Path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        json.dumps({"hosts": [{"ssh": "m1", "ips": ["10.0.0.1"]}, {"ssh": "m2", "ips": ["10.0.0.2"]}]})
    )
    hostfile = read_hostfile(hosts)
    assert (hostfile.backend, hostfile.leader_ip) == ("ring", "10.0.0.1")
    text = launch_commands(hostfile, ["--model", "big"])
    assert (
        f"mlx.launch --hostfile {hosts} --backend ring -- kinfer --headless --distributed {hosts} --model big"
        in text
    )
    assert '[["10.0.0.1:32323"], ["10.0.0.2:32324"]]' in text
    assert "[m2] MLX_RANK=1 MLX_HOSTFILE=ring.json kinfer" in text


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps([{"ssh": "only-one", "ips": ["10.0.0.1"]}]),
        json.dumps({"backend": "carrier-pigeon", "hosts": [{"ssh": "a", "ips": ["1"]}] * 2}),
        json.dumps([{"ssh": "a"}, {"ssh": "b"}]),  # the ring needs addresses
    ],
)
def test_a_bad_hostfile_is_refused_with_a_reason(tmp_path: Path, content: str):
    path = tmp_path / "hosts.json"
    path.write_text(content)
    with pytest.raises(InvalidRequest):
        read_hostfile(path)


def test_a_follower_that_disconnects_is_reported_lost():
    health = ClusterHealth(2, seen={0})
    server = HealthServer(health, "127.0.0.1", 0)
    try:
        follower = socket.create_connection(("127.0.0.1", server.port))
        follower.sendall(struct.pack("!i", 1) + b".")
        deadline = time.monotonic() + 5
        while 1 not in health.seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert health.ok and health.as_dict()["connected"] == [0, 1]
        follower.close()
        while health.ok and time.monotonic() < deadline:
            time.sleep(0.02)
        assert health.as_dict() == {
            "ranks": 2,
            "connected": [0],
            "lost": [1],
            "error": "rank 1 lost (disconnected)",
        }
    finally:
        server.close()


def test_a_lost_rank_is_named_even_when_the_step_failed_first():
    # which comes first is a race: MLX's collective fails ("connection to a peer was lost", naming no
    # rank) or the heartbeat sees the connection close; /health must say which rank either way
    health = ClusterHealth(2, seen={0, 1})
    health.fail("MLX step failed: [ring] connection to a peer was lost")
    health.fail("rank 1 lost (disconnected)", 1)
    health.fail("rank 1 lost (silent)", 1)
    assert health.as_dict()["lost"] == [1]
    assert health.error == "rank 1 lost (disconnected); MLX step failed: [ring] connection to a peer was lost"
    first = ClusterHealth(2, seen={0, 1})
    first.fail("rank 1 lost (disconnected)", 1)
    first.fail("MLX step failed: [ring] connection to a peer was lost")
    assert first.error == "rank 1 lost (disconnected)"  # the first failure is kept


def test_a_rank_started_without_a_launcher_is_told_how(tmp_path: Path, monkeypatch, capsys):
    from kinfer.cli import main

    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "a", "ips": ["127.0.0.1"]}, {"ssh": "b", "ips": ["127.0.0.1"]}]))
    monkeypatch.delenv("MLX_RANK", raising=False)
    with pytest.raises(SystemExit, match=f"kinfer distributed {hosts}"):
        main(["--headless", "--home", str(tmp_path), "--distributed", str(hosts)])
    assert main(["distributed", str(hosts), "--", "--model", "m"]) == 0
    assert "mlx.launch --hostfile" in capsys.readouterr().out
