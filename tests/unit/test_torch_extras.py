"""torchvision beside torch: which pairs are refused and the one line that says so, from the
versions alone, and an import failure whose root cause is torchvision's."""

from __future__ import annotations

import pytest

from zero_lab.app.workloads.torch_extras import explain_import_error, torchvision_fix, torchvision_mismatch

FIX = (
    "pip install torch==2.13.0 torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu "
    "(or pip uninstall torchvision: zero_lab does not need it)"
)


def test_pypis_cuda_torchvision_beside_the_cpu_torch_is_refused_with_the_pinned_cpu_install():
    assert torchvision_mismatch("2.13.0+cpu", "0.28.0") == (
        "torchvision 0.28.0 is installed beside torch 2.13.0+cpu: only torch is a CPU build (+cpu), so "
        "torchvision's ops fail (operator torchvision::nms does not exist), and transformers imports it; "
        f"fix: {FIX}"
    )


def test_a_torchvision_of_another_torch_is_refused_naming_the_pair():
    line = torchvision_mismatch("2.13.0+cpu", "0.29.0+cpu")
    assert line == (
        "torchvision 0.29.0+cpu is installed beside torch 2.13.0+cpu: its pair is torchvision 0.28, and "
        f"transformers imports it; fix: {FIX}"
    )


@pytest.mark.parametrize(
    ("torch_version", "vision"),
    [("2.13.0+cpu", "0.28.0+cpu"), ("2.13.0+cpu", None), ("2.13.0", "0.28.0"), ("2.4.1+cu121", "0.19.1+cu121")],
)
def test_pairs_that_run_together_pass(torch_version, vision):
    assert torchvision_mismatch(torch_version, vision) is None


def test_the_fix_pins_the_pair_of_the_installed_torch_on_its_own_index():
    assert torchvision_fix("2.4.1+cu121") == (
        "pip install torch==2.4.1 torchvision==0.19.1 --index-url https://download.pytorch.org/whl/cu121 "
        "(or pip uninstall torchvision: zero_lab does not need it)"
    )


def _chained(root: BaseException) -> BaseException:
    """What ``transformers.GPT2LMHeadModel`` raises when torchvision's import fails (its __getattr__)."""
    try:
        try:
            raise root
        except Exception as error:
            raise ModuleNotFoundError("Could not import module 'GPT2LMHeadModel'.") from error
    except ModuleNotFoundError as outer:
        return outer


def test_an_import_failure_caused_by_torchvision_is_named_in_one_line():
    error = _chained(RuntimeError("operator torchvision::nms does not exist"))
    explained = explain_import_error(error, "model._target_=transformers.GPT2LMHeadModel")
    assert str(explained) == (
        "model._target_=transformers.GPT2LMHeadModel cannot be imported because torchvision is broken "
        f"(RuntimeError: operator torchvision::nms does not exist); fix: {FIX}"
    )
    assert "\n" not in str(explained)


def test_an_import_failure_of_another_cause_is_left_alone():
    assert explain_import_error(_chained(ImportError("No module named 'sentencepiece'")), "x") is None
