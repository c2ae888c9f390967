"""The package's layers: core <- runtime <- app <- report <- bench, no cycles, and a core that needs torch alone.

Inside the app, folders by concern in the same way: workloads <- config <- plan <- record <- run
<- check <- launch (:data:`APP_FOLDERS`); every app module lives in one of them.

Read from the source with ``ast`` (every import, at any depth), so a cycle cannot hide in a
function-level import; what the core imports when it loads is followed the same way, from
module to module, so no interpreter is started.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import zero_lab

PACKAGE_DIR = Path(zero_lab.__file__).parent

#: Each layer may import only from itself and the layers before it. ``report`` reads run
#: folders (and imports nothing of the app); ``bench`` builds the app's models and workloads.
LAYERS = ("core", "runtime", "app", "report", "bench")
CORE_MODULES = (
    "zero_lab",
    "zero_lab.optimizer",
    "zero_lab.partition",
    "zero_lab.ddp_buckets",
    "zero_lab.exchange",
    "zero_lab.collectives",
    "zero_lab.comm",
    "zero_lab.overlap",
    "zero_lab.grad_reduce",
    "zero_lab.checkpoint",
    "zero_lab.files",
    "zero_lab.planner",
    "zero_lab.shard_state",
    "zero_lab.runtime.spawn",
    "zero_lab.runtime.signals",
    "zero_lab.runtime.external",
    "zero_lab.runtime.slurm",
)
APP_LIBRARIES = ("hydra", "omegaconf", "wandb", "matplotlib")
#: The app's folders, bottom up: each may import only from itself and the folders before it
#: (``zero_lab.app`` itself holds only the table of moved names and imports none of them).
APP_FOLDERS = ("workloads", "config", "plan", "record", "run", "check", "launch")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    sub = parts[1] if len(parts) > 1 else ""
    if sub in ("runtime", "report", "bench"):
        return sub
    if sub in ("app", "conf"):
        return "app"
    return "core"


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def imports_of(path: Path) -> tuple[tuple[str, bool], ...]:
    """``(imported zero_lab module, at top level?)`` for every import in ``path``."""
    tree = parsed(path)
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
    return tuple(found)


def import_graph() -> dict[str, set[str]]:
    """``module -> the zero_lab modules it imports``; a fresh dict per call (the parsing is cached)."""
    return {module: set(targets) for module, targets in _import_graph().items()}


@functools.cache
def _import_graph() -> dict[str, frozenset[str]]:
    modules = {module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    graph: dict[str, frozenset[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name, _ in imports_of(path):
            while name not in modules and "." in name:  # ``from zero_lab.app.run import build`` names a module
                name = name.rsplit(".", 1)[0]
            if name != module:
                targets.add(name)
        graph[module] = frozenset(targets)
    return graph


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    return [
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in graph.items()
        for target in sorted(targets)
        if LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(module))
    ]


def test_each_layer_imports_only_itself_and_the_layers_below() -> None:
    wrong = upward_imports(import_graph())
    assert not wrong, "\n".join(wrong)


def test_an_upward_import_is_caught_between_any_two_layers() -> None:
    upward = {
        "zero_lab.optimizer": {"zero_lab.runtime.spawn"},
        "zero_lab.runtime.spawn": {"zero_lab.app.check.before_start"},
        "zero_lab.app.check.before_start": {"zero_lab.report.cli"},
        "zero_lab.conf": {"zero_lab.bench.cli"},
        "zero_lab.report.cli": {"zero_lab.bench.cli"},
    }
    assert len(upward_imports(upward)) == len(upward)
    downward = {"zero_lab.bench.cli": {"zero_lab.report.cli", "zero_lab.app.check.before_start", "zero_lab"}}
    assert upward_imports(downward) == []


def app_folder_of(module: str) -> str | None:
    """The app folder ``module`` lives in (``zero_lab.app.run.step`` -> ``run``), or None outside one."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["zero_lab", "app"] and len(parts) > 2 else None


def upward_app_imports(graph: Mapping[str, set[str]]) -> list[str]:
    """Each import from an app folder into a later one (or from the ``zero_lab.app`` package into any)."""

    def rank(module: str) -> int:
        folder = app_folder_of(module)
        return APP_FOLDERS.index(folder) if folder in APP_FOLDERS else -1

    return [
        f"{module} ({app_folder_of(module)}) imports {target} ({app_folder_of(target)})"
        for module, targets in graph.items()
        if module.startswith("zero_lab.app")
        for target in sorted(targets)
        if app_folder_of(target) is not None and (module == "zero_lab.app" or rank(target) > rank(module))
    ]


def test_every_app_module_lives_in_a_folder_by_concern() -> None:
    loose = [m for m in import_graph() if app_folder_of(m) is not None and app_folder_of(m) not in APP_FOLDERS]
    assert not loose, f"app modules outside {APP_FOLDERS}: {loose}"
    assert {app_folder_of(m) for m in import_graph()} - {None} == set(APP_FOLDERS)


def test_each_app_folder_imports_only_itself_and_the_folders_below() -> None:
    wrong = upward_app_imports(import_graph())
    assert not wrong, "\n".join(wrong)


def test_an_upward_import_is_caught_between_any_two_app_folders() -> None:
    pairs = [(low, high) for i, low in enumerate(APP_FOLDERS) for high in APP_FOLDERS[i + 1 :]]
    assert len(pairs) == 21
    for low, high in pairs:
        assert upward_app_imports({f"zero_lab.app.{low}.a": {f"zero_lab.app.{high}.b"}}) == [
            f"zero_lab.app.{low}.a ({low}) imports zero_lab.app.{high}.b ({high})"
        ]
    downward = {f"zero_lab.app.{high}.b": {f"zero_lab.app.{low}.a", "zero_lab.app", "zero_lab.optimizer"}
                for i, low in enumerate(APP_FOLDERS) for high in APP_FOLDERS[i:]}  # fmt: skip
    assert upward_app_imports(downward) == []
    assert upward_app_imports({"zero_lab.app": {"zero_lab.app.run.step"}}) == [
        "zero_lab.app (None) imports zero_lab.app.run.step (run)"
    ]


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


def load_time_imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports while it loads: statements at module level, also inside
    ``if``, ``try``, ``with`` and class bodies, not inside functions or ``if TYPE_CHECKING:``."""

    def walk(body: list[ast.stmt]) -> Iterator[str]:
        for node in body:
            if isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield node.module
                yield from (f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                yield from walk(node.orelse)
            elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    yield from walk([n for n in getattr(node, field, []) if isinstance(n, ast.AST)])

    yield from walk(parsed(path).body)


def third_party_loaded_by(roots: tuple[str, ...]) -> set[str]:
    """The top-level names of every non-zero_lab module that importing ``roots`` loads,
    following zero_lab's own modules (and the packages above them) from file to file."""
    files = {module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    todo, seen, outside = list(roots), set(), set()
    while todo:
        module = todo.pop()
        parents = [module.rsplit(".", n)[0] for n in range(module.count(".") + 1)]  # a.b.c, a.b, a
        for name in (m for m in parents if m in files and m not in seen):
            seen.add(name)
            for imported in load_time_imports(files[name]):
                if imported.split(".")[0] != "zero_lab":
                    outside.add(imported.split(".")[0])
                    continue
                while imported not in files and "." in imported:  # ``from zero_lab import ParamSpec``
                    imported = imported.rsplit(".", 1)[0]
                todo.append(imported)
    return outside


def test_the_core_imports_with_torch_alone() -> None:
    loaded = third_party_loaded_by(CORE_MODULES)
    assert "torch" in loaded
    beyond = sorted(loaded - {"torch", "__future__"} - set(sys.stdlib_module_names))
    assert not beyond, f"the core loads more than torch and the standard library: {beyond}"
    assert not set(APP_LIBRARIES) & loaded


def test_the_core_check_sees_what_loads_and_not_what_waits(tmp_path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import torch\nfrom typing import TYPE_CHECKING\n"
        "try:\n    import hydra\nexcept ImportError:\n    import omegaconf\n"
        "if TYPE_CHECKING:\n    import wandb\n"
        "class A:\n    import matplotlib\n"
        "def f():\n    import transformers\n"
    )
    assert set(load_time_imports(source)) == {"torch", "typing", "typing.TYPE_CHECKING", "hydra", "omegaconf",
                                              "matplotlib"}  # fmt: skip
