"""DDP's gradient buckets, modelled once: which bucket each parameter's gradient lands in.

``torch.nn.parallel.DistributedDataParallel`` walks its parameters (those that need a
gradient, in registration order) and closes a bucket once the next parameter would
overflow it; the first bucket has its own, smaller cap (``min(first, cap)``). It then
numbers the buckets in reverse, because gradients become ready roughly last layer
first. :class:`DdpBuckets` holds the two caps and replays that walk; it is pure (sizes
in, bucket indices out), so the app's config checks use it before any process group
exists, and the optimizer is built along the same buckets the overlap hooks later see::

    buckets = ddp_bucket_map(ddp)                       # {id(param): bucket}, DDP's real caps
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, overlap_with_ddp=True, ddp_buckets=buckets)
    DdpBuckets.from_bucket_cap_mb(25).assign([4_000_000, 2_000])   # what DDP(bucket_cap_mb=25) would make

It is a model, not DDP itself: DDP also splits buckets by device and dtype, takes one
bucket for the first iteration (without ``find_unused_parameters``) and may rebuild
them in the order gradients arrived. The overlap hooks plan every bucket from
``bucket.parameters()`` when it arrives, so a partition built along this model is
always correct; where DDP's real buckets differ it is only less aligned with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DDP_BUCKET_CAP_BYTES", "DDP_BUCKET_CAP_MB", "DDP_FIRST_BUCKET_CAP_BYTES", "DdpBuckets", "ddp_bucket_map"]

#: DDP's default bucket cap in MiB (``DistributedDataParallel(bucket_cap_mb=25)``).
DDP_BUCKET_CAP_MB = 25
#: DDP's default bucket cap in bytes.
DDP_BUCKET_CAP_BYTES = DDP_BUCKET_CAP_MB * 2**20
#: DDP's default cap of the first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``).
DDP_FIRST_BUCKET_CAP_BYTES = 2**20


@dataclass(frozen=True)
class DdpBuckets:
    """DDP's bucket caps in bytes; :meth:`assign` gives each parameter its bucket."""

    bucket_cap_bytes: int = DDP_BUCKET_CAP_BYTES
    first_bucket_cap_bytes: int = DDP_FIRST_BUCKET_CAP_BYTES

    def __post_init__(self) -> None:
        for name in ("bucket_cap_bytes", "first_bucket_cap_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"DdpBuckets.{name} must be a non-negative int of bytes, got {value!r}")

    @classmethod
    def from_ddp(cls, ddp: Any) -> DdpBuckets:
        """The caps a ``DistributedDataParallel`` module really uses (an older torch keeps no
        first cap on the module: it always gives its reducer 1 MiB)."""
        config = getattr(ddp, "_bucket_config", None)
        first = DDP_FIRST_BUCKET_CAP_BYTES if config is None else config.first_bucket_bytes_cap
        return cls(int(ddp.bucket_bytes_cap), int(first))

    @classmethod
    def from_bucket_cap_mb(cls, bucket_cap_mb: float | None) -> DdpBuckets:
        """The caps ``DDP(model, bucket_cap_mb=...)`` would take, without building it:
        the installed torch's own rule (``None``: DDP's defaults)."""
        from torch.nn.parallel import distributed

        capacity = getattr(distributed, "_BucketCapacityConfig", None)
        if capacity is None:  # torch before the config object: the first cap was always 1 MiB
            mb = DDP_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
            return cls(int(mb * 2**20), DDP_FIRST_BUCKET_CAP_BYTES)
        config = capacity.create(bucket_cap_mb=bucket_cap_mb, bucket_cap_mb_list=None, use_python_reducer=False)
        return cls(int(config.bucket_bytes_cap), int(config.first_bucket_bytes_cap))

    def assign(self, nbytes: Sequence[int]) -> list[int]:
        """The bucket of each parameter, given their sizes in registration order."""
        buckets: list[int] = []
        current, filled, cap = 0, 0, min(self.first_bucket_cap_bytes, self.bucket_cap_bytes)
        for size in nbytes:
            if filled and filled + size > cap:
                current, filled, cap = current + 1, 0, self.bucket_cap_bytes
            buckets.append(current)
            filled += size
        return [current - b for b in buckets]

    def bucket_of(self, params: Iterable[Any]) -> dict[int, int]:
        """``{id(param): bucket}`` for ``params`` in DDP's registration order
        (``ddp.module.parameters()``); parameters that need no gradient get none (DDP skips them)."""
        trainable = [p for p in params if p.requires_grad]
        return {id(p): b for p, b in zip(trainable, self.assign([p.numel() * p.element_size() for p in trainable]))}


def ddp_bucket_map(ddp: Any) -> dict[int, int]:
    """``{id(param): bucket}`` for every parameter a DDP module buckets, with its real caps:
    what ``ZeroRedundancyOptimizer(..., ddp_buckets=)`` takes."""
    return DdpBuckets.from_ddp(ddp).bucket_of(ddp.module.parameters())
