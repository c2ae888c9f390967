"""Every private name of another library (torch, Hydra, OmegaConf, typing, the standard library)
that zero_lab's code uses, where, and why — one table, kept true by tests/unit/test_private_names.py.

A private name can change in any release of its library, without notice. So each use is listed
here with the reason no public API does the job, and the test (1) reads the whole package's
source (``ast``) and fails on a use of another library's private name that is missing here, or an
entry here that is no longer used; and (2) checks that each name still exists in the installed
release *and behaves as zero_lab relies on* (a signature, a return value, an order of events).
When a release breaks one, that test names it before a job does.

Entries: ``tokens`` are the private identifiers as the source spells them (what the scan finds:
an attribute, a ``getattr`` name, a private module imported or named);
``name`` the full path; ``modules`` the zero_lab modules that use it; ``instead`` the public API
that would do the job where one exists (and why it is not used yet), else ``""``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRIVATE_NAMES", "PrivateName"]


@dataclass(frozen=True)
class PrivateName:
    """One private name of another library and its uses in zero_lab (see the module docstring)."""

    library: str
    name: str
    tokens: tuple[str, ...]
    modules: tuple[str, ...]
    why: str
    instead: str = ""


PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(
        "torch",
        "torch.autograd.Variable._execution_engine.queue_callback",
        ("_execution_engine",),
        ("zero_lab.grad_reduce", "zero_lab.overlap"),
        "runs a function once the current backward pass has finished (after every gradient hook and "
        "DDP's own), on the backward's thread: where the gradient phase waits for its reductions and "
        "releases unowned gradients, and the overlap hook finishes its per-bucket steps. DDP itself "
        "finalises this way; torch has no public end-of-backward callback",
    ),
    PrivateName(
        "torch",
        "torch.distributed.distributed_c10d._get_default_store",
        ("_get_default_store",),
        ("zero_lab.state_server",),
        "the key-value store of the default process group, where each rank's shard-state server "
        "publishes its address, so a state_dict() on one rank (HF Trainer) can fetch the others' shards "
        "without a collective; torch exposes no public getter for the store init_process_group made",
    ),
    PrivateName(
        "torch",
        "torch.nn.parallel.DistributedDataParallel._bucket_config",
        ("_bucket_config",),
        ("zero_lab.ddp_buckets",),
        "the first-bucket cap a DDP module really uses (first_bucket_bytes_cap), so a partition can "
        "follow DDP's buckets; only bucket_bytes_cap is a public attribute. Read with getattr: without "
        "it (an older torch) the 1 MiB first bucket DDP then always used is assumed",
    ),
    PrivateName(
        "torch",
        "torch.nn.parallel.distributed._BucketCapacityConfig",
        ("_BucketCapacityConfig",),
        ("zero_lab.ddp_buckets",),
        "the installed torch's own rule turning bucket_cap_mb into DDP's two caps, so the buckets of a "
        "DDP not built yet are modelled exactly; read with getattr, the old fixed rule without it",
    ),
    PrivateName(
        "torch",
        "torch.distributed.checkpoint.state_dict._get_fqns",
        ("_get_fqns",),
        ("zero_lab.dcp",),
        "the name torch's DCP functions give a parameter (DDP's module. and torch.compile's _orig_mod. "
        "stripped), so zero_lab's DCP optimizer state is keyed exactly as get_model_state_dict keys "
        "the model; torch's public get_/set_optimizer_state_dict do not take a sharded optimizer",
    ),
    PrivateName(
        "torch",
        "torch._foreach_norm, torch._foreach_mul_",
        ("_foreach_norm", "_foreach_mul_"),
        ("zero_lab.engine.clip",),
        "the engine's sharded clip_grad_norm_ takes the norm of its owned pieces and scales every "
        "gradient with torch's multi-tensor kernels, as torch.nn.utils.clip_grad_norm_ does inside",
        "torch.nn.utils.get_total_norm and clip_grads_with_norm_ (public since torch 2.6; the "
        "optimizer's clip_grad_norm_ uses the latter)",
    ),
    PrivateName(
        "torch",
        "torch._dynamo.utils.counters",
        ("_dynamo",),
        ("zero_lab.app.run.finish",),
        "how many graphs torch.compile made on a rank (compile=true's closing line and summary); "
        "torch has no public counter of compiled graphs",
    ),
    PrivateName(
        "torch",
        "torch._dynamo",
        ("torch._dynamo",),
        ("zero_lab.runtime.spawn",),
        "imported once in the forkserver that test worlds and ranks fork from (the first DDP of a "
        "process imports it, about 0.85 s): preloading is an import, not a call into its internals",
    ),
    PrivateName(
        "torch",
        "torch._logging",
        ("torch._logging",),
        ("zero_lab.app.config.targets",),
        "only named: one of the torch modules a config's _target_ may not reach (their callables "
        "change process-wide state); nothing of it is imported or called",
    ),
    PrivateName(
        "python",
        "multiprocessing.forkserver._forkserver",
        ("_forkserver",),
        ("zero_lab.runtime.spawn",),
        "the process's forkserver (its pid, to know whether it runs and to stop it at exit); "
        "multiprocessing has no public handle on it",
    ),
    PrivateName(
        "python",
        "multiprocessing.forkserver.ForkServer._forkserver_pid",
        ("_forkserver_pid",),
        ("zero_lab.runtime.spawn",),
        "whether the forkserver was started, and the pid to end at exit",
    ),
    PrivateName(
        "python",
        "multiprocessing.forkserver.ForkServer._forkserver_alive_fd",
        ("_forkserver_alive_fd",),
        ("zero_lab.runtime.spawn",),
        "closed in each forked rank, so the forkserver ends with the job's process (it runs while any "
        "process holds that pipe) and its ranks with it",
    ),
    PrivateName(
        "torch",
        "torch.optim.lr_scheduler.SequentialLR._schedulers",
        ("_schedulers",),
        ("zero_lab.app.check.resume",),
        "the key under which a chained schedule's state_dict holds each scheduler's state (torch saves "
        "its private attribute as is); read to tell which scheduler= option fits a saved schedule",
    ),
    PrivateName(
        "torch",
        "DCP .metadata pickle globals",
        ("_MEM_FORMAT_ENCODING", "_StorageInfo", "_get_layout", "pathlib._local"),
        ("zero_lab.dcp_reader",),
        "the private globals a DCP .metadata pickle names (torch.distributed.checkpoint.metadata."
        "_MEM_FORMAT_ENCODING, ...filesystem._StorageInfo, torch.serialization._get_layout, Python 3.13's "
        "pathlib._local): the restricted unpickler allows exactly what the file holds, nothing else",
    ),
    PrivateName(
        "python",
        "os._exit",
        ("_exit",),
        ("zero_lab.runtime.spawn",),
        "public despite the underscore (documented in os): a rank ends without running atexit "
        "handlers or flushing torch/Gloo state a second time (FIELD-NOTES: the aborts at exit)",
    ),
)
