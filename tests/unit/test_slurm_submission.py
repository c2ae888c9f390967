"""A Slurm submission that fails, said in one line (zero_lab/app/launch/slurm.py), without
Slurm: sbatch's stderr as submitit hands it over, a missing sbatch, jobs already queued.
The same line from a real sbatch is asserted in tests/slurm/test_sbatch_scripts.py."""

from __future__ import annotations

from types import SimpleNamespace

from submitit.core.utils import FailedJobError

from zero_lab.app.launch.slurm import sbatch_reason, submission_failure

PARTITION = (
    "sbatch: error: invalid partition specified: nope\n"
    "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
)
NO_CONFIG = (
    "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
    "sbatch: error: fetch_config: DNS SRV lookup failed\n"
    "sbatch: fatal: Could not establish a configuration source\n"
)


def test_sbatchs_reason_is_its_fatal_line_else_its_last_two_errors():
    assert sbatch_reason(NO_CONFIG) == "sbatch: fatal: Could not establish a configuration source"
    assert sbatch_reason(PARTITION) == (
        "sbatch: error: invalid partition specified: nope; "
        "Batch job submission failed: Invalid partition name specified"
    )
    assert sbatch_reason("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy\n") == (
        "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy"
    )
    assert sbatch_reason("") == "no reason given"


def test_a_failed_submission_names_the_jobs_and_those_already_queued():
    line = submission_failure(FailedJobError(PARTITION), [2, 3], [SimpleNamespace(job_id="41_0")])
    assert line == (
        "job(s) #2, #3 not submitted: sbatch refused it: sbatch: error: invalid partition specified: nope; Batch job "
        "submission failed: Invalid partition name specified; already submitted and still queued or running: "
        "Slurm job(s) 41 (scancel 41)"
    )
    assert "\n" not in line


def test_a_missing_sbatch_says_where_to_run():
    assert submission_failure(FileNotFoundError(2, "No such file", "sbatch"), [0], []) == (
        "job(s) #0 not submitted: sbatch not found: hydra/launcher=slurm submits with Slurm's sbatch; run on a "
        "Slurm login node"
    )
