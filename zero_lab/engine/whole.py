"""Whole parameters for classes that step whole matrices (Muon), on the engine's buckets.

``torch.optim.Muon`` orthogonalises a gradient matrix with Newton–Schulz iterations, which needs
the whole matrix: an element range cannot be stepped. The engine steps such param groups (a
:class:`~zero_lab.ChainedOptimizer` group whose class :func:`~zero_lab.is_elementwise` refuses)
with a whole-parameter partitioner (``SortedGreedy``, ``Manual``, ``DdpBucket``): each matrix has
one owner, and inside a bucket every rank's matrices are one contiguous run
(:mod:`~zero_lab.engine.layout`). So:

* the optimizer's group holds the parameters this rank owns, the module's own tensors (views of
  the parameter buffer), and steps them in place (:func:`owned_whole`);
* before the step each one's ``.grad`` becomes the matching view, shaped like it, of its bucket's
  reduced owned gradient (:func:`hand_grads`; clipping scales that same memory), and after the
  step it is dropped again, with the bucket's owned gradient (:func:`drop_grads`), so the next
  backward's hooks find ``None`` and its reduction starts afresh, as ``zero_grad()`` would.

Elementwise groups (AdamW beside Muon) are stepped on the bucket ranges as everywhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zero_lab.engine.buffer import ParamAndGradBuffer
from zero_lab.engine.layout import owned_pieces

__all__ = ["WholeParam", "drop_grads", "hand_grads", "owned_whole"]


@dataclass(frozen=True)
class WholeParam:
    """Parameter ``param`` (an index of the buffer's parameters) is elements ``[start, stop)`` of this
    rank's owned range of bucket ``bucket``."""

    param: int
    bucket: int
    start: int
    stop: int


def owned_whole(buffer: ParamAndGradBuffer, rank: int, whole: set[int]) -> list[WholeParam]:
    """The parameters of ``whole`` (indices of the buffer's parameters) that ``rank`` owns, each whole."""
    found = []
    for piece in owned_pieces(buffer.buckets, rank):
        if piece.param in whole:
            if not piece.whole:
                raise ValueError(
                    f"parameter #{piece.param} is stepped whole (its class is not elementwise) but the "
                    "partitioner cut it across ranks; use a whole-parameter partitioner (SortedGreedy(), Manual)"
                )
            found.append(WholeParam(piece.param, piece.bucket, piece.start, piece.stop))
    return found


def hand_grads(buffer: ParamAndGradBuffer, owned: Sequence[WholeParam]) -> None:
    """Give each owned whole parameter its reduced gradient: a view of its bucket's owned gradient."""
    for item in owned:
        main = buffer.main[item.bucket]
        grad = None if main is None else main.grad
        if grad is not None:
            param = buffer.params[item.param]
            param.grad = grad[item.start : item.stop].view(param.shape)


def drop_grads(buffer: ParamAndGradBuffer, owned: Sequence[WholeParam]) -> None:
    """Release the views :func:`hand_grads` gave, and their buckets' owned gradients (after the step: no
    optimizer group holds those ranges, so no ``zero_grad()`` would)."""
    for item in owned:
        buffer.params[item.param].grad = None
        main = buffer.main[item.bucket]
        if main is not None:
            main.grad = None
