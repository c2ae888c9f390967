"""The head every benchmark command line shares: its parser, and the line that called it.

parser = script_parser(__doc__)                      # --help says the docstring's first paragraph
command = command_line("scripts/plan.py", argv)      # "python scripts/plan.py --model lm", for headers
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["command_line", "script_parser"]


def script_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc`` (the script module's docstring)."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """``python <script> <arguments>``: ``argv``, or this process's own arguments when it is ``None``."""
    return " ".join(["python", script, *(sys.argv[1:] if argv is None else argv)])
