"""Code a config names — a model's module, constructor and forward, a data source's batches and
loss — called with whatever it raises kept, so the check that owns the key reports it in one line.

User code may raise any exception, so :func:`attempt` is the app's one ``except Exception``: it
returns an :class:`Attempt` holding the value or the error, and the caller names the key
(``model: its forward fails on the data's first batch: ValueError: ...``).

    built = attempt(lambda: build(cfg.model))
    problem = None if built.error is None else f"model: cannot be built: {first_line(built.error)}"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Attempt", "attempt", "first_line"]

T = TypeVar("T")


@dataclass(frozen=True)
class Attempt(Generic[T]):
    """Something user code made (``value``), or what it raised (``error``)."""

    value: T | None = None
    error: Exception | None = None


def attempt(make: Callable[[], T]) -> Attempt[T]:
    """``make()`` — user code — kept with its value or its error."""
    try:
        return Attempt(make())
    except Exception as error:  # user code may raise anything; the caller reports it under the key that named it
        return Attempt(error=error)


def first_line(error: BaseException) -> str:
    """``ValueError: <the message's first line>`` (the type alone for an empty message)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
