"""The engine's communication: each bucket's gradients to their owners, and parameters back.

:class:`BucketGroup` (Megatron-Core's bucket group, with ZeRO owners):

* **gradients** — :meth:`BucketGroup.grad_ready` is called from every parameter's
  post-accumulate-grad hook in a synchronised backward. It writes the gradient (÷ W) into the
  bucket's buffer, releases ``param.grad`` and counts; when a bucket has all its gradients it is
  *ready*, and ready buckets are issued strictly in bucket order (so every rank issues the same
  collectives in the same order) through a registered ``grad_reduce`` strategy
  (:class:`zero_lab.grad_reduce.GradReduce`: the bucket's per-rank ranges as segments, the bucket
  index as the point-to-point tag). A shard group of one (W=1, or ``shard_size=1``) issues nothing:
  the buffer already holds the whole gradient and this rank owns every range, so a complete bucket
  is finished at once (and no parameter is gathered after the step). When a bucket needs a gradient
  buffer while two are taken, the oldest reduction is waited and finished — its reduced range (with
  shard groups, ``shard_size`` < W: then all-reduced across the replica group, the ranks owning the
  same range in the other groups) copied into (or added to) the owned gradient, the ``.grad`` of the
  tensor the optimizer steps (the owned view, or its fp32 main copy:
  :mod:`~zero_lab.engine.main_params`), its buffer given back — so at most two bucket buffers live
  at once and each reduction overlaps the backward of the next bucket;
* :meth:`BucketGroup.finish_grad_sync` (before the optimizer steps) completes the buckets some
  parameter's hook never reached — a parameter no gradient reached this time counts as zeros, one
  that holds a gradient accumulated under ``no_sync()`` contributes it — issues them in order and
  waits for everything in flight;
* **parameters** — :meth:`BucketGroup.start_param_sync` (after the step) issues every bucket's
  all-gather of the owners' ranges in place on the parameter buffer, in forward order (the reverse
  of bucket order), through a registered ``exchange`` collective
  (:class:`zero_lab.collectives.Collective`); :meth:`BucketGroup.wait_params` waits for one bucket
  (the next forward calls it module by module), :meth:`BucketGroup.wait_all` for all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from zero_lab.collectives import Collective, InFlight
from zero_lab.comm import Communicator
from zero_lab.engine.buffer import ParamAndGradBuffer
from zero_lab.engine.main_params import accumulate_grad
from zero_lab.grad_reduce import GradReduce, Reduced

__all__ = ["BucketGroup"]


class BucketGroup:
    """Reduces each complete bucket to its owners and gathers parameters (see the module docstring)."""

    def __init__(
        self,
        buffer: ParamAndGradBuffer,
        comm: Communicator,
        reduce: GradReduce,
        gather: Collective,
        gather_comm: Communicator | None = None,
        replicas: Communicator | None = None,
    ):
        self.buffer = buffer
        self.comm = comm  # the gradient reduction's (and its meter)
        self.gather_comm = gather_comm or comm  # the parameter all-gather's
        #: with shard groups (``shard_size`` < W): the replica group each owned range is all-reduced across
        self.replicas = replicas
        #: the data-parallel world the gradients are averaged over
        self.world_size = comm.world_size * (replicas.world_size if replicas is not None else 1)
        self.reduce = reduce
        self.gather = gather
        count = len(buffer.buckets)
        #: a shard group of one: this rank owns every bucket whole, so nothing is reduced inside it or gathered
        self.solo = comm.world_size == 1
        self._scale = 1.0 / self.world_size
        self._sizes = [len(bucket.params) for bucket in buffer.buckets]
        self._arrived = [bytearray(size) for size in self._sizes]  # per position: its gradient arrived
        self._missing = list(self._sizes)  # per bucket: gradients still to arrive
        self._next = 0  # the first bucket not yet issued
        self._reducing: deque[tuple[int, Reduced | None]] = deque()
        self._gathering: list[InFlight | None] = [None] * count
        self._gathers = 0  # all-gathers in flight (the next forward's waits return at once when none)
        self.started = False  # a gradient of this synchronised backward arrived

    # ------------------------------------------------------------------ gradients
    def grad_ready(self, param: torch.Tensor) -> None:
        """``param``'s gradient is accumulated (a post-accumulate-grad hook): into its bucket."""
        b, position = self.buffer.where[id(param)]
        self.started = True
        arrived = self._arrived[b]
        if arrived[position]:
            raise RuntimeError(
                "a parameter received a second gradient in one synchronised backward after its bucket was "
                "complete (a parameter used twice across two backward calls?): run every backward but the "
                "last inside model.no_sync()"
            )
        if self.buffer.grad_data[b] is None:
            self._make_room()
        self.buffer.write_grad(b, position, param.grad, self._scale)
        param.grad = None
        arrived[position] = 1
        self._missing[b] -= 1
        if not self._missing[b]:
            self._issue_ready()

    def _issue_ready(self) -> None:
        """Issue the complete buckets from ``_next`` on, in bucket order. A shard group of one issues no
        collective: its buffer already holds the whole (÷ W) gradient, finished at once."""
        while self._next < len(self._missing) and not self._missing[self._next]:
            b = self._next
            self._next += 1
            if self.solo:
                self._reducing.append((b, None))
                self._finish_oldest()
                continue
            bucket = self.buffer.buckets[b]
            data = self.buffer.grad_buffer(b)
            segments = [data[a:z] for a, z in bucket.bounds] if self.reduce.scatters else [data]
            self._reducing.append((b, self.reduce.issue(self.comm, segments, tag=b)))

    def _make_room(self) -> None:
        """Before a bucket takes a gradient buffer: while two are taken, finish the oldest reduction
        (waiting as late as possible, so each reduction overlaps the backward of the next bucket)."""
        while self.buffer.live >= 2 and self._reducing:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        b, reduced = self._reducing.popleft()
        main = self.buffer.main[b]
        if reduced is None:  # a shard group of one: the buffer is the reduced bucket (this rank owns all of it)
            result = self.buffer.grad_buffer(b)[slice(*self.buffer.buckets[b].bounds[0])]
        else:
            result = reduced.wait()
        if main is not None:
            if reduced is not None and not self.reduce.scatters:
                result = result[slice(*self.buffer.buckets[b].bounds[self.comm.rank])]
            if self.replicas is not None and result.numel():  # the same range's owners in the other groups
                self.replicas.all_reduce(result, op="engine_grad_replicas")
            accumulate_grad(main, result, self.buffer.owned_grad(b))
        self.buffer.release(b)
        self.buffer.note_held()

    def finish_grad_sync(self) -> None:
        """Complete, issue and wait for every bucket of this backward (see the module docstring)."""
        if not self.started:
            return
        for b in range(self._next, len(self._missing)):
            if not self._missing[b]:
                continue
            for position, index in enumerate(self.buffer.buckets[b].params):
                if not self._arrived[b][position]:
                    if self.buffer.grad_data[b] is None:
                        self._make_room()
                    param = self.buffer.params[index]
                    self.buffer.write_grad(b, position, param.grad, self._scale)
                    param.grad = None
            self._missing[b] = 0
            self._issue_ready()
        while self._reducing:
            self._finish_oldest()
        self.buffer.note_held(exact=True)
        for b, size in enumerate(self._sizes):
            self._arrived[b][:] = bytes(size)
        self._missing[:] = self._sizes
        self._next = 0
        self.started = False

    # ------------------------------------------------------------------ parameters
    def start_param_sync(self) -> None:
        """Issue every bucket's all-gather of the owners' ranges, in forward order."""
        if self.solo:  # the owner of every range is this rank: the parameters are up to date
            return
        for b in reversed(range(len(self.buffer.buckets))):
            self.wait_params(b)
            bounds = self.buffer.buckets[b].bounds
            data = self.buffer.param_data[b]
            self._gathering[b] = self.gather.issue(self.gather_comm, data, bounds, "engine_param_gather")
            self._gathers += 1

    def wait_params(self, b: int) -> None:
        """Wait for bucket ``b``'s parameter all-gather, if one is in flight."""
        inflight = self._gathering[b]
        if inflight is not None:
            self._gathering[b] = None
            self._gathers -= 1
            inflight.wait()

    def wait_buckets(self, buckets: Sequence[int]) -> None:
        if self._gathers:
            for b in buckets:
                self.wait_params(b)

    def wait_all(self) -> None:
        """Wait for every collective in flight: reductions, then all-gathers."""
        while self._reducing:
            self._finish_oldest()
        self.wait_buckets(range(len(self._gathering)))

    @property
    def in_flight(self) -> int:
        return len(self._reducing) + self._gathers
