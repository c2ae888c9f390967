"""Each fact of the package is stated in one module; every other module imports it (issue 29).

Read from the source with ``ast`` (no imports): string literals outside docstrings, numbers,
tuples and function definitions. A second spelling of one of these facts is a second place to
keep in step (the optimizer class was once written two ways, so a state dict and its manifest
disagreed); the test names the module that owns the fact, where the copy should import it from.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import zero_lab

PACKAGE = Path(zero_lab.__file__).parent


@functools.cache
def trees() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE.parent)): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def docstrings(tree: ast.Module) -> set[int]:
    """``id`` of every docstring node (a module's, class's or function's first string)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def literal(value: object) -> Callable[[ast.AST], bool]:
    """A string or number constant equal to ``value`` (never a bool)."""
    kind = type(value)
    return lambda node: (
        isinstance(node, ast.Constant) and type(node.value) in (kind, float) and node.value == value  # 25 and 25.0
    )


def tuple_of(*members: str) -> Callable[[ast.AST], bool]:
    """A tuple, list or set literal holding every one of ``members``."""

    def test(node: ast.AST) -> bool:
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return False
        held = {e.value for e in node.elts if isinstance(e, ast.Constant)}
        return set(members) <= held

    return test


def defines(name: str) -> Callable[[ast.AST], bool]:
    return lambda node: isinstance(node, (ast.FunctionDef, ast.Assign)) and name in _names(node)


def _names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.FunctionDef):
        return [node.name]
    return [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]


def strips_override_prefix(node: ast.AST) -> bool:
    """``text.lstrip("+~")``-style: an override's key cut out by hand, not by Hydra's parser."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("lstrip", "removeprefix")
        and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value[:1] in "+~" for a in node.args)
    )


#: fact -> (how it is spelled, the module that owns it, how many times it may appear there).
FACTS: dict[str, tuple[Callable[[ast.AST], bool], str | None]] = {
    "a param group's class key": (literal("optimizer_class"), "zero_lab/chained.py"),
    "the keys that are not hyper-parameters": (tuple_of("params", "param_names"), "zero_lab/chained.py"),
    "the spelling of an optimizer class in files": (defines("class_path"), "zero_lab/chained.py"),
    "DDP's 25 MiB bucket cap": (literal(25), "zero_lab/ddp_buckets.py"),
    "the default output key": (literal("logits"), "zero_lab/app/workloads/protocols.py"),
    "the metrics file": (literal("metrics.jsonl"), "zero_lab/app/record/run_files.py"),
    "the job's meta file": (literal("meta.json"), "zero_lab/app/record/run_files.py"),
    "the summary file": (literal("summary.json"), "zero_lab/app/record/run_files.py"),
    "the logs dir": (literal("logs"), "zero_lab/app/record/run_files.py"),
    "the command a user pastes": (literal("train.py"), "zero_lab/app/record/run_files.py"),
    "an override's key cut out by hand": (strips_override_prefix, None),  # Hydra's parser: app/config/overrides.py
}


@functools.cache
def code_nodes() -> list[tuple[str, ast.AST]]:
    """Every node of the package but its docstrings, with its module: walked once for all facts."""
    out = []
    for module, tree in trees().items():
        skip = docstrings(tree)
        out += [(module, node) for node in ast.walk(tree) if id(node) not in skip]
    return out


def places(test: Callable[[ast.AST], bool]) -> Iterator[str]:
    for module, node in code_nodes():
        if test(node):
            yield f"{module}:{getattr(node, 'lineno', '?')}"


@pytest.mark.parametrize("fact", FACTS)
def test_each_fact_is_stated_in_one_module(fact):
    test, owner = FACTS[fact]
    found = list(places(test))
    if owner is None:
        assert found == [], f"{fact}: {found} (read overrides with zero_lab.app.config.overrides)"
    else:
        assert [p.rsplit(":", 1)[0] for p in found] == [owner], f"{fact}: stated at {found}; import it from {owner}"


def test_the_scan_finds_what_it_looks_for():
    """The rules fire on code that restates a fact, and not on a docstring quoting it."""
    tree = ast.parse(
        '"""meta.json"""\n'
        'KEYS = ("params", "param_names", "lr")\n'
        'key = o.lstrip("+~").split("=")[0]\n'
        "cap = 25 * 2**20\n"
        "def class_path(cls): ...\n"
    )
    nodes = [n for n in ast.walk(tree) if id(n) not in docstrings(tree)]
    assert not any(literal("meta.json")(n) for n in nodes)
    for test in (tuple_of("params", "param_names"), strips_override_prefix, literal(25), defines("class_path")):
        assert any(test(n) for n in nodes)


def builds_specs_or_a_meta_model(node: ast.AST) -> bool:
    """``ParamSpec.of(...)``, ``ParamSpec(...)``, ``specs_from_module(...)`` or ``with torch.device("meta"):``
    (a model built on meta tensors): what the run plan (``zero_lab/app/plan/``) answers once per job."""
    if isinstance(node, ast.With):
        return any(_is_meta_device(item.context_expr) for item in node.items)
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    of_spec = isinstance(func, ast.Attribute) and func.attr == "of" and getattr(func.value, "id", "") == "ParamSpec"
    return of_spec or name in ("ParamSpec", "specs_from_module")


def _is_meta_device(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", "")) == "device"
        and any(isinstance(a, ast.Constant) and a.value == "meta" for a in node.args)
    )


#: Runs the plan's meta model (``with torch.device("meta")``: tensors its forward makes are meta too); builds none.
PROBE = "zero_lab/app/workloads/protocols.py"


def test_the_run_plan_is_the_apps_one_place_that_builds_specs_and_meta_models():
    """Issue 29: the checks, the memory baseline and the ranks read ``RunPlan`` (its specs, its meta
    model, its never-reached parameters); none builds its own."""
    found = [
        p for p in places(builds_specs_or_a_meta_model) if p.startswith("zero_lab/app/") and not p.startswith(PROBE)
    ]
    assert found and all(p.startswith("zero_lab/app/plan/") for p in found), (
        f"specs or a meta model built outside zero_lab/app/plan/: {[p for p in found if '/plan/' not in p]}; "
        "read them from the run plan (RunPlan.specs, RunPlan.model)"
    )


def test_the_plan_scan_fires_on_each_way_of_building():
    tree = ast.parse(
        "with torch.device('meta'):\n    m = build(cfg.model)\n"
        "a = ParamSpec.of(p)\nb = specs_from_module(m)\nc = ParamSpec(numel=3)\n"
        "x = torch.zeros(1, device='meta')\n"
    )
    hits = [n for n in ast.walk(tree) if builds_specs_or_a_meta_model(n)]
    assert len(hits) == 4  # not the meta tensor of the last line: a tensor, not a model


#: The app's boundaries to user code, the only places a blanket ``except Exception`` may stand:
#: ``(module, function) -> handlers``. Each reports what it caught with the key to blame (``data:``,
#: ``model:``, ``scheduler.<key>``), keeps it for the check that does (``attempt``), or re-raises
#: it (the metrics follower's thread, at ``close()``); its line says ``# user code: ...``.
USER_CODE_BOUNDARIES = {
    ("zero_lab/app/workloads/user_code.py", "attempt"): 1,  # a constructor, a module's import, a forward, a loss
    ("zero_lab/app/record/sinks.py", "_follow"): 1,  # a metric sink in the follower thread
}


def blanket_handlers(tree: ast.AST, function: str = "<module>") -> Iterator[tuple[str, ast.ExceptHandler]]:
    """``(innermost function, handler)`` for each ``except:``, ``except Exception`` or ``except BaseException``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from blanket_handlers(node, node.name)
            continue
        if isinstance(node, ast.ExceptHandler):
            caught = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            if any(c is None or getattr(c, "id", "") in ("Exception", "BaseException") for c in caught):
                yield function, node
        yield from blanket_handlers(node, function)


def test_a_blanket_except_stands_only_at_a_boundary_to_user_code():
    """Issue 29: every other handler names the exceptions that can happen there."""
    found: dict[tuple[str, str], int] = {}
    for module, tree in trees().items():
        if not module.startswith(("zero_lab/app/", "zero_lab/report/")):
            continue
        lines = (PACKAGE.parent / module).read_text().splitlines()
        for function, handler in blanket_handlers(tree):
            found[(module, function)] = found.get((module, function), 0) + 1
            line = lines[handler.lineno - 1]
            assert "# user code" in line, f"{module}:{handler.lineno}: say which user code it bounds: {line.strip()}"
    assert found == USER_CODE_BOUNDARIES, "narrow the new handler to the exceptions that can happen there"


def test_the_handler_scan_finds_blanket_catches_only():
    tree = ast.parse(
        "def f():\n    try: g()\n    except Exception: pass\n"
        "    try: g()\n    except (ValueError, BaseException): pass\n"
        "    try: g()\n    except: pass\n    try: g()\n    except ValueError: pass\n"
    )
    assert [(f, h.lineno) for f, h in blanket_handlers(tree)] == [("f", 3), ("f", 5), ("f", 7)]
