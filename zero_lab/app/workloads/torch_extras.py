"""torchvision beside torch: a pair that does not match, named in one line with its fix.

zero_lab never needs torchvision, but ``transformers`` imports it whenever it is installed.
PyPI's torchvision wheels for Linux are CUDA builds: beside the CPU torch their ops fail to
register (``operator torchvision::nms does not exist``), and every ``transformers`` model then
fails to import, the cause three exceptions down; an unpinned ``pip install torchvision``
replaces torch itself with a CUDA build (about 6 GB). The fix is the pinned pair (torch 2.N ↔
torchvision 0.(N+15)) from PyTorch's CPU index:

    pip install torch==2.13.0 torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu

:func:`model_extras_problem` says so before start for a model that reaches torchvision,
:func:`explain_import_error` for an import that failed of it, and the install check,
``python -m zero_lab.app.workloads.torch_extras`` (``make setup`` runs it), exits 1 with it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import sys
import traceback

import torch

from zero_lab.app.workloads.user_code import attempt

__all__ = ["explain_import_error", "main", "model_extras_problem", "torchvision_fix", "torchvision_mismatch"]

#: Model targets whose import reaches torchvision when it is installed (transformers imports it).
NEEDS_TORCHVISION = ("transformers.", "torchvision.", "zero_lab.app.workloads.hf_models.")

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?[^+]*(?:\+(.+))?$")


class TorchvisionError(ImportError):
    """An import that failed because of torchvision; the message is one line with the fix."""


def _parse(version: str) -> tuple[int, int, int, str | None] | None:
    match = _VERSION.match(version)
    if match is None:
        return None
    major, minor, patch, local = match.groups()
    return int(major), int(minor), int(patch or 0), local


def torchvision_fix(torch_version: str = torch.__version__) -> str:
    """The pinned install of the CPU pair of ``torch_version`` (or the uninstall: nothing here needs it)."""
    parsed = _parse(torch_version)
    if parsed is None or parsed[0] != 2:
        return f"pip uninstall torchvision (zero_lab does not need it), or install the pair of torch {torch_version}"
    major, minor, patch, local = parsed
    pins = f"torch=={major}.{minor}.{patch} torchvision==0.{minor + 15}.{patch}"
    index = f"https://download.pytorch.org/whl/{'cpu' if local is None else local}"  # the build of the torch
    return f"pip install {pins} --index-url {index} (or pip uninstall torchvision: zero_lab does not need it)"


def torchvision_mismatch(torch_version: str, vision_version: str | None) -> str | None:
    """Why ``torchvision==vision_version`` cannot run beside ``torch==torch_version``; ``None``
    when it can (or is not installed). Pairs: torch 2.N with torchvision 0.(N+15); a CPU build
    (``+cpu``) only with a CPU build."""
    if vision_version is None:
        return None
    torch_parsed, vision_parsed = _parse(torch_version), _parse(vision_version)
    if torch_parsed is None or vision_parsed is None or torch_parsed[0] != 2:
        return None  # a version scheme this rule does not know: not judged
    pair = f"0.{torch_parsed[1] + 15}"
    found = f"torchvision {vision_version} is installed beside torch {torch_version}"
    if vision_parsed[:2] != (0, torch_parsed[1] + 15):
        why = f"its pair is torchvision {pair}"
    elif (torch_parsed[3] == "cpu") != (vision_parsed[3] == "cpu"):
        cpu = "torch" if torch_parsed[3] == "cpu" else "torchvision"
        why = f"only {cpu} is a CPU build (+cpu), so torchvision's ops fail (operator torchvision::nms does not exist)"
    else:
        return None
    return f"{found}: {why}, and transformers imports it; fix: {torchvision_fix(torch_version)}"


def _installed_torchvision() -> str | None:
    try:
        return importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return None


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from (``__cause__``, else ``__context__``), outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _mentions_torchvision(error: BaseException) -> bool:
    """``error``'s message, the module it could not import, or a file of its traceback names torchvision."""
    files = (frame.f_code.co_filename for frame, _ in traceback.walk_tb(error.__traceback__))
    return "torchvision" in f"{error} {getattr(error, 'name', None) or ''}" or any("torchvision" in f for f in files)


def explain_import_error(error: BaseException, what: str) -> TorchvisionError | None:
    """A one-line :class:`TorchvisionError` when torchvision is in ``error``'s chain of causes
    (``what``: what was being imported), else ``None``."""
    chain = _causes(error)
    if not any(_mentions_torchvision(e) for e in chain):
        return None
    root = chain[-1]
    line = (str(root).strip().splitlines() or [type(root).__name__])[0]
    return TorchvisionError(
        f"{what} cannot be imported because torchvision is broken ({type(root).__name__}: {line}); "
        f"fix: {torchvision_fix()}"
    )


def model_extras_problem(target: str) -> str | None:
    """For ``model._target_=target``, before start: a torchvision that does not match the
    installed torch (when ``target`` reaches it, :data:`NEEDS_TORCHVISION`), else an import of
    ``target`` that fails because of torchvision; ``None`` otherwise (other import errors
    are the config check's to report)."""
    if target.startswith(NEEDS_TORCHVISION):
        mismatch = torchvision_mismatch(torch.__version__, _installed_torchvision())
        if mismatch is not None:
            return f"model._target_={target}: {mismatch}"
    module, _, name = target.rpartition(".")
    if not module:
        return None
    imported = attempt(lambda: getattr(importlib.import_module(module), name))  # user code: importing runs it
    explained = None if imported.error is None else explain_import_error(imported.error, f"model._target_={target}")
    return None if explained is None else str(explained)  # other errors: the target check's


def main() -> int:
    """The install check: 0 when torchvision is absent or pairs with torch, else 1 with the fix."""
    vision = _installed_torchvision()
    mismatch = torchvision_mismatch(torch.__version__, vision)
    if mismatch is not None:
        print(f"zero_lab: {mismatch}", file=sys.stderr)
        return 1
    shown = f"torchvision {vision}" if vision else "no torchvision (not needed)"
    print(f"zero_lab: torch {torch.__version__}, {shown}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
