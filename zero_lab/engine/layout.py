"""The engine's buckets: which parameters share a contiguous buffer, where, and who owns what.

Pure (``ParamSpec`` records in, :class:`Bucket` records out; no tensors, no process group), so
the layout and its memory bound are unit-tested at any simulated world size::

    buckets = plan_buckets(specs, world_size=2, partitioner=SortedGreedy(), bucket_cap_mb=25)
    grad_hold_bound(buckets, rank=0)   # bytes of gradients rank 0 may hold at once

Algorithm (Megatron-Core's param-and-grad buffer, with a ZeRO owner per element):

1. The trainable parameters are taken in *backward order* — the reverse of registration, the
   order autograd produces a feed-forward model's gradients in — and cut into buckets as
   :class:`~zero_lab.partition.Flat` cuts buffers: never mixing param groups or kinds (device +
   dtype), a module's parameters (same name up to the last dot) kept together, a bucket closed
   before the module that would take it past ``bucket_cap_mb`` (about a layer each with the
   default). Frozen parameters are in no bucket.
2. Owners: with an element-granular partitioner (:class:`~zero_lab.partition.Flat`) each bucket
   is padded to ``W·ceil(n/W)`` elements and rank r owns the r-th equal range (a parameter may
   straddle ranks). With a whole-parameter partitioner (``SortedGreedy``, ``Manual``,
   ``DdpBucket`` — which follows these buckets, each spec's ``bucket`` set to its index) the
   partitioner names each parameter's owner over the whole model, and inside each bucket the
   parameters are laid out *owner by owner*, so every rank's elements are one contiguous run.
   Either way every rank's share of a bucket is one range ``bounds[r]``: the segment it
   receives in the reduce-scatter, steps in place and sends in the all-gather.
3. The memory bound: gradients a rank holds during a step are its owned ranges (Ψ/W with a
   balanced partition) plus at most two bucket buffers (one filling, one in flight), each the
   size of the largest bucket: :func:`grad_hold_bound`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from zero_lab.partition import Flat, ParamSpec, Partitioner

__all__ = ["Bucket", "OwnedPiece", "grad_hold_bound", "owned_bytes", "owned_pieces", "plan_buckets"]


@dataclass(frozen=True)
class Bucket:
    """One contiguous buffer: ``params`` (indices into the specs) at ``offsets``, ``numel``
    elements with padding; rank r owns elements ``bounds[r]`` (one run, possibly empty)."""

    index: int
    group: int
    kind: str
    params: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]
    numel: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def owned_numel(self, rank: int) -> int:
        start, stop = self.bounds[rank]
        return stop - start


def plan_buckets(
    specs: Sequence[ParamSpec], world_size: int, partitioner: Partitioner, bucket_cap_mb: float | None
) -> tuple[Bucket, ...]:
    """The buckets of ``specs`` (registration order) at ``world_size``, in backward order (see the module docstring)."""
    trainable = [i for i, spec in enumerate(specs) if spec.trainable]
    # membership only: Flat's runs, cut evenly (its elementwise check is the engine's, at construction)
    backward = [dataclasses.replace(specs[i], elementwise=True) for i in reversed(trainable)]
    membership = Flat(bucket_cap_mb)(backward, world_size).layouts
    to_global = list(reversed(trainable))
    if cuts_elements(partitioner):
        return tuple(
            Bucket(
                index,
                layout.group,
                layout.kind,
                tuple(to_global[i] for i in layout.params),
                layout.offsets,
                tuple(backward[i].numel for i in layout.params),
                layout.bounds,
                layout.numel,
                backward[layout.params[0]].itemsize,
            )
            for index, layout in enumerate(membership)
        )
    bucket_of = {to_global[i]: index for index, layout in enumerate(membership) for i in layout.params}
    with_buckets = [dataclasses.replace(spec, bucket=bucket_of.get(i)) for i, spec in enumerate(specs)]
    owner = partitioner(with_buckets, world_size).owners()
    return tuple(
        _owner_major(index, [to_global[i] for i in layout.params], specs, owner, world_size, layout.group, layout.kind)
        for index, layout in enumerate(membership)
    )


def cuts_elements(partitioner: Partitioner) -> bool:
    """Whether ``partitioner`` cuts parameters into element ranges (``Flat``), not whole parameters to owners."""
    inner = getattr(partitioner, "inner", partitioner)  # WithoutGradients(Flat(), ...)
    return isinstance(inner, Flat)


def _owner_major(
    index: int, members: list[int], specs: Sequence[ParamSpec], owner: list[int], world_size: int, group: int, kind: str
) -> Bucket:
    ordered = sorted(members, key=lambda i: owner[i])  # stable: backward order inside each owner
    offsets, bounds, total = [], [], 0
    for rank in range(world_size):
        start = total
        for i in ordered:
            if owner[i] == rank:
                offsets.append(total)
                total += specs[i].numel
        bounds.append((start, total))
    sizes = tuple(specs[i].numel for i in ordered)
    return Bucket(
        index, group, kind, tuple(ordered), tuple(offsets), sizes, tuple(bounds), total, specs[ordered[0]].itemsize
    )


def owned_bytes(buckets: Sequence[Bucket], rank: int) -> int:
    """The gradient (and stepped parameter) bytes ``rank`` owns over all buckets (padding included)."""
    return sum(bucket.owned_numel(rank) * bucket.itemsize for bucket in buckets)


def grad_hold_bound(buckets: Sequence[Bucket], rank: int) -> int:
    """Most gradient bytes ``rank`` holds at once during a synchronised step: what it owns (in fp32 for
    a bf16/fp16 bucket: its main gradient, :mod:`~zero_lab.engine.main_params`) plus two buffers of the
    largest bucket's size per kind (one filling while the one before it is reduced; the buffers are
    reused from bucket to bucket, so each is the size of the largest)."""
    largest: dict[str, int] = {}
    for bucket in buckets:
        largest[bucket.kind] = max(largest.get(bucket.kind, 0), bucket.nbytes)
    owned = sum(bucket.owned_numel(rank) * _main_grad_itemsize(bucket) for bucket in buckets)
    return owned + 2 * sum(largest.values())


def _main_grad_itemsize(bucket: Bucket) -> int:
    return 4 if bucket.kind.endswith(("bfloat16", "float16")) else bucket.itemsize


@dataclass(frozen=True)
class OwnedPiece:
    """Elements ``[start, stop)`` of ``rank``'s owned range of bucket ``bucket`` (positions from the
    range's start) are elements ``[first, first + stop - start)`` of parameter ``param`` (an index into
    the specs); ``whole``: the piece is all of that parameter."""

    bucket: int
    param: int
    start: int
    stop: int
    first: int
    whole: bool


def owned_pieces(buckets: Sequence[Bucket], rank: int) -> list[OwnedPiece]:
    """``rank``'s owned range of every bucket cut at the parameter boundaries, in bucket order and,
    inside a bucket, in the order of the range."""
    pieces = []
    for bucket in buckets:
        start, stop = bucket.bounds[rank]
        for index, offset, size in sorted(zip(bucket.params, bucket.offsets, bucket.sizes), key=lambda m: m[1]):
            lo, hi = max(offset, start), min(offset + size, stop)
            if lo < hi:
                whole = lo == offset and hi == offset + size
                pieces.append(OwnedPiece(bucket.index, index, lo - start, hi - start, lo - offset, whole))
    return pieces
