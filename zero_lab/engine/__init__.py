"""zero_lab's own data-parallel engine: ZeRO-2 on parameter and gradient buffers it owns.

Three small modules, each with one job (Megatron-Core's ``distributed/`` split):
:mod:`~zero_lab.engine.layout` (pure: buckets, owners, the memory bound),
:mod:`~zero_lab.engine.buffer` (parameters and gradients as views of per-bucket buffers),
:mod:`~zero_lab.engine.bucket_group` (each bucket's reduction and all-gather), and the wrapper
:class:`ShardedDataParallel` (:mod:`~zero_lab.engine.wrapper`) that ties them to a module and an
optimizer; around them, one module per feature: :mod:`~zero_lab.engine.clip` (``clip_grad_norm_``),
:mod:`~zero_lab.engine.state` (the optimizer's state per parameter: checkpoints and DCP),
:mod:`~zero_lab.engine.main_params` (fp32 main copies and gradients for bf16 parameters),
:mod:`~zero_lab.engine.whole` (whole matrices for Muon, each stepped by its owner).
"""

from zero_lab.engine.wrapper import ShardedDataParallel, default_modes, engine_of

__all__ = ["ShardedDataParallel", "default_modes", "engine_of"]
