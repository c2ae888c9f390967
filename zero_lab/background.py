"""The threads zero_lab starts in a process, each ended and joined before the interpreter finalizes.

Why: CPython (3.11, 3.12, 3.13) ends a daemon thread that wants the GIL back while the
interpreter finalizes with ``pthread_exit``, which unwinds the thread's C++ frames. torch frees
a process group, a store or a collective's ``Work`` with the GIL released (their destructors
join threads and wait), so a daemon thread that frees one — the last reference to a finished
``Work`` dropped in a worker loop, a cyclic garbage collection run by whatever thread allocates —
and gets the GIL back after finalization began dies inside that destructor: ``std::terminate``,
"terminate called without an active exception", SIGABRT, after all its work was done. (A thread
that drops such an object at exit by hand reproduces it every few runs.) A thread that has
ended by then cannot: :func:`end_all`, run at exit (``atexit``, before finalization), stops
every live thread started here and waits for it.

    thread = start_thread(serve, "zero_lab-state-1", stop=server.stop)   # a daemon thread
    end(thread)                        # stop() and join: what end_all() does for every thread at exit
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable

__all__ = ["END_TIMEOUT_S", "end", "end_all", "live_threads", "start_thread"]

#: How long :func:`end` waits for a thread after asking it to stop: longer than one idle poll of
#: any thread here (0.5 s); a thread still stuck in a collective past it is left (exit never hangs).
END_TIMEOUT_S = 10.0

_lock = threading.Lock()
_live: dict[threading.Thread, Callable[[], None]] = {}  # a thread started here -> how to ask it to stop


def start_thread(target: Callable[[], None], name: str, stop: Callable[[], None]) -> threading.Thread:
    """Start ``target`` on a daemon thread named ``name``; ``stop()`` must make it return soon
    (called once by :func:`end`, from another thread)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with _lock:
        for ended in [t for t in _live if not t.is_alive() and t.ident is not None]:
            del _live[ended]
        _live[thread] = stop
    thread.start()
    return thread


def end(thread: threading.Thread, timeout_s: float = END_TIMEOUT_S) -> None:
    """Ask ``thread`` (started by :func:`start_thread`) to stop and wait up to ``timeout_s`` for it."""
    with _lock:
        stop = _live.pop(thread, None)
    if stop is not None and thread.is_alive():
        stop()
    if thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout_s)


def end_all(timeout_s: float = END_TIMEOUT_S) -> None:
    """End every live thread :func:`start_thread` started: all asked first, then waited for, within
    ``timeout_s`` in all."""
    with _lock:
        started = list(_live.items())
        _live.clear()
    for thread, stop in started:
        if thread.is_alive():
            stop()
    deadline = time.monotonic() + timeout_s
    for thread, _ in started:
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def live_threads() -> list[threading.Thread]:
    """The threads started here that are still running."""
    with _lock:
        return [t for t in _live if t.is_alive()]


atexit.register(end_all)
