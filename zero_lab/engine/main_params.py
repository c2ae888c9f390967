"""fp32 main parameters and gradients for the owned ranges of bf16 / fp16 buckets.

With low-precision parameters the engine keeps, for each bucket range this rank owns, an fp32
*main* copy (Megatron-Core's distributed optimizer, ZeRO's master weights):

* the optimizer steps the main copy, not the bf16 view (:func:`main_tensors`);
* a bucket's reduced gradient (reduced in the parameters' dtype, as DDP reduces them) is cast
  into the main copy's fp32 ``.grad``, and a second synchronised backward before the step adds to
  it in fp32 (:func:`accumulate_grad`);
* after the step the main copy is rounded into the bf16 view (:func:`write_back`), which the
  all-gather then sends.

fp32 (and fp64) buckets are stepped in place on the view: their main tensor *is* the view.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["LOW_PRECISION", "accumulate_grad", "main_copy_bytes", "main_tensors", "write_back", "write_main"]

LOW_PRECISION = (torch.bfloat16, torch.float16)


def main_tensors(owned: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """The tensor the optimizer steps for each owned view: an fp32 copy of a low-precision one, else the view."""
    return [view.detach().float() if view is not None and view.dtype in LOW_PRECISION else view for view in owned]


def main_copy_bytes(owned: Sequence[torch.Tensor | None], main: Sequence[torch.Tensor | None]) -> int:
    """Bytes of the fp32 main copies (0 when every bucket is fp32: the views are stepped in place)."""
    return sum(m.numel() * m.element_size() for v, m in zip(owned, main) if m is not None and m is not v)


def accumulate_grad(main: torch.Tensor, reduced: torch.Tensor, into: torch.Tensor) -> None:
    """Make ``reduced`` (this rank's reduced gradient, in the bucket's dtype) ``main``'s gradient, copied
    into ``into`` (a persistent tensor of ``main``'s dtype: fp32 for a low-precision bucket), or add it
    to the gradient there, in that dtype."""
    if main.grad is None:
        main.grad = into.copy_(reduced)
    else:
        main.grad.add_(reduced)


@torch.no_grad()
def write_main(owned: Sequence[torch.Tensor | None], main: Sequence[torch.Tensor | None]) -> None:
    """Set every fp32 main copy from its view (after the parameters were loaded)."""
    for view, copy in zip(owned, main):
        if view is not None and copy is not None and copy is not view:
            copy.copy_(view)


@torch.no_grad()
def write_back(owned: Sequence[torch.Tensor | None], main: Sequence[torch.Tensor | None]) -> None:
    """Round every fp32 main copy into its low-precision view (after the step, before the all-gather)."""
    for view, copy in zip(owned, main):
        if view is not None and copy is not None and copy is not view:
            view.copy_(copy)
