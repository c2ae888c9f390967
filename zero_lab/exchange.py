"""After each rank steps its shards, the exchange makes every replica whole again.

Three ways, chosen from the partition and ``parameters_as_bucket_view``:

* **flat all-gather** — the partition has buffer layouts (element-granular): one
  ``all_gather_into_tensor`` per buffer. With bucket views the parameters *are* views
  into the buffer; without, each rank stages its range in and copies the result out.
* **bucket broadcast** — bucket views over a whole-parameter partition: each (device,
  dtype) gets one buffer laid out rank by rank (trainable parameters only); rank r
  broadcasts its segment, one collective per rank instead of one per tensor.
* **per-shard broadcast** — otherwise: each trainable shard is broadcast from its
  owner in place; ``param.data`` is never replaced.

Every rank issues the same collectives in the same order, because all of it is
derived from the partition, which every rank computes identically.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zero_lab.comm import Communicator
from zero_lab.partition import BucketLayout, Partition

__all__ = ["ParamExchange", "rank_major_layouts"]


def rank_major_layouts(partition: Partition, trainable: Sequence[bool]) -> list[BucketLayout]:
    """One layout per kind: rank 0's trainable parameters, then rank 1's, and so on."""
    members: dict[str, list[list[int]]] = {}
    for shard in sorted(partition.shards, key=lambda s: (s.rank, s.param)):
        if trainable[shard.param]:
            kind = partition.specs[shard.param].kind
            members.setdefault(kind, [[] for _ in range(partition.world_size)])[shard.rank].append(shard.param)
    layouts = []
    for kind, per_rank in members.items():
        params, offsets, bounds, total = [], [], [], 0
        for ranks_params in per_rank:
            start = total
            for index in ranks_params:
                params.append(index)
                offsets.append(total)
                total += partition.specs[index].numel
            bounds.append((start, total))
        layouts.append(BucketLayout(kind, -1, tuple(params), tuple(offsets), tuple(bounds), total))
    return layouts


class _Bucket:
    """A layout made real: a buffer, and (if ``as_view``) parameters as views into it."""

    def __init__(self, layout: BucketLayout, params: Sequence[torch.Tensor], as_view: bool):
        self.layout = layout
        self.params = [params[i] for i in layout.params]
        first = self.params[0]
        self.buffer: torch.Tensor | None = None
        if as_view:
            self.buffer = torch.empty(layout.numel, dtype=first.dtype, device=first.device)
            for param, offset in zip(self.params, layout.offsets):
                view = self.buffer[offset : offset + param.numel()]
                view.copy_(param.data.reshape(-1))
                param.data = view.view_as(param.data)
            if layout.numel > sum(p.numel() for p in self.params):
                self.buffer[sum(p.numel() for p in self.params) :].zero_()

    def gather(self, comm: Communicator) -> None:
        start, stop = self.layout.bounds[comm.rank]
        if self.buffer is not None:
            comm.all_gather_into(self.buffer, self.buffer[start:stop].clone())
            return
        first = self.params[0]
        output = torch.empty(self.layout.numel, dtype=first.dtype, device=first.device)
        local = output[start:stop]
        for param, offset in zip(self.params, self.layout.offsets):
            lo, hi = max(start, offset), min(stop, offset + param.numel())
            if hi > lo:
                local[lo - start : hi - start].copy_(param.data.reshape(-1)[lo - offset : hi - offset])
        comm.all_gather_into(output, local.clone())
        for param, offset in zip(self.params, self.layout.offsets):
            if param.requires_grad:
                param.data.copy_(output[offset : offset + param.numel()].view_as(param))

    def broadcast_segments(self, comm: Communicator) -> None:
        assert self.buffer is not None
        comm.broadcast_many(
            [(self.buffer[a:b], rank) for rank, (a, b) in enumerate(self.layout.bounds) if b > a],
            op="broadcast_buckets",
        )


class ParamExchange:
    """Synchronises parameter shards across ranks; see the module docstring."""

    def __init__(self, params: Sequence[torch.Tensor], partition: Partition, comm: Communicator, bucket_view: bool):
        self.params = list(params)
        self.partition = partition
        self.comm = comm
        self.bucket_view = bucket_view
        if bucket_view and not partition.is_whole and not partition.layouts:
            raise ValueError(
                "parameters_as_bucket_view=True needs a whole-parameter partition or one with buffer layouts "
                "(Flat); this partitioner cuts parameters without layouts: use parameters_as_bucket_view=False"
            )
        self.buckets: list[_Bucket] = []
        self.rebuild()

    @property
    def mode(self) -> str:
        if self.partition.layouts:
            return "flat_all_gather"
        return "bucket_broadcast" if self.bucket_view else "per_shard_broadcast"

    def rebuild(self) -> None:
        """(Re)build buffers, e.g. after parameters changed trainability."""
        trainable = [p.requires_grad for p in self.params]
        if self.mode == "flat_all_gather":
            if not self.buckets:
                self.buckets = [_Bucket(layout, self.params, self.bucket_view) for layout in self.partition.layouts]
        elif self.mode == "bucket_broadcast":
            for param, is_trainable in zip(self.params, trainable):
                if not is_trainable and self.buckets:
                    # Detach frozen parameters from the old buffer so its reuse cannot clobber them.
                    param.data = param.data.detach().clone()
            self.buckets = [
                _Bucket(layout, self.params, True) for layout in rank_major_layouts(self.partition, trainable)
            ]

    def update(self, params: Sequence[torch.Tensor], partition: Partition) -> None:
        """Adopt a partition extended by an added group; existing flat buffers are kept
        (the local optimizer's slice views point into them)."""
        self.params = list(params)
        self.partition = partition
        if self.mode == "flat_all_gather":
            built = {bucket.layout for bucket in self.buckets}
            self.buckets += [
                _Bucket(lay, self.params, self.bucket_view) for lay in partition.layouts if lay not in built
            ]
        else:
            self.rebuild()

    def run(self) -> None:
        """Exchange every rank's updated shards."""
        if self.mode == "flat_all_gather":
            for bucket in self.buckets:
                bucket.gather(self.comm)
        elif self.mode == "bucket_broadcast":
            for bucket in self.buckets:
                bucket.broadcast_segments(self.comm)
        else:
            self.comm.broadcast_many(
                [
                    (self._shard_tensor(s.param, s.start, s.stop), s.rank)
                    for s in sorted(self.partition.shards, key=lambda s: (s.rank, s.param))
                    if self.params[s.param].requires_grad
                ],
                op="broadcast_params",
            )

    def _shard_tensor(self, index: int, start: int, stop: int) -> torch.Tensor:
        param = self.params[index]
        if start == 0 and stop == param.numel():
            return param.data
        return param.data.view(-1)[start:stop]
