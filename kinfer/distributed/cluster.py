"""Joining the distributed group, and what each rank then does.

Rank 0 serves HTTP as usual, but its models load through `Cluster.engine_factory`: the engine of its
shard (`LeaderEngine`), after telling the other ranks to load theirs. Every other rank runs `follow`:
load, replay each step's plan, close, until rank 0 says exit or goes away.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from kinfer.config import Settings
from kinfer.distributed.health import BEAT_S, ClusterHealth, HealthServer, beat_to_leader
from kinfer.distributed.hostfile import MLX_LAUNCH_PORT, Hostfile, read_hostfile
from kinfer.distributed.leader import LeaderEngine
from kinfer.distributed.plan import Load, Plan, broadcast
from kinfer.distributed.replica import build_engine, check, replay
from kinfer.errors import EngineFailure, InvalidRequest

log = logging.getLogger(__name__)


def health_port(settings: Settings, environ=os.environ) -> int:
    """--distributed-port, else the port just below the ring's first (mlx.launch's, or MLX_HOSTFILE's)."""
    if settings.distributed_port:
        return settings.distributed_port
    try:
        ring = json.loads(Path(environ["MLX_HOSTFILE"]).read_text())
        return int(ring[0][0].rsplit(":", 1)[1]) - 1
    except (KeyError, OSError, ValueError, IndexError, TypeError):
        return MLX_LAUNCH_PORT - 1


class Cluster:
    """This process's place in the group: its rank, the group, and (rank 0) the ranks' health."""

    def __init__(self, settings: Settings, environ=os.environ) -> None:
        import mlx.core as mx

        from kinfer.engines.mlx.cuda_graphs import keep_graphs
        from kinfer.engines.mlx.ptx_cache import keep_kernels_on_cuda

        assert settings.distributed is not None
        self.hostfile: Hostfile = read_hostfile(settings.distributed)
        if "MLX_RANK" not in environ:
            raise InvalidRequest(
                "--distributed: this process has no rank; start the ranks with "
                f"`kinfer distributed {settings.distributed}` (it prints the commands)"
            )
        keep_graphs(environ)  # before the group's first GPU work makes MLX's command encoder
        self.group = mx.distributed.init(strict=True, backend=self.hostfile.backend)
        keep_kernels_on_cuda(settings.home)  # every rank's, as a single server's (ptx_cache.py)
        self.rank = self.group.rank()
        if self.group.size() != len(self.hostfile.hosts):
            raise InvalidRequest(
                f"the group has {self.group.size()} ranks but {settings.distributed} lists "
                f"{len(self.hostfile.hosts)} hosts"
            )
        self.port = health_port(settings, environ)
        self.health = ClusterHealth(self.group.size(), seen={0})
        self._server: HealthServer | None = None
        log.info("rank %d of %d (%s backend)", self.rank, self.group.size(), self.hostfile.backend)
        if self.rank == 0:
            self._server = HealthServer(self.health, _bind_address(self.hostfile.leader_ip), self.port)
        else:
            beat_to_leader(self.hostfile.leader_ip, self.port, self.rank)

    # ---- rank 0 -------------------------------------------------------------------------

    def engine_factory(self, model, settings: Settings, ctx: int | None):
        """Load `model` on every rank; rank 0 keeps the `LeaderEngine`. Refused once a rank is lost."""
        from kinfer.engines.loader import mlx_engine_kwargs

        if not self.health.ok:
            raise EngineFailure(f"the distributed group failed: {self.health.error}")
        if model.format != "mlx":
            raise InvalidRequest(f"{model.name}: only MLX models are served across ranks")
        kwargs = mlx_engine_kwargs(settings, ctx)
        engine = build_engine(model.path, model.name, kwargs, self.group)
        # every rank sizes as rank 0 did, whatever its own memory: its plan travels, no budget applies
        follower_kwargs = {**kwargs, "memory_budget_gb": -1.0}
        try:
            broadcast(Plan("load", load=Load(model.name, follower_kwargs, engine.plan)), self.group)
            if settings.mlx_self_check:
                check(engine)
        except Exception as exc:
            self.health.fail(str(exc))  # kept only if the heartbeat has not said which rank went first
            engine.close()
            raise EngineFailure(f"loading {model.name} across ranks failed: {self.health.error}") from exc
        log.info("rank 0 loaded %s: %s", model.name, weights_line(engine))
        return LeaderEngine(engine, self.group, self.health)

    def status(self) -> dict:
        return {"rank": 0, **self.health.as_dict()}

    def close(self) -> None:
        """Rank 0 shutting down: the followers exit (best effort: a broken group cannot be told)."""
        if self.health.ok:
            try:
                broadcast(Plan("exit"), self.group)
            except Exception as exc:
                log.warning("telling the ranks to exit failed: %s", exc)
        if self._server is not None:
            self._server.close()

    # ---- every other rank -----------------------------------------------------------------

    def follow(self, settings: Settings) -> int:
        """Replay rank 0's plans until it says exit (0) or a step fails here (1: rank 0 then sees a
        lost peer)."""
        from kinfer.store.catalog import Store

        store = Store.from_settings(settings)
        engine = None
        while True:
            plan = broadcast(None, self.group)
            try:
                if plan.kind == "load":
                    assert plan.load is not None
                    if engine is not None:
                        engine.close()
                    model = store.resolve(plan.load.model)
                    engine = build_engine(
                        model.path, model.name, plan.load.kwargs, self.group, size=plan.load.size
                    )
                    if settings.mlx_self_check:
                        check(engine)
                    log.info("rank %d loaded %s: %s", self.rank, model.name, weights_line(engine))
                elif plan.kind == "step":
                    assert engine is not None, "a step before any load"
                    replay(engine, plan)
                elif plan.kind == "close":
                    if engine is not None:
                        engine.close()
                    engine = None
                else:
                    return 0
            except Exception:
                log.exception("rank %d failed replaying a %s plan", self.rank, plan.kind)
                return 1


def weights_line(engine) -> str:
    """What this rank holds, for the operator (and the test that checks the split): its shard's weights
    and MLX's active memory."""
    import mlx.core as mx

    return f"weights {engine.stats().memory['weights']} bytes, active {mx.get_active_memory()} bytes"


def _bind_address(ip: str) -> str:
    # rank 0's address from the hostfile; a host name there (no ips) binds every interface
    return ip if ip.replace(".", "").isdigit() or ":" in ip else "0.0.0.0"


__all__ = ["BEAT_S", "Cluster"]
