"""Serving a rank's shard states to the rank that saves, outside any collective.

Training loops save the optimizer from one rank: HF Trainer calls ``optimizer.state_dict()``
on rank 0 *only* (the other ranks are already in the next step's forward), accelerate on
every rank but writes rank 0's. A ZeRO optimizer's state is spread over the ranks, so rank 0
cannot answer from its own memory, and a collective there would hang (nobody else calls
it). Algorithm: after its first step each rank starts a :class:`ShardStateServer` — one
daemon thread, one TCP socket bound to the address this host reaches the rendezvous with,
an ephemeral port — and publishes ``host:port:token`` in the process group's store under a
key unique to the optimizer. The rank that needs the full state (:func:`fetch_shard_states`)
reads each peer's address from the store, connects, sends the token, and receives that rank's
shard states (``torch.save`` bytes, loaded ``weights_only``). Nothing is sent unless asked;
every wait (store read, connect, each read) has the store's timeout. The thread ends once the
optimizer is collected or the default process group destroyed (checked every ``_POLL_S``), on
:meth:`ShardStateServer.stop`, and at the latest at interpreter exit, before finalization
(:mod:`zero_lab.background`: a daemon thread alive then can abort the process).

The peer's optimizer cannot change meanwhile: its next step needs this rank's gradients
(DDP's all-reduce) and parameters (the exchange), and this rank is busy saving.

    server = ShardStateServer("zero_lab/state/0/3", rank=1, owner=opt, store=store)  # serves opt.collect_shard_states()
    server.start()                                       # on every rank, once
    states = fetch_shard_states(store, "zero_lab/state/0/3", rank=1)   # on the saving rank
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import secrets
import socket
import struct
import threading
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from zero_lab import background

__all__ = ["ShardStateServer", "default_store", "fetch_shard_states"]

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct("!Q")
_POLL_S = 0.5  # how often an idle server checks whether it should stop


def default_store() -> dist.Store | None:
    """The default process group's store (the rendezvous every rank already reaches), or ``None``."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


def _store_timeout_s(store: dist.Store) -> float:
    timeout = getattr(store, "timeout", None)
    return timeout.total_seconds() if isinstance(timeout, timedelta) else 300.0


def _advertised_host() -> str:
    """The local address this host reaches the rendezvous (``MASTER_ADDR``) from; loopback alone."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if master in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))  # UDP: no packet is sent
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError(f"peer closed the connection with {left} of {size} bytes unread")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class ShardStateServer:
    """Answer each connection bearing the token with ``owner.collect_shard_states()`` (``torch.save`` bytes).

    Args:
        key: the store key prefix naming this optimizer (same on every rank).
        rank: this rank in the optimizer's process group (the store key's suffix).
        owner: the optimizer, held weakly: the server stops once it is collected.
        store: where the address is published (:func:`default_store`).
    """

    def __init__(self, key: str, rank: int, owner: Any, store: dist.Store):
        self.key, self.rank, self._owner, self._store = key, rank, weakref.ref(owner), store
        self._timeout_s = _store_timeout_s(store)
        self._token = secrets.token_hex(16)
        self._stop = threading.Event()
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind, publish ``host:port:token`` under ``key/rank`` and serve on a daemon thread."""
        host = _advertised_host()
        listener = socket.create_server((host, 0))
        listener.settimeout(_POLL_S)
        self._socket = listener
        port = listener.getsockname()[1]
        self._thread = background.start_thread(self._serve, f"zero_lab-state-{self.rank}", self._close)
        self._store.set(f"{self.key}/{self.rank}", f"{host}:{port}:{self._token}")

    def stop(self) -> None:
        """Stop serving and wait for the thread to end (:func:`zero_lab.background.end`)."""
        if self._thread is not None:
            background.end(self._thread)

    def _close(self) -> None:
        """Ask the thread to end: shutting the listening socket down wakes its ``accept`` at once."""
        self._stop.set()
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
            self._socket.close()

    def _serve(self) -> None:
        listener = self._socket
        assert listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if self._owner() is None or not dist.is_initialized():  # the optimizer or the group is gone
                    listener.close()
                    return
                continue
            except OSError:
                return  # closed by stop()
            with conn:
                try:
                    conn.settimeout(self._timeout_s)
                    if _recv_exact(conn, len(self._token)).decode() != self._token:
                        continue
                    owner = self._owner()
                    if owner is None:
                        continue
                    buffer = io.BytesIO()
                    torch.save(owner.collect_shard_states(), buffer)
                    del owner
                    conn.sendall(_LENGTH.pack(buffer.getbuffer().nbytes) + buffer.getvalue())
                except Exception as error:  # a failed request must not end the server
                    logger.warning("zero_lab: rank %d could not serve its shard states: %s", self.rank, error)


def fetch_shard_states(store: dist.Store, key: str, rank: int) -> Any:
    """Ask rank ``rank``'s :class:`ShardStateServer` (published under ``key``) for its shard states."""
    timeout_s = _store_timeout_s(store)
    try:
        host, port, token = store.get(f"{key}/{rank}").decode().rsplit(":", 2)
    except RuntimeError as error:
        raise RuntimeError(
            f"rank {rank} published no shard-state server under {key!r} within {timeout_s:.0f} s ({error}); "
            "call consolidate_state_dict() on every rank before state_dict()"
        ) from error
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
            conn.sendall(token.encode())
            (length,) = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size))
            payload = _recv_exact(conn, length)
    except OSError as error:  # refused, reset, timed out: the peer exited or is unreachable
        raise RuntimeError(
            f"could not fetch rank {rank}'s shard states from {host}:{port} ({error}); keep every rank alive "
            "until the save is done (end with a barrier), or call consolidate_state_dict() on every rank "
            "before state_dict()"
        ) from error
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
