"""Parameters that are views into an exchange buffer, yet serialize like separate tensors.

With ``parameters_as_bucket_view=True`` every parameter lives inside one contiguous buffer
per bucket, so the exchange is one collective per buffer. As plain views they would share
one storage, and safetensors (accelerate's default format, HF's ``save_pretrained``)
refuses a state dict whose tensors share a storage none of them covers ("found no suitable
name to keep for saving … None is covering the entire storage"), at save and at
``load_model``. Algorithm of :func:`standalone_view`: give each parameter *its own storage
object* over the same memory, through the buffer protocol (``torch.frombuffer`` of a
``memoryview`` of the buffer's bytes), whose deleter holds a reference to the buffer, so the
memory lives as long as any view of it. CPU only: on other devices the parameters stay plain
views (safetensors then refuses them: save with ``safe_serialization=False`` or build the
optimizer without bucket views). The exchange still writes the buffer and every parameter
sees it; a serializer sees one complete tensor per parameter.

    param.data = standalone_view(buffer, offset, param.data)
    reseat(exchange.buffers, params)   # before a step: parameters a client moved become views again
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["reseat", "standalone_view"]


def standalone_view(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """Elements ``[offset, offset + like.numel())`` of the 1-D contiguous ``buffer``, shaped
    like ``like``, as a tensor over a storage of its own that aliases the buffer's memory
    (and keeps it alive). Devices other than CPU, and empty tensors, get a plain view."""
    numel = like.numel()
    plain = buffer[offset : offset + numel].view_as(like)
    if numel == 0 or buffer.device.type != "cpu":
        return plain
    item = buffer.element_size()
    memory = memoryview(buffer.detach().view(torch.uint8).numpy())[offset * item : (offset + numel) * item]
    return torch.frombuffer(memory, dtype=torch.uint8).view(buffer.dtype).view(like.shape)


def _inside(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    start = buffer.data_ptr()
    return start <= tensor.data_ptr() < start + buffer.numel() * buffer.element_size()


def reseat(buffers: Sequence[Any], params: Sequence[torch.Tensor]) -> list[int]:
    """Make every parameter a view of its exchange buffer again; returns the indices re-seated.

    A client that moves the model after the optimizer built its buffers (accelerate's
    ``prepare`` calls ``model.to("cpu:0")``, which copies) leaves the parameters in new
    tensors the exchange no longer writes: the ranks would drift apart. Each ``buffers``
    entry has ``storage`` (the 1-D buffer, or ``None`` without views) and ``pieces``
    (``param``, ``offset``: whole parameters). A parameter outside its buffer has its
    current values copied into the buffer and becomes a :func:`standalone_view` of it; one
    on another device than its buffer is refused (build the optimizer after moving the model).
    """
    moved = []
    for buffer in buffers:
        storage = getattr(buffer, "storage", None)
        if storage is None:
            continue
        for piece in buffer.pieces:
            param = params[piece.param]
            if _inside(param.data, storage):
                continue
            if param.device != storage.device:
                raise RuntimeError(
                    f"parameter #{piece.param} moved to {param.device} after ZeroRedundancyOptimizer built its bucket "
                    f"views on {storage.device}; construct the optimizer after moving the model"
                )
            with torch.no_grad():
                storage[piece.offset : piece.offset + param.numel()].copy_(param.data.reshape(-1))
            param.data = standalone_view(storage, piece.offset, param.data)
            moved.append(piece.param)
    return moved
