"""The README's "Developing" section draws the app as it is: each folder of ``zero_lab/app`` in
the layer order ``tests/unit/test_layers.py`` checks, each of its modules named under it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_layers import APP_FOLDERS

ROOT = Path(__file__).resolve().parents[2]


def drawing() -> list[str]:
    """The lines of the Developing section's layout block."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Developing") :]
    return section.split("```")[1].splitlines()


def test_the_readme_draws_every_app_folder_in_layer_order_with_its_modules():
    lines = drawing()
    starts = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^    (\w+)/\s", line))}
    assert list(starts) == list(APP_FOLDERS), "the app's folders, in the order each imports only those above it"
    ends = [*list(starts.values())[1:], next(i for i, line in enumerate(lines) if line.startswith("  report/"))]
    for (folder, start), end in zip(starts.items(), ends):
        block = " ".join(lines[start:end])
        modules = sorted(p.name for p in (ROOT / "zero_lab" / "app" / folder).glob("*.py") if p.name != "__init__.py")
        missing = [m for m in modules if not re.search(rf"\b{re.escape(m)}\b", block)]
        assert not missing, f"README Developing, app/{folder}/: {missing} not drawn"
    order = " ← ".join(f"`{f}`" for f in APP_FOLDERS)
    assert order in (ROOT / "README.md").read_text(), "the layer order in words"
