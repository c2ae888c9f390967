"""Hardware profiles for the step model: YAML files in ``zero_lab/bench/profiles/``, or any path.

A profile names a :class:`~zero_lab.collective_cost.Hardware`'s figures and where each comes
from (``sources``: a URL or document per figure, or the calibration command that measured
it). The shipped ones: ``h100_ib`` and ``a100_hdr`` (published bandwidths), ``gloo_local``
(this machine's Gloo, fitted by ``python scripts/calibrate.py``)::

    hardware = load_hardware("h100_ib")          # or load_hardware("my_cluster.yaml")
    profile_names()                              # ['a100_hdr', 'gloo_local', 'h100_ib']

Keys: ``name``, ``ranks_per_node``, ``matmul_flops``, ``memory_bandwidth``,
``links: {intra: {alpha_s, bus_bandwidth}, inter: {...}}``, ``sources`` (required); optional
``overlap``, ``algorithm``, ``cores``, ``duplex``, ``collectives: {op: {alpha_s, bus_bandwidth}}``,
``large_from_bytes`` and ``large_collectives: {op: ...}`` (the fits of messages from that size on),
``crowded: {W: {collectives: {op: ...}, large_collectives, matmul_flops, memory_bandwidth}}`` (worlds
of more ranks than ``cores`` as measured, :class:`~zero_lab.collective_cost.Crowded`; each key optional),
``description``, ``measured`` (the calibration's raw figures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from zero_lab.collective_cost import Crowded, Hardware, Link
from zero_lab.step_model import P2P_REDUCE_SCATTER

__all__ = ["OLD_P2P_NOTE", "PROFILE_DIR", "hardware_from_dict", "load_hardware", "profile_names"]

PROFILE_DIR = Path(__file__).parent / "profiles"
_REQUIRED = ("name", "ranks_per_node", "matmul_flops", "memory_bandwidth", "links", "sources")
_OPTIONAL = (
    "overlap",
    "algorithm",
    "cores",
    "duplex",
    "collectives",
    "large_from_bytes",
    "large_collectives",
    "crowded",
    "description",
    "measured",
)
_CROWDED = ("collectives", "large_collectives", "matmul_flops", "memory_bandwidth")
#: ``sources.p2p_reduce_scatter`` of a calibrated profile measured before that op was.
OLD_P2P_NOTE = (
    "not measured (a calibration older than the op): grad_reduce=reduce_scatter is priced as one send_recv "
    "of the busiest rank's bytes, leaving out its receive buffers and adds; run scripts/calibrate.py again"
)


def profile_names() -> list[str]:
    """The shipped profiles, by name (``--hardware`` takes these, or a YAML path)."""
    return sorted(path.stem for path in PROFILE_DIR.glob("*.yaml"))


def _link(where: str, data: Any) -> Link:
    if not isinstance(data, dict) or set(data) != {"alpha_s", "bus_bandwidth"}:
        raise ValueError(f"{where} must be a mapping with exactly alpha_s and bus_bandwidth, got {data!r}")
    return Link(float(data["alpha_s"]), float(data["bus_bandwidth"]))


def _fits(where: str, data: Any) -> dict[str, Link]:
    """A mapping of op to its fit (``collectives``, ``large_collectives``); absent is empty."""
    return {op: _link(f"{where}.{op}", v) for op, v in (data or {}).items()}


def _crowded(where: str, data: Any) -> dict[int, Crowded]:
    """``crowded``'s mapping of world size to :class:`Crowded`; a ``ValueError`` naming the key."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must map a world size to its measured figures, got {data!r}")
    out = {}
    for size, world in data.items():
        if not isinstance(world, dict) or set(world) - set(_CROWDED):
            raise ValueError(f"{where}.{size} must be a mapping of some of {_CROWDED}, got {world!r}")
        fits = _fits(f"{where}.{size}.collectives", world.get("collectives"))
        large = _fits(f"{where}.{size}.large_collectives", world.get("large_collectives"))
        rates = {key: float(world[key]) for key in ("matmul_flops", "memory_bandwidth") if world.get(key) is not None}
        out[int(size)] = Crowded(fits, large_collectives=large, **rates)
    return out


def hardware_from_dict(data: dict[str, Any], where: str = "profile") -> Hardware:
    """A :class:`Hardware` from a profile's mapping; every missing or unknown key named at once."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a hardware profile is a mapping, got {type(data).__name__}")
    problems = [f"missing key {key!r}" for key in _REQUIRED if key not in data]
    problems += [f"unknown key {key!r}" for key in data if key not in _REQUIRED + _OPTIONAL]
    links = data.get("links", {})
    if not isinstance(links, dict) or set(links) != {"intra", "inter"}:
        problems.append(
            f"links must name exactly intra and inter, got {sorted(links) if isinstance(links, dict) else links!r}"
        )
    if not isinstance(data.get("duplex", True), bool):
        problems.append(f"duplex must be true or false, got {data['duplex']!r}")
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))
    collectives = _fits(f"{where}: collectives", data.get("collectives"))
    sources = {str(k): str(v) for k, v in data["sources"].items()}
    if "send_recv" in collectives and P2P_REDUCE_SCATTER not in collectives:
        sources.setdefault(P2P_REDUCE_SCATTER, OLD_P2P_NOTE)
    return Hardware(
        name=str(data["name"]),
        ranks_per_node=int(data["ranks_per_node"]),
        intra=_link(f"{where}: links.intra", links["intra"]),
        inter=_link(f"{where}: links.inter", links["inter"]),
        matmul_flops=float(data["matmul_flops"]),
        memory_bandwidth=float(data["memory_bandwidth"]),
        overlap=float(data.get("overlap", 1.0)),
        algorithm=str(data.get("algorithm", "ring")),
        cores=int(data["cores"]) if data.get("cores") is not None else None,
        duplex=data.get("duplex", True),
        collectives=collectives,
        crowded=_crowded(f"{where}: crowded", data.get("crowded") or {}),
        large_from_bytes=int(data["large_from_bytes"]) if data.get("large_from_bytes") else None,
        large_collectives=_fits(f"{where}: large_collectives", data.get("large_collectives")),
        sources=sources,
    )


def load_hardware(name_or_path: str | Path) -> Hardware:
    """A shipped profile by name, or a profile YAML by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ValueError(
                f"--hardware {name_or_path!r}: no such profile; pick one of {profile_names()} or give a YAML path"
            )
    elif not path.is_file():
        raise ValueError(f"--hardware {str(name_or_path)!r}: no such file")
    return hardware_from_dict(yaml.safe_load(path.read_text()), where=str(path))
