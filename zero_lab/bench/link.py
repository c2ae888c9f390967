"""``python train.py`` on two "nodes" joined by a slowed link: what crosses it, measured two ways.

A job of ``2 × ranks_per_node`` ranks runs as one ``torchrun`` per node (:class:`~zero_lab.bench.netns.TwoNodes`:
``--nnodes 2 --node_rank k``, static rendezvous at node 0's veth address, ``GLOO_SOCKET_IFNAME``
the node's veth, so every Gloo connection between the nodes crosses the rate-limited veth and
those inside a node go over its loopback). torchrun's ``LOCAL_WORLD_SIZE`` tells the app which
ranks share a node, so summary.json splits each phase's sent bytes into intra- and inter-node.

**Bytes per step, counted by the kernel.** The veth's ``tx_bytes`` on both ends over a whole job
include start-up (rendezvous, the first parameter broadcast, process-group set-up); the same job
run for ``short`` and ``long`` steps differs only by ``long - short`` training steps, so

    crossed per step = (crossed(long) - crossed(short)) / (long - short)

— both directions, with TCP/IP and Ethernet headers (≈ 0.1 % at the veth's 65,000-byte MTU) and
the few bytes of each step's metric reductions. Usage::

    with TwoNodes.create(rate_mbit=200) as nodes:
        m = measure_link(nodes, ["optim=zero_adam", "grad_reduce=reduce_scatter", "dist.shard_size=node"],
                         short=2, long=5, root=Path("/tmp/link"))
        m.crossed_per_step, m.app_inter_node_per_step, m.step_time_s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from zero_lab.app.record.run_files import COMMAND, SUMMARY_FILE
from zero_lab.app.workloads.models import MLP
from zero_lab.bench.hardware import load_hardware
from zero_lab.bench.netns import TwoNodes
from zero_lab.collective_cost import Hardware, Link
from zero_lab.partition import Flat, ParamSpec
from zero_lab.planner import specs_from_module
from zero_lab.step_model import ModeledStrategy, predict_step

__all__ = [
    "CONFIGS",
    "JobResult",
    "LinkConfig",
    "LinkMeasurement",
    "app_inter_node_bytes",
    "app_metered_phases",
    "link_hardware",
    "measure_link",
    "mlp_specs",
    "predict_link",
    "run_two_nodes",
]

REPO = Path(__file__).resolve().parents[2]
_PORT = 29531  # inside node 0's namespace: nothing else listens there


@dataclass(frozen=True)
class JobResult:
    """One two-node job: its summary.json and the bytes each end of the veth sent during it."""

    summary: dict[str, Any]
    crossed: tuple[int, int]
    run_dir: Path


def run_two_nodes(
    nodes: TwoNodes,
    overrides: Sequence[str],
    run_dir: Path,
    ranks_per_node: int = 2,
    timeout_s: float = 600,
    env: Mapping[str, str] | None = None,
) -> JobResult:
    """``torchrun ... train.py *overrides hydra.run.dir=run_dir`` on both nodes (``env``: the environment,
    this process's by default); a ``RuntimeError`` with the output's tail when either node's torchrun
    fails or the time runs out."""
    before = nodes.crossed()
    processes = []
    for node in (0, 1):
        node_env = {**(os.environ if env is None else env), "GLOO_SOCKET_IFNAME": nodes.devices[node]}
        argv = [
            str(Path(sys.executable).with_name("torchrun")),
            "--nnodes=2",
            f"--nproc_per_node={ranks_per_node}",
            f"--node_rank={node}",
            f"--master_addr={nodes.address(0)}",
            f"--master_port={_PORT}",
            str(REPO / COMMAND[1]),  # train.py
            *overrides,
            f"hydra.run.dir={run_dir}",
        ]
        processes.append(nodes.popen(node, argv, env=node_env, cwd=REPO))
    outputs = []
    for node, process in enumerate(processes):
        try:
            out, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"node {node}'s torchrun ran past {timeout_s:.0f} s ({' '.join(overrides)})") from error
        outputs.append(out.decode(errors="replace"))
        if process.returncode:
            raise RuntimeError(f"node {node}'s torchrun exited {process.returncode}: {outputs[-1][-3000:]}")
    after = nodes.crossed()
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    return JobResult(summary, (after[0] - before[0], after[1] - before[1]), run_dir)


def app_inter_node_bytes(summary: dict[str, Any]) -> int | None:
    """The bytes per step the app metered as inter-node, summed over ranks and phases (``None``: unmetered)."""
    links = summary.get("bytes_per_link") or {}
    phases = [v for v in links.values() if v]
    if not phases:
        return None
    return round(sum(sum(phase["inter_node"]) for phase in phases))


def app_metered_phases(summary: dict[str, Any]) -> list[str]:
    """The phases whose bytes summary.json splits by link (``grad_reduce`` is null when the app does not meter it)."""
    return [name for name, links in (summary.get("bytes_per_link") or {}).items() if links]


@dataclass(frozen=True)
class LinkMeasurement:
    """One configuration measured at two run lengths (see the module docstring)."""

    overrides: tuple[str, ...]
    short: JobResult
    long: JobResult
    steps: tuple[int, int]

    @property
    def crossed_per_step(self) -> float:
        """Bytes per training step through the veth, both directions (the kernel's count)."""
        extra = sum(self.long.crossed) - sum(self.short.crossed)
        return extra / (self.steps[1] - self.steps[0])

    @property
    def app_inter_node_per_step(self) -> int | None:
        return app_inter_node_bytes(self.long.summary)

    @property
    def step_time_s(self) -> float | None:
        """The long run's median step time (summary.json's ``step_time_s``)."""
        return self.long.summary.get("step_time_s")


def measure_link(
    nodes: TwoNodes,
    overrides: Sequence[str],
    short: int,
    long: int,
    root: Path,
    ranks_per_node: int = 2,
    timeout_s: float = 600,
    env: Mapping[str, str] | None = None,
) -> LinkMeasurement:
    """The job ``overrides`` at ``steps=short`` and ``steps=long`` on ``nodes`` (run dirs under ``root``)."""
    if not 0 < short < long:
        raise ValueError(f"short={short}, long={long}: need 0 < short < long")
    results = []
    for steps in (short, long):
        run_dir = root / f"steps{steps}"
        results.append(run_two_nodes(nodes, [*overrides, f"steps={steps}"], run_dir, ranks_per_node, timeout_s, env))
    return LinkMeasurement(tuple(overrides), results[0], results[1], (short, long))


def link_hardware(rate_mbit: float, ranks_per_node: int = 2, base: str = "gloo_local") -> Hardware:
    """The two-node host as the step model sees it: ``base``'s compute and (one-node) Gloo link inside
    a node, and between nodes the veth's ``rate_mbit`` per direction shared by the node's ranks
    (``inter`` = rate / ranks per node: a ring that leaves the node through every rank's share moves
    the whole rate, as the model's ``m × inter`` says). The per-collective fits of ``base`` are
    left out (the crowded worlds' too, their compute rates kept): they were measured inside one host
    and would price inter-node collectives too. The
    veth limits each direction on its own, so a rank's sends and receives run at once (``duplex``)."""
    local = load_hardware(base)
    share = rate_mbit * 1e6 / 8 / ranks_per_node
    return replace(
        local,
        name=f"{local.name}+veth {rate_mbit:g} Mbit/s",
        ranks_per_node=ranks_per_node,
        inter=Link(local.intra.alpha_s, share),
        duplex=True,
        collectives={},
        crowded={m: replace(world, collectives={}) for m, world in local.crowded.items()},
        sources={
            **local.sources,
            "inter": f"tbf rate {rate_mbit:g} Mbit/s on each end of the veth (zero_lab.bench.netns)",
        },
    )


def mlp_specs(in_dim: int = 256, hidden: int = 512, out_dim: int = 256, depth: int = 4) -> list[ParamSpec]:
    """The ``model=mlp`` job's parameters (the default sizes), built on the meta device."""
    with torch.device("meta"):
        return specs_from_module(MLP(in_dim, hidden, out_dim, depth))


def predict_link(
    strategy: ModeledStrategy,
    hardware: Hardware,
    world_size: int,
    shard_size: int,
    samples_per_rank: int,
    specs: Sequence[ParamSpec],
) -> tuple[float, float]:
    """``(step seconds, bytes per step through the link, both directions)``: the model's average
    inter-node bytes per rank times ``world_size`` (every byte a rank puts on the inter-node link
    crosses it once)."""
    prediction = predict_step(specs, strategy, hardware, world_size, samples_per_rank, shard_size)
    return prediction.seconds, prediction.inter_bytes * world_size


@dataclass(frozen=True)
class LinkConfig:
    """One way to train that the link benchmark runs at ``S`` = a node and ``S`` = W: the overrides
    (beside ``dist.shard_size``) and the step model's strategy for the same step."""

    name: str
    overrides: tuple[str, ...]
    strategy: ModeledStrategy


#: ``train.py`` on the default MLP (global batch 32), ZeRO over flat buffers, parameters all-gathered.
CONFIGS: dict[str, LinkConfig] = {
    c.name: c
    for c in (
        LinkConfig(
            "ddp_path",
            ("optim=zero_adam", "partitioner=flat", "grad_reduce=reduce_scatter", "exchange=all_gather"),
            ModeledStrategy(
                "ddp_path",
                "DDP + ZeRO-Adam, p2p reduce-scatter, all-gather",
                Flat,
                grad_reduce="reduce_scatter",
                exchange="all_gather",
            ),
        ),
        LinkConfig(
            "engine",
            # the modes named: the engine's default on one host is shared memory, which the namespaced
            # "nodes" (one host) would use between them, bypassing the slowed link this measures
            ("dp=zero_lab", "optim=adam", "partitioner=flat", "grad_reduce=reduce_scatter", "exchange=all_gather"),
            ModeledStrategy(
                "engine",
                "engine, owned buffers: p2p reduce-scatter (its grad_reduce on Gloo), all-gather",
                Flat,
                grad_reduce="reduce_scatter",
                exchange="all_gather",
                release_grads=True,
            ),
        ),
    )
}
#: Rows each rank's forward sees per step in those jobs (``data=regression``'s global batch 32 over 4 ranks).
SAMPLES_PER_RANK = 8
