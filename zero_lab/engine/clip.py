"""The engine's gradient clipping: the global norm from the owned gradients, one all-reduce.

After the reductions each rank holds only the gradients it owns (its range of every bucket), and
the ranges tile the model. :func:`clip_grad_norm_` gives the total norm and the clipping of
``torch.nn.utils.clip_grad_norm_`` over the module's (DDP-reduced) gradients::

    norm = clip_grad_norm_(buffer, comm, max_norm=1.0)   # after finish_grad_sync, before step

Algorithm (torch's: one norm per parameter, then the norm of those norms, in registration order):

1. each rank cuts its owned gradient of every bucket at the parameter boundaries
   (:func:`~zero_lab.engine.layout.owned_pieces`) and takes each piece's ``norm_type`` norm (``torch._foreach_norm``,
   torch's kernel);
2. one all-reduce of a vector with two entries per trainable parameter: the norm of a parameter
   one rank owns whole (the other ranks add zeros, so the sum *is* that norm, bitwise torch's),
   and the sum of p-th powers of the pieces of a parameter that straddles ranks (``Flat``: its
   norm is that sum's p-th root, equal to torch's to rounding). For ``inf`` the vector holds the
   pieces' maxima and is reduced with MAX (exact either way);
3. the total is ``vector_norm`` of the per-parameter norms, and every owned gradient is scaled by
   ``clamp(max_norm / (total + 1e-6), max=1)`` — torch's formula, so with a whole-parameter
   partitioner the clipped gradients are bitwise DDP + torch's clip.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from zero_lab.comm import Communicator
from zero_lab.engine.buffer import ParamAndGradBuffer
from zero_lab.engine.layout import Bucket, owned_pieces

__all__ = ["clip_grad_norm_"]


def _whole_somewhere(buckets: Sequence[Bucket], world_size: int) -> dict[int, bool]:
    """Per parameter in a bucket: whether one rank owns all of it (the same answer on every rank)."""
    return {
        index: any(a <= offset and offset + size <= z for a, z in bucket.bounds[:world_size])
        for bucket in buckets
        for index, offset, size in zip(bucket.params, bucket.offsets, bucket.sizes)
    }


@torch.no_grad()
def clip_grad_norm_(
    buffer: ParamAndGradBuffer,
    comm: Communicator,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
) -> torch.Tensor:
    """Clip the owned gradients (``buffer.main[b].grad``) to a global norm of ``max_norm``; returns
    the total norm before clipping, the same on every rank (see the module docstring)."""
    norm_type = float(norm_type)
    params = sorted(index for bucket in buffer.buckets for index in bucket.params)  # registration order
    slot = {index: i for i, index in enumerate(params)}
    pieces = [p for p in owned_pieces(buffer.buckets, comm.rank) if buffer.main[p.bucket].grad is not None]
    tensors = [buffer.main[p.bucket].grad[p.start : p.stop] for p in pieces]
    device = buffer.param_data[0].device if buffer.param_data else torch.device("cpu")
    dtype = tensors[0].dtype if tensors else torch.float32
    norms = torch._foreach_norm(tensors, norm_type) if tensors else []
    count = len(params)
    if norm_type == float("inf"):
        vector = torch.zeros(count, dtype=dtype, device=device)
        for piece, norm in zip(pieces, norms):
            vector[slot[piece.param]] = torch.maximum(vector[slot[piece.param]], norm)
        per_param = comm.all_reduce(vector, dist.ReduceOp.MAX, op="grad_norm")
    else:
        vector = torch.zeros(2 * count, dtype=dtype, device=device)
        for piece, norm in zip(pieces, norms):
            if piece.whole:
                vector[slot[piece.param]] = norm
            else:
                vector[count + slot[piece.param]] += norm.pow(norm_type)
        comm.all_reduce(vector, op="grad_norm")
        whole = _whole_somewhere(buffer.buckets, comm.world_size)
        straddling = torch.tensor([not whole[index] for index in params], device=device)
        per_param = torch.where(straddling, vector[count:].pow(1.0 / norm_type), vector[:count])
    total = torch.linalg.vector_norm(per_param, norm_type) if count else torch.zeros((), device=device)
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients is non-finite, so it cannot be clipped. "
            "Pass error_if_nonfinite=False to skip this check."
        )
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    grads = [main.grad for main in buffer.main if main is not None and main.grad is not None]
    if grads:
        torch._foreach_mul_(grads, coef.to(grads[0].device))
    return total
