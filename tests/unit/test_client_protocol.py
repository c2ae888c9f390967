"""What training-loop clients see of the optimizer on one rank (issue 28): ``opt.state``,
state dicts that round trip, bucket views that safetensors saves and loads, DTensors refused."""

from __future__ import annotations

import pytest
import torch

from zero_lab import Flat, ZeroRedundancyOptimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    opt.zero_grad()
    model(torch.randn(5, 4, generator=torch.Generator().manual_seed(seed))).pow(2).mean().backward()
    opt.step()


@pytest.mark.parametrize("flat", [False, True])
def test_state_shows_the_shards_keyed_by_parameter(single_rank_group, flat):
    model = _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, partitioner=Flat() if flat else None, lr=0.1)
    assert not opt.state  # torchtitan's init_optim_state asks exactly this
    _step(model, opt, 0)
    assert list(opt.state) == list(model.parameters())
    for param in model.parameters():
        assert opt.state[param]["exp_avg"].numel() == param.numel()
        assert opt.state[param]["step"].item() == 1.0
    assert torch.nn.Parameter(torch.zeros(1)) not in opt.state


def test_state_dict_round_trips_and_equals_adamws(single_rank_group):
    model, plain_model = _model(), _model()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=0.1)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=0.1)
    for seed in range(3):
        _step(model, opt, seed)
        _step(plain_model, plain, seed)
    saved = opt.state_dict()  # W=1: the full state, no consolidate needed
    expected = plain.state_dict()
    assert saved["param_groups"] == expected["param_groups"]
    for index, state in expected["state"].items():
        assert all(torch.equal(saved["state"][index][key], value) for key, value in state.items())
    fresh_model = _model()
    fresh = ZeroRedundancyOptimizer(fresh_model.parameters(), torch.optim.AdamW, lr=0.1)
    fresh.load_state_dict(saved)
    fresh_model.load_state_dict(model.state_dict())
    _step(fresh_model, fresh, 9)
    _step(plain_model, plain, 9)
    assert all(torch.equal(a, b) for a, b in zip(fresh_model.parameters(), plain_model.parameters()))


@pytest.mark.parametrize("flat", [False, True])
def test_bucket_views_save_and_load_with_safetensors(single_rank_group, tmp_path, flat):
    """accelerate's save_state/load_state use safetensors' save_file/load_model on the model."""
    safetensors = pytest.importorskip("safetensors.torch", reason="safetensors comes with the [clients] extra")
    load_file, load_model, save_file, save_model = (
        safetensors.load_file,
        safetensors.load_model,
        safetensors.save_file,
        safetensors.save_model,
    )
    model = _model()
    opt = ZeroRedundancyOptimizer(
        model.parameters(), torch.optim.Adam, parameters_as_bucket_view=True, partitioner=Flat() if flat else None
    )
    _step(model, opt, 0)
    save_model(model, tmp_path / "model.safetensors")
    save_file(model.state_dict(), tmp_path / "plain.safetensors")
    expected = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    load_model(model, tmp_path / "model.safetensors")
    assert all(torch.equal(p, expected[name]) for name, p in model.named_parameters())
    assert all(torch.equal(t, expected[name]) for name, t in load_file(tmp_path / "plain.safetensors").items())
    _step(model, opt, 1)  # the parameters are still the exchange's buffer: training goes on
    assert not all(torch.equal(p, expected[name]) for name, p in model.named_parameters())


def test_dtensor_parameters_are_refused_by_name(single_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    weight = torch.nn.Parameter(distribute_tensor(torch.randn(3, 2), mesh, [Replicate()]))
    with pytest.raises(TypeError, match=r"DTensor parameter 'layer.weight' \(placements \(Replicate\(\),\).*FSDP2"):
        ZeroRedundancyOptimizer([("layer.weight", weight)], torch.optim.AdamW, lr=0.1)


def test_zero_factory_builds_zero_optimizers_of_the_named_class(single_rank_group):
    """torchtitan's recipe: ``zero_factory(resolve)`` maps each optimizer name to a ZeRO builder."""
    from zero_lab.clients import zero_factory

    names = {"AdamW": torch.optim.AdamW, "DistMuon": lambda groups, **kwargs: None}
    resolve = zero_factory(names.__getitem__, parameters_as_bucket_view=True)
    model = _model()
    opt = resolve("AdamW")([{"params": list(model.parameters()), "lr": 0.1, "foreach": False}])
    assert isinstance(opt, ZeroRedundancyOptimizer) and type(opt.optim) is torch.optim.AdamW
    assert opt.parameters_as_bucket_view and opt.param_groups[0]["lr"] == 0.1
    with pytest.raises(TypeError, match=r"optimizer 'DistMuon' is built by .* not a torch.optim.Optimizer class"):
        resolve("DistMuon")


class _Owner:
    """Stands in for an optimizer: what a shard-state server serves."""

    def collect_shard_states(self) -> dict[int, tuple[int, int, dict[str, torch.Tensor]]]:
        return {3: (0, 4, {"exp_avg": torch.arange(4.0)})}


def test_shard_state_server_serves_its_owner_and_names_an_unreachable_peer():
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    from zero_lab.state_server import ShardStateServer, fetch_shard_states

    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=5))
    owner = _Owner()
    server = ShardStateServer("zero_lab/test", 1, owner, store)
    server.start()
    try:
        got = fetch_shard_states(store, "zero_lab/test", 1)
        assert got.keys() == {3} and torch.equal(got[3][2]["exp_avg"], torch.arange(4.0))
    finally:
        server.stop()
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        store.set("zero_lab/test/2", f"127.0.0.1:{closed.getsockname()[1]}:token")
    with pytest.raises(RuntimeError, match=r"could not fetch rank 2's shard states from 127.0.0.1:\d+ .*barrier"):
        fetch_shard_states(store, "zero_lab/test", 2)
