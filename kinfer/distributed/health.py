"""Which ranks are alive, seen from rank 0: a heartbeat over a plain TCP connection per follower.

Tensors never travel here (MLX's own transport carries them); this only answers two questions the
collectives cannot while nothing is generating: has a rank gone (its connection closed, or silent for
`SILENCE_S`), and has rank 0 gone (a follower then exits rather than wait in a collective forever).
A rank lost mid-step is also seen by the step itself: MLX raises, and the leader engine reports it.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

BEAT_S = 0.5
SILENCE_S = 3.0


@dataclass
class ClusterHealth:
    """Rank 0's view: the ranks it expects, those seen, and the first failure (kept: a lost rank does
    not come back into a running group)."""

    size: int
    seen: set[int] = field(default_factory=set)
    lost: set[int] = field(default_factory=set)
    error: str | None = None
    _named: bool = False  # whether `error` names a lost rank
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail(self, reason: str, rank: int | None = None) -> None:
        """The first failure is kept; a lost rank named after a failure that named none (a step that
        failed first: MLX's "connection to a peer was lost" says not whose) is put in front of it."""
        with self._lock:
            if rank is not None and rank not in self.lost:
                self.lost.add(rank)
                if self.error is not None and not self._named:
                    self.error = f"{reason}; {self.error}"
                    log.error("distributed group failed: %s", self.error)
            if self.error is None:
                self.error = reason
                log.error("distributed group failed: %s", reason)
            self._named = self._named or rank is not None

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict:
        with self._lock:
            return {
                "ranks": self.size,
                "connected": sorted(self.seen - self.lost),
                "lost": sorted(self.lost),
                "error": self.error,
            }


class HealthServer:
    """Rank 0: accepts one connection per follower (it sends its rank), then watches its beats."""

    def __init__(self, health: ClusterHealth, host: str, port: int) -> None:
        self.health = health
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(BEAT_S)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="kinfer-health", daemon=True).start()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._watch, args=(conn,), daemon=True).start()

    def _watch(self, conn: socket.socket) -> None:
        conn.settimeout(SILENCE_S)
        rank = None
        try:
            rank = struct.unpack("!i", _read(conn, 4))[0]
            with self.health._lock:
                self.health.seen.add(rank)
            log.info("rank %d connected", rank)
            while not self._closed.is_set():
                _read(conn, 1)
        except (OSError, EOFError) as exc:
            if not self._closed.is_set():
                why = "silent" if isinstance(exc, TimeoutError) else "disconnected"
                self.health.fail(f"rank {rank} lost ({why})", rank)
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self._sock.close()


def beat_to_leader(host: str, port: int, rank: int, *, connect_s: float = 60.0) -> None:
    """A follower: connect to rank 0's health port and beat until it goes; then end this process (a
    follower without rank 0 has nobody to follow, and may sit in a collective that never completes)."""
    deadline = time.monotonic() + connect_s
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=SILENCE_S)
            break
        except OSError:
            if time.monotonic() > deadline:
                log.error("rank 0's health port %s:%d never answered; exiting", host, port)
                os._exit(3)
            time.sleep(0.2)
    conn.sendall(struct.pack("!i", rank))

    def beat() -> None:
        try:
            while True:
                conn.sendall(b".")
                time.sleep(BEAT_S)
        except OSError:
            log.error("rank 0 is gone; rank %d exits", rank)
            os._exit(3)

    threading.Thread(target=beat, name="kinfer-heartbeat", daemon=True).start()


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("closed")
        data += chunk
    return data
