"""docs/own-model.md and docs/own-data.md run as written: their files are written into a project
outside the repository (``# my_project/<path>`` on a block's first line names the file), their
``bash`` command runs there with the environment's ``zero-lab-train``, and the output they quote is
what the app prints."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.runs import REPO, child_env, together

ENTRY = str(Path(sys.executable).with_name("zero-lab-train"))


def project_from(doc: Path, root: Path) -> tuple[Path, list[str], list[str]]:
    """Write the page's files under ``root``; return the project dir, its commands and quoted outputs."""
    text = doc.read_text()
    for _, body in re.findall(r"```(python|yaml)\n(.*?)```", text, re.S):
        first, _, rest = body.partition("\n")
        match = re.fullmatch(r"# (my_project/\S+)", first.strip())
        if match:
            path = root / match.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(rest)
    commands = [c.strip() for c in re.findall(r"```bash\n(.*?)```", text, re.S)]
    quoted = [q.strip() for q in re.findall(r"```text\n(zero_lab:.*?)```", text, re.S)]
    return root / "my_project", commands, quoted


def run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = re.sub(r"(^|\s)zero-lab-train(\s)", rf"\g<1>{ENTRY}\g<2>", command)
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=240
    )


PAGES = ("own-model.md", "own-data.md")


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[Path, list[str], list[str], subprocess.CompletedProcess[str]]]:
    """Each page's project written and its command run, both pages together (two at a time)."""
    made = {page: project_from(REPO / "docs" / page, tmp_path_factory.mktemp(page.split(".")[0])) for page in PAGES}
    done = together(*(functools.partial(run, commands[0], project) for project, commands, _ in made.values()))
    return {page: (*made[page], result) for page, result in zip(PAGES, done)}


@pytest.mark.parametrize("page", PAGES)
def test_the_bring_your_own_page_runs_as_written(page, pages):
    project, commands, quoted, done = pages[page]
    assert project.is_dir() and len(commands) == {"own-model.md": 2, "own-data.md": 1}[page]
    assert done.returncode == 0, done.stderr[-3000:]
    (summary_path,) = [p for p in project.glob("outputs/*/*/summary.json") if p.parent.name != "transformers"]
    summary = json.loads(summary_path.read_text())
    assert summary["steps"] == len(summary["losses"]) and summary["final_loss"] < summary["losses"][0]
    for text in quoted:  # a refusal the page shows: the same command without the key that fixes it
        fix = re.search(r"set (\S+=\S+)", text)
        assert fix, text
        refused = run(commands[0].replace(f" {fix.group(1)}", ""), project)
        assert refused.returncode == 2
        assert refused.stderr.strip() == text
        assert len([d for d in project.glob("outputs/*/*") if d.name != "transformers"]) == 1  # no run dir made


def test_a_stream_sharded_by_rank_resumes_exactly(pages, tmp_path):
    """own-data.md's stream (``batches(rank, world_size, start_step)``): a run resumed at step 3
    reads what the uninterrupted one read from there on, so it ends with the same parameters."""
    project, commands, _, _ = pages["own-data.md"]
    command = commands[0].replace("steps=30", "steps=6")
    whole, part = tmp_path / "whole", tmp_path / "part"
    halfway = command.replace("steps=6", "steps=3")
    first = together(
        functools.partial(run, f"{command} hydra.run.dir={whole}", project),
        functools.partial(run, f"{halfway} checkpoint_every=3 hydra.run.dir={part}", project),
    )
    assert all(r.returncode == 0 for r in first), first[1].stderr[-2000:]
    resumed = run(f"{command} resume={part} hydra.run.dir={tmp_path / 'resumed'}", project)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    original, again = (json.loads((d / "summary.json").read_text()) for d in (whole, tmp_path / "resumed"))
    assert again["start_step"] == 3 and again["losses"] == original["losses"]
    assert again["param_checksum"] == original["param_checksum"]


def test_the_own_model_example_balances_state_over_the_parameters_that_get_gradients(pages):
    """``aux`` never gets a gradient, so never state: the owners are balanced over the rest (issue
    30). Before, sorted-greedy priced ``aux`` (the largest matrix) and gave it all of rank 0's
    share, so rank 0 held no state at all: ``optim_state_bytes`` was ``[0.0, 44120.0]``."""
    project, _, _, done = pages["own-model.md"]
    assert done.returncode == 0, done.stderr[-3000:]
    (summary_path,) = project.glob("outputs/*/*/summary.json")
    state = json.loads(summary_path.read_text())["optim_state_bytes"]
    # Adam keeps exp_avg and exp_avg_sq (2 x 4 bytes per element) and a 4-byte step per parameter.
    # model.width=128: inp.weight 32x128 = 4096 elements is the largest used parameter; sorted-greedy
    # puts it alone on one rank, and the other five (out.weight 1024, three of 128, out.bias 8) on the other.
    assert state == [4096 * 8 + 4, (1024 + 3 * 128 + 8) * 8 + 5 * 4]


def test_a_transformers_class_named_in_yaml_trains_as_the_page_says(pages):
    """own-model.md's second command: ``model._target_: transformers.GPT2LMHeadModel`` with a
    ``config`` node, no wrapper, trained on data=text by the real app (2 Gloo ranks)."""
    project, commands, _, _ = pages["own-model.md"]
    run_dir = project / "outputs" / "hf" / "transformers"
    done = run(f"{commands[1]} hydra.run.dir={run_dir}", project)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == len(summary["losses"]) == 5 and summary["final_loss"] < summary["losses"][0]
    assert "zero_lab: final loss" in done.stdout
    assert (
        (project / "conf" / "model" / "gpt2_hf.yaml").read_text().startswith("_target_: transformers.GPT2LMHeadModel")
    )
