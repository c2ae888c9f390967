"""Parameters and gradients as views of contiguous per-bucket buffers (the engine's storage).

:class:`ParamAndGradBuffer` owns, for every :class:`~zero_lab.engine.layout.Bucket`:

* ``param_data[b]`` — one tensor of ``bucket.numel`` elements on the parameters' device; every
  parameter of the bucket is re-seated as a view of its range (``param.data = ...``), so the
  owner's optimizer steps ``param_data[b][bounds[rank]]`` in place and the all-gather fills the
  rest in place: no proxy and no copy back;
* ``grad_data[b]`` — the bucket's gradient buffer, taken when its first gradient of a
  synchronised backward arrives and given back as soon as its reduction is done (what makes the
  engine ZeRO-2 at the peak: the unowned gradients live for about one bucket's reduction). The
  buffers come from a small pool per kind (device + dtype), each the size of the kind's largest
  bucket and reused step after step, so a step allocates nothing (fresh pages cost a fault each);
  the pool holds as many as were ever live at once, two in a feed-forward backward.
  Each gradient is written into its range multiplied by ``1/W`` (``torch.mul(..., out=)``, as
  DDP's reducer does), and the parameter's own ``.grad`` is released at once;
* ``owned_grad(b)`` — this rank's reduced gradients of bucket ``b``, one persistent tensor per
  bucket (Ψ/W in all), which becomes the ``.grad`` of the tensor the optimizer steps for its range
  (``main[b]``: the view, or for bf16 / fp16 its fp32 main copy, :mod:`~zero_lab.engine.main_params`).

What a rank holds of gradients is measured here, on the real tensors
(:meth:`ParamAndGradBuffer.held_grad_bytes`), and its peak kept in ``peak_grad_bytes``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zero_lab.engine.layout import Bucket
from zero_lab.engine.main_params import main_tensors

__all__ = ["ParamAndGradBuffer"]


class ParamAndGradBuffer:
    """The engine's parameter and gradient storage for this ``rank`` (see the module docstring)."""

    def __init__(self, params: Sequence[torch.Tensor], buckets: Sequence[Bucket], rank: int):
        self.params = list(params)
        self.buckets = tuple(buckets)
        self.rank = rank
        self.param_data: list[torch.Tensor] = []
        #: ``id(param) -> (bucket index, position in the bucket)``
        self.where: dict[int, tuple[int, int]] = {}
        for bucket in self.buckets:
            first = self.params[bucket.params[0]]
            data = torch.zeros(bucket.numel, dtype=first.dtype, device=first.device)
            for position, (index, offset, size) in enumerate(zip(bucket.params, bucket.offsets, bucket.sizes)):
                param = self.params[index]
                view = data[offset : offset + size]
                view.copy_(param.detach().reshape(-1))
                param.data = view.view_as(param)
                self.where[id(param)] = (bucket.index, position)
            self.param_data.append(data)
        self.grad_data: list[torch.Tensor | None] = [None] * len(self.buckets)
        self._taken: list[torch.Tensor | None] = [None] * len(self.buckets)  # the pool buffer grad_data[b] lies in
        self._live = 0  # entries of _taken that are not None
        self._pool: dict[str, list[torch.Tensor]] = {}  # free buffers per kind
        self._made: list[torch.Tensor] = []  # every pool buffer ever made
        self._largest = {b.kind: max(c.numel for c in self.buckets if c.kind == b.kind) for b in self.buckets}
        self._owned_grads: list[torch.Tensor | None] = [None] * len(self.buckets)
        #: the tensors the optimizer steps (this rank's range of each bucket); ``None`` where it owns nothing
        self.owned: list[torch.Tensor | None] = [
            data[slice(*bucket.bounds[rank])] if bucket.owned_numel(rank) else None
            for bucket, data in zip(self.buckets, self.param_data)
        ]
        #: what the optimizer steps for each owned range: the view, or its fp32 copy for bf16/fp16 (main_params)
        self.main: list[torch.Tensor | None] = main_tensors(self.owned)
        self.peak_grad_bytes = 0
        self._own_bytes = 0  # bytes of the pool's buffers and the owned gradients: only ever grows

    @property
    def live(self) -> int:
        """Bucket gradient buffers taken now (filling or being reduced)."""
        return self._live

    def grad_buffer(self, b: int) -> torch.Tensor:
        """Bucket ``b``'s gradient buffer, taken from the pool on first use (its padding zeroed)."""
        data = self.grad_data[b]
        if data is None:
            bucket = self.buckets[b]
            free = self._pool.setdefault(bucket.kind, [])
            if not free:
                like = self.param_data[b]
                free.append(torch.empty(self._largest[bucket.kind], dtype=like.dtype, device=like.device))
                self._made.append(free[-1])
                self._own_bytes += free[-1].numel() * free[-1].element_size()
            base = free.pop()
            data = base[: bucket.numel]
            data[bucket.offsets[-1] + bucket.sizes[-1] :].zero_()  # offsets increase: the tail is padding
            self.grad_data[b], self._taken[b] = data, base
            self._live += 1
            self.note_held()
        return data

    def owned_grad(self, b: int) -> torch.Tensor:
        """This rank's persistent gradient tensor of bucket ``b`` (shaped as its range)."""
        grad = self._owned_grads[b]
        if grad is None:
            main = self.main[b]
            assert main is not None, "a bucket this rank owns nothing of has no owned gradient"
            grad = self._owned_grads[b] = torch.empty_like(main)  # fp32 for a bf16 bucket (main_params)
            self._own_bytes += grad.numel() * grad.element_size()
        return grad

    def write_grad(self, b: int, position: int, grad: torch.Tensor | None, scale: float) -> None:
        """Put ``grad · scale`` (zeros for ``None``) into parameter ``position``'s range of bucket ``b``."""
        bucket = self.buckets[b]
        start = bucket.offsets[position]
        slot = self.grad_buffer(b)[start : start + bucket.sizes[position]]
        if grad is None:
            slot.zero_()
        else:
            torch.mul(grad.reshape(-1), scale, out=slot)

    def release(self, b: int) -> None:
        """Give bucket ``b``'s gradient buffer back to the pool (its reduction is done)."""
        base = self._taken[b]
        if base is not None:
            self._pool[self.buckets[b].kind].append(base)
            self._live -= 1
        self.grad_data[b] = self._taken[b] = None

    def held_grad_bytes(self) -> int:
        """Bytes of gradient tensors this rank holds now: the pool's buffers (taken or free), the owned
        gradients, and any ``.grad`` of the optimizer's tensors that is not one of them."""
        mine = [*self._made, *(g for g in self._owned_grads if g is not None)]
        ptrs = {t.data_ptr() for t in mine}
        other = [t.grad for t in self.main if t is not None and t.grad is not None and t.grad.data_ptr() not in ptrs]
        return sum(t.numel() * t.element_size() for t in [*mine, *other])

    def note_held(self, exact: bool = False) -> None:
        """Raise ``peak_grad_bytes`` to what is held now. Per bucket (``exact=False``) it counts only
        zero_lab's own tensors, kept as a running sum (O(1): the pool and the owned gradients only
        grow); once per step (``exact=True``) it also walks the optimizer's tensors for a ``.grad``
        set from outside (:meth:`held_grad_bytes`)."""
        held = self.held_grad_bytes() if exact else self._own_bytes
        self.peak_grad_bytes = max(self.peak_grad_bytes, held)
