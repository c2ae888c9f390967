"""Parameters that are views into an exchange buffer, yet serialize like separate tensors.

With ``parameters_as_bucket_view=True`` every parameter lives inside one contiguous buffer
per bucket, so the exchange is one collective per buffer. As plain views they would share
one storage, and safetensors (accelerate's default format, HF's ``save_pretrained``)
refuses a state dict whose tensors share a storage none of them covers ("found no suitable
name to keep for saving … None is covering the entire storage"), at save and at
``load_model``. Algorithm of :func:`standalone_view`: give each parameter *its own storage
object* over the same memory — on CPU through the buffer protocol (``torch.frombuffer`` of
a ``memoryview`` of the buffer's bytes), on CUDA through ``__cuda_array_interface__`` —
whose deleter holds a reference to the buffer, so the memory lives as long as any view of
it. The exchange still writes the buffer and every parameter sees it; a serializer sees
one complete tensor per parameter.

    param.data = standalone_view(buffer, offset, param.data)
"""

from __future__ import annotations

import torch

__all__ = ["standalone_view"]


class _CudaBytes:
    """``__cuda_array_interface__`` over bytes ``[start, stop)`` of a CUDA tensor (kept alive here)."""

    def __init__(self, tensor: torch.Tensor, start: int, stop: int):
        self.tensor = tensor
        self.__cuda_array_interface__ = {
            "shape": (stop - start,),
            "typestr": "|u1",
            "data": (tensor.data_ptr() + start, False),
            "version": 2,
            "strides": None,
        }


def standalone_view(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """Elements ``[offset, offset + like.numel())`` of the 1-D contiguous ``buffer``, shaped
    like ``like``, as a tensor over a storage of its own that aliases the buffer's memory
    (and keeps it alive). Devices other than CPU and CUDA, and empty tensors, get a plain view."""
    numel = like.numel()
    plain = buffer[offset : offset + numel].view_as(like)
    if numel == 0:
        return plain
    item = buffer.element_size()
    start, stop = offset * item, (offset + numel) * item
    raw = buffer.detach()
    if raw.device.type == "cpu":
        memory = memoryview(raw.view(torch.uint8).numpy())[start:stop]
        own = torch.frombuffer(memory, dtype=torch.uint8)
    elif raw.device.type == "cuda":
        own = torch.as_tensor(_CudaBytes(raw.view(torch.uint8), start, stop), device=raw.device)
    else:
        return plain
    return own.view(buffer.dtype).view(like.shape)
