"""The package's layers: algorithm <- runtime <- app, no cycles, and a core that needs torch alone.

Read from the source with ``ast`` (every import, at any depth), so a cycle cannot hide in a
function-level import, plus one fresh interpreter that imports every core module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import zero_lab

PACKAGE_DIR = Path(zero_lab.__file__).parent

#: Each layer may import only from itself and the layers before it.
LAYERS = ("core", "runtime", "app")
CORE_MODULES = (
    "zero_lab",
    "zero_lab.optimizer",
    "zero_lab.partition",
    "zero_lab.ddp_buckets",
    "zero_lab.exchange",
    "zero_lab.collectives",
    "zero_lab.comm",
    "zero_lab.overlap",
    "zero_lab.checkpoint",
    "zero_lab.files",
    "zero_lab.planner",
    "zero_lab.shard_state",
    "zero_lab.runtime.launch",
    "zero_lab.runtime.signals",
    "zero_lab.runtime.external",
    "zero_lab.runtime.slurm",
)
APP_LIBRARIES = ("hydra", "omegaconf", "wandb", "matplotlib")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("runtime",):
        return "runtime"
    if len(parts) > 1 and parts[1] in ("app", "conf", "bench", "report"):
        return "app"
    return "core"


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """``(imported zero_lab module, at top level?)`` for every import in ``path``."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name.split(".")[0] == "zero_lab":
                found.append((name, id(node) in top_level))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name, _ in imports_of(path):
            while name not in modules and "." in name:  # ``from zero_lab.app import cli`` names a module
                name = name.rsplit(".", 1)[0]
            if name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def test_each_layer_imports_only_itself_and_the_layers_below() -> None:
    wrong = [
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in import_graph().items()
        for target in targets
        if LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(module))
    ]
    assert not wrong, "\n".join(wrong)


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if target == module.rsplit(".", 1)[0] or module == "zero_lab":
                continue  # a package importing its own submodules is how __init__ re-exports
            if state.get(target) == 1:
                return [*path, module, target]
            if state.get(target) is None and (cycle := visit(target, [*path, module])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if state.get(module) is None and (cycle := visit(module, [])):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_no_import_of_zero_lab_hides_inside_a_function() -> None:
    hidden = [
        f"{module_name(path)} imports {name} inside a function"
        for path in PACKAGE_DIR.rglob("*.py")
        for name, top_level in imports_of(path)
        if not top_level
    ]
    assert not hidden, "\n".join(hidden)


def test_the_core_imports_with_torch_alone() -> None:
    code = (
        "import sys\n"
        f"for name in {CORE_MODULES!r}:\n"
        "    __import__(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {APP_LIBRARIES!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", f"the core pulled in app libraries: {done.stdout}"
