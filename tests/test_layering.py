"""The package's layering: each part imports only from the parts below it (DESIGN.md's layout), no
import cycle, no function-level import that hides one, the width analysis on the public API only,
every module under 300 lines and every function under 80."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ntbridge"
# lowest first; a part imports from strictly lower layers only (and from itself)
LAYERS = [
    ("compat", "errors", "options", "progress"),
    ("devices", "dlpack", "specs"),
    ("programs", "results"),
    ("stax", "tiling"),
    ("converters",),
    ("analytic", "empirical", "autograd"),
    ("pipeline",),
    ("first_calls",),
    ("api",),
    ("linearize", "predict", "gp"),
    ("analysis", "gpytorch", "testing"),
    ("cli",),
    ("__init__",),
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}
LAZY = ("cli",)  # imports ntbridge's own modules inside its subcommands, to start without torch
MAX_LINES = 300
MAX_FUNCTION_LINES = 80
# what the width analysis may import: the entry points, the public objects they return, errors
ANALYSIS_USES = ("api", "converters", "errors", "linearize", "predict", "progress")


def _modules() -> dict[str, pathlib.Path]:
    """``{"ntbridge.stax.conv": path, "ntbridge.stax": .../stax/__init__.py, ...}``."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _resolve(module: str, path: pathlib.Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The ntbridge modules an import statement in ``module`` (file ``path``) loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "ntbridge"]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if node.level:
        base = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(base + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base.split(".")[0] != "ntbridge":
        return []
    # ``from pkg import name``: the submodule pkg.name where it is one, else pkg itself
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _imports(module: str, path: pathlib.Path) -> tuple[set[str], set[str]]:
    """``(top-level, function-level)`` ntbridge imports of a module."""
    tree = ast.parse(path.read_text())
    top, inner = set(), set()

    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if nested else top).update(_resolve(module, path, child))
            inside = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.Lambda))
            visit(child, inside)

    visit(tree, False)
    return top - {module}, inner - {module}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_part_has_a_layer():
    assert {_part(m) for m in MODULES} == set(RANK)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_from_lower_layers(module):
    top, inner = IMPORTS[module]
    upward = sorted(t for t in top | inner if _part(t) != _part(module)
                    and RANK[_part(t)] >= RANK[_part(module)])
    assert not upward, f"{module} imports from its own layer or above: {upward}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_level_import_of_ntbridge(module):
    """Imports inside functions are for heavy or optional packages (torch, matplotlib); one of
    ntbridge's own modules there would hide a cycle (the command line excepted, see LAZY)."""
    if _part(module) in LAZY:
        return
    assert not IMPORTS[module][1], f"{module} imports {sorted(IMPORTS[module][1])} in a function"


def test_no_import_cycle():
    graph = {m: {t for t in top if t in MODULES} for m, (top, _) in IMPORTS.items()}
    state: dict[str, int] = {}

    def visit(m, trail):
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(m):] + [m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for t in sorted(graph[m]):
            visit(t, trail + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines < MAX_LINES, f"{module} has {lines} lines; split it by concern"


def test_the_width_analysis_uses_the_public_api():
    used = {t for m in MODULES if _part(m) == "analysis" for t in IMPORTS[m][0] | IMPORTS[m][1]}
    inside = sorted(t for t in used if _part(t) not in ("analysis", *ANALYSIS_USES)
                    or t.count(".") > 1 and _part(t) in ("api", "converters"))
    assert not inside, f"ntbridge.analysis imports internals: {inside}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_functions_stay_short(module):
    tree = ast.parse(MODULES[module].read_text())
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{module}: {', '.join(long)} over {MAX_FUNCTION_LINES} lines; split them"
