"""torchtitan's OptimizersContainer with zero_lab: the two-line recipe (docs/clients.md), saved
and resumed through DCP as torchtitan's checkpointer does (``torchrun``, 2 ranks).

For the plain container (AdamW) and the ZeRO one: train 2 steps, ``dcp.save`` the model and the
container (its ``state_dict()`` runs ``init_optim_state``, which must not step an optimizer that
has state), train 2 more; then a fresh model + container ``dcp.load`` it and train the same 2.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP
from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig

from tests.clients.scripts.common import digest, finish, out_dir, write_result
from zero_lab.clients import zero_factory


class ZeroOptimizersContainer(OptimizersContainer):
    _resolve_optimizer_factory = staticmethod(zero_factory(OptimizersContainer._resolve_optimizer_factory))


CONFIG = OptimizersContainer.Config(
    param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-2})],
    implementation="for-loop",
)


def build(kind: str) -> tuple[DDP, OptimizersContainer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    container = (ZeroOptimizersContainer if kind == "zero" else OptimizersContainer)(CONFIG, model_parts=[model])
    return DDP(model), container


def train(ddp: DDP, container: OptimizersContainer, steps: range) -> None:
    for step in steps:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + dist.get_rank()))
        ddp(x).pow(2).mean().backward()
        container.step()
        container.zero_grad()


def main() -> None:
    dist.init_process_group("gloo")
    result = {}
    for kind in ("adamw", "zero"):
        ddp, container = build(kind)
        result[f"{kind}_class"] = type(container.optimizers[0]).__name__
        train(ddp, container, range(2))
        path = str(out_dir() / kind)
        dcp.save({"model": get_model_state_dict(ddp), "optimizer": container}, checkpoint_id=path)
        train(ddp, container, range(2, 4))
        result[kind] = digest(ddp)
        ddp, container = build(kind)
        state = {"model": get_model_state_dict(ddp), "optimizer": container}
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(ddp, state["model"])
        train(ddp, container, range(2, 4))
        result[f"{kind}_resumed"] = digest(ddp)
    write_result(result)
    finish()


if __name__ == "__main__":
    main()
