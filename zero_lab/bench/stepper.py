"""One strategy's model and optimizer, stepped and timed one iteration at a time.

An iteration is ``zero_grad``, a barrier, ``forward + backward``, ``optimizer.step()``
(skipped when the strategy steps inside backward: zero_lab's overlap hooks). Times are
``perf_counter`` on this rank; the local optimizer's own ``step()`` is timed with step
hooks, so *exchange* = ``step()`` − local step (the parameter exchange plus the
wrapper's bookkeeping). zero_lab strategies also report their metered collectives
(``comm_stats``: calls, bytes, seconds in flight, seconds exposed).

With ``step_deferred`` (``prefetch_exchange``: ``step()`` only issues the exchange and
the next forward waits for it) the iteration is cut one step later: barrier,
``step()`` of the previous iteration's gradients, ``zero_grad``, ``forward + backward``.
Same work per iteration, but the exchange in flight meets its own forward inside the
timed window, and nothing of it leaks into the next strategy's iteration (strategies
are stepped round-robin; a barrier would otherwise drain it untimed). :meth:`finish`
takes the last pending step, so after N iterations the parameters had N updates, as
every other strategy's::

    runner = STRATEGIES["zl_sg_bv"].build(template)
    record = runner.iteration(x, y, F.mse_loss)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from zero_lab.comm import CommStats
from zero_lab.measure import optimizer_state_bytes

__all__ = ["Runner", "StepRecord", "max_abs_diff"]


@dataclass
class StepRecord:
    """One iteration of one strategy on this rank (seconds, bytes)."""

    iter_s: float
    step_s: float
    local_s: float
    exchange_bytes: int
    exchange_calls: int
    metered_s: float
    exposed_s: float


@dataclass
class Runner:
    """A model (``forward`` wraps it: DDP, FSDP2) and its optimizer.

    ``local`` is the optimizer that does the arithmetic (a sharded wrapper's ``.optim``);
    ``comm_stats`` reads zero_lab's own collective meter (``None``: not metered here);
    ``imbalance`` is the partition's max / ideal elements per rank (``None``: not sharded
    by a partition); ``report`` returns what the optimizer says about itself (zero_lab's
    exchange choice); ``on_close`` breaks reference cycles (hooks) so ``del`` frees memory;
    ``step_deferred`` and ``settle`` (wait for an exchange in flight): see the module docstring.
    ``backward``: what backpropagates the loss when it is not ``loss.backward()`` (DeepSpeed's
    ``engine.backward``, which also reduces the last gradient buckets). ``grad_stats`` reads
    zero_lab's meter of its gradient reduction where the profiler cannot see all of it: with
    ``shard_size`` < W, the hook issues the replica all-reduce from its worker thread, which the
    profiler does not follow.
    """

    model: nn.Module
    forward: nn.Module
    optimizer: Any
    local: torch.optim.Optimizer
    comm_stats: Callable[[], CommStats] | None = None
    steps_in_backward: bool = False
    imbalance: float | None = None
    report: Callable[[], dict[str, Any]] | None = None
    on_close: list[Callable[[], None]] = field(default_factory=list)
    step_deferred: bool = False
    settle: Callable[[], None] | None = None
    backward: Callable[[torch.Tensor], None] | None = None  # how the loss is backpropagated (default: .backward())
    grad_stats: Callable[[], CommStats] | None = None
    _grads_pending: bool = field(default=False, init=False, repr=False)
    _local_s: float = field(default=0.0, init=False, repr=False)
    _local_start: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.local.register_step_pre_hook(self._pre)
        self.local.register_step_post_hook(self._post)

    def _pre(self, *_: Any) -> None:
        self._local_start = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self._local_s += time.perf_counter() - self._local_start

    def _stats(self) -> CommStats:
        return self.comm_stats().snapshot() if self.comm_stats else CommStats()

    def iteration(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor]) -> StepRecord:
        if not self.step_deferred:
            self.optimizer.zero_grad(set_to_none=True)
        self._local_s = 0.0
        before = self._stats()
        dist.barrier()
        start = time.perf_counter()
        if self.step_deferred:
            self._step_pending()
            middle = time.perf_counter()
            self.optimizer.zero_grad(set_to_none=True)
            self._backward(loss_fn(self.forward(x), y))  # forward pre-hooks wait for the exchange, module by module
            self._grads_pending = True
            self._settle()  # normally a no-op: the forward used every parameter
            end = time.perf_counter()
            step_s, local_s = middle - start, self._local_s
        else:
            self._backward(loss_fn(self.forward(x), y))
            middle = time.perf_counter()
            local_in_backward = self._local_s
            if not self.steps_in_backward:  # with overlap, step() is a no-op that warns
                self.optimizer.step()
            end = time.perf_counter()
            step_s, local_s = end - middle, self._local_s - local_in_backward
        moved = self._stats().since(before)
        return StepRecord(
            iter_s=end - start,
            step_s=step_s,
            local_s=local_s,
            exchange_bytes=moved.bytes,
            exchange_calls=moved.calls,
            metered_s=moved.seconds,
            exposed_s=moved.exposed_seconds,
        )

    def _backward(self, loss: torch.Tensor) -> None:
        if self.backward is None:
            loss.backward()
        else:
            self.backward(loss)

    def _step_pending(self) -> None:
        if self._grads_pending:
            self.optimizer.step()
            self._grads_pending = False

    def _settle(self) -> None:
        if self.settle is not None:
            self.settle()

    def finish(self) -> None:
        """Take a deferred step still pending and wait for its exchange (collective; no-op otherwise)."""
        self._step_pending()
        self._settle()

    def close(self) -> None:
        """Break reference cycles that would keep this strategy's tensors alive after ``del``."""
        for action in self.on_close:
            action()
        self.on_close.clear()

    def state_bytes(self) -> int:
        """Bytes of this rank's optimizer state (its shard, for sharded strategies)."""
        return optimizer_state_bytes(self.local)

    def tensor_bytes(self) -> int:
        """Parameters + gradients + optimizer state on this rank, counted once per distinct storage."""
        tensors = [p for p in self.model.parameters()] + [p.grad for p in self.model.parameters()]
        tensors += [v for s in self.local.state.values() for v in s.values() if torch.is_tensor(v)]
        storages: dict[int, int] = {}
        for tensor in tensors:
            if tensor is not None:
                storage = (tensor.to_local() if isinstance(tensor, DTensor) else tensor).untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())


@torch.no_grad()
def max_abs_diff(a: nn.Module, b: nn.Module) -> float:
    """Largest elementwise difference of two models' parameters (collective for ``DTensor``\\ s)."""

    def full(p: torch.Tensor) -> torch.Tensor:
        return p.full_tensor() if isinstance(p, DTensor) else p

    return max((full(p) - full(q)).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
