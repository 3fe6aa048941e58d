"""The hostfile of a distributed server (mlx.launch's JSON), and the commands that start its ranks.

    {"backend": "ring", "hosts": [{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]}

or just the list of hosts. `mlx.launch --hostfile FILE` starts one process per host and gives each its
rank (`MLX_RANK`) and, for the ring backend, the ring's addresses (`MLX_HOSTFILE`, a JSON list of
"ip:port" lists, one per rank); kinfer reads the same file for the backend, the number of ranks and
rank 0's address (its health port listens there).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from kinfer.errors import InvalidRequest

BACKENDS = ("ring", "nccl", "jaccl", "mpi")
MLX_LAUNCH_PORT = 32323  # mlx.launch's --starting-port default: the ring's first port


@dataclass(frozen=True)
class Hostfile:
    path: Path
    backend: str
    hosts: tuple[tuple[str, tuple[str, ...]], ...]  # (ssh name, ips) per rank

    @property
    def leader_ip(self) -> str:
        return self.hosts[0][1][0] if self.hosts[0][1] else self.hosts[0][0]


def read_hostfile(path: Path) -> Hostfile:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot read the hostfile {path}: {exc}") from exc
    backend = "ring"
    if isinstance(data, dict):
        backend = data.get("backend") or "ring"
        data = data.get("hosts")
    if not isinstance(data, list) or len(data) < 2:
        raise InvalidRequest(f"{path}: a hostfile lists two hosts or more")
    if backend not in BACKENDS:
        raise InvalidRequest(f"{path}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    hosts = []
    for host in data:
        if not isinstance(host, dict) or not isinstance(host.get("ssh"), str):
            raise InvalidRequest(f"{path}: each host is an object with an 'ssh' name (and 'ips')")
        ips = host.get("ips") or []
        if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
            raise InvalidRequest(f"{path}: 'ips' is a list of addresses")
        hosts.append((host["ssh"], tuple(ips)))
    if backend == "ring" and any(not ips for _, ips in hosts):
        raise InvalidRequest(f"{path}: the ring backend needs the 'ips' of every host")
    return Hostfile(Path(path), backend, tuple(hosts))


def ring_file(hostfile: Hostfile, port: int = MLX_LAUNCH_PORT) -> list[list[str]]:
    """What mlx.launch writes to MLX_HOSTFILE for the ring: one "ip:port" per rank, ports counting up."""
    return [[f"{ips[0]}:{port + rank}"] for rank, (_, ips) in enumerate(hostfile.hosts)]


def launch_commands(hostfile: Hostfile, kinfer_args: list[str]) -> str:
    """The commands that start the ranks: mlx.launch, and the same by hand (one per host)."""
    serve = ["kinfer", "--headless", "--distributed", str(hostfile.path), *kinfer_args]
    launch = ["mlx.launch", "--hostfile", str(hostfile.path), "--backend", hostfile.backend, "--", *serve]
    lines = ["# every rank at once (ssh to each host; ends all ranks when one exits):", shlex.join(launch)]
    if hostfile.backend == "ring":
        ring = json.dumps(ring_file(hostfile))
        lines += ["", f"# or by hand, one per host, with this ring file as ring.json on each: {ring}"]
        for rank, (ssh, _) in enumerate(hostfile.hosts):
            lines.append(f"[{ssh}] MLX_RANK={rank} MLX_HOSTFILE=ring.json {shlex.join(serve)}")
    return "\n".join(lines)
