"""The package's import graph, read from the source (no imports executed).

`check_layering` reports every import that breaks the floors of docs/ARCHITECTURE.md:
an upward import, a sideways import between two groups of one floor, a cycle, a
private name imported from another module, or a ``sys.modules[...]`` lookup of one of
our modules. `tests/test_layering.py` runs it on the repository and on planted
violations.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

PACKAGES = ("fp4jax", "pallas_kernels")

# (module-name prefix, floor). The longest matching prefix is a module's group; an
# import may point to a lower floor, or within its own group.
FLOORS: tuple[tuple[str, int], ...] = (
    ("fp4jax.numerics", 0),
    ("fp4jax.reference", 1),
    ("fp4jax.native_gemm", 1),
    ("fp4jax.gemm_table", 1),  # measured data, imports nothing
    ("pallas_kernels", 1),
    ("fp4jax.implementation", 2),
    ("fp4jax.recipe", 2),
    ("fp4jax.keys", 2),
    ("fp4jax.weight_gather", 2),
    ("fp4jax.quantized_dot", 3),
    ("fp4jax.diagnostics", 4),
    ("fp4jax.testing", 4),
    ("fp4jax.flax", 5),
    ("fp4jax.parallel", 5),
    ("fp4jax.metrics_log", 6),
    ("fp4jax.train", 6),
    ("fp4jax.checkpoint", 7),
    ("fp4jax", 8),  # the package itself: lazy re-exports only
)

# Kernel files may name the reference they must equal, inside these functions only.
REFERENCE_FUNCTIONS = ("reference", "main")


def group_of(module: str) -> tuple[str, int]:
    """(group prefix, floor) of a module name; `KeyError` for a module of no floor."""
    best = None
    for prefix, floor in FLOORS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, floor)
    if best is None:
        raise KeyError(f"module {module} belongs to no floor of tests/import_graph.py")
    return best


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Module name -> source file, for every .py file of our packages under ``root``."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return isinstance(t, ast.Name) and t.id == "TYPE_CHECKING" or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str, path: pathlib.Path, known: set[str]) -> Iterator[tuple[str, str, str]]:
    """(imported module, imported private name or "", enclosing function or "") per import
    of one of our modules in ``path``; ``TYPE_CHECKING`` blocks are skipped."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, func: str) -> Iterator[tuple[str, str, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, func or child.name)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] in PACKAGES:
                        yield alias.name, "", func
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(module, is_package, child)
                if target.split(".")[0] not in PACKAGES:
                    continue
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    if sub in known:  # `from pkg import module`
                        yield sub, "", func
                    else:
                        private = alias.name if alias.name.startswith("_") else ""
                        yield target, private, func
            elif (isinstance(child, ast.Subscript) and isinstance(child.value, ast.Attribute)
                  and child.value.attr == "modules" and isinstance(child.slice, ast.Constant)
                  and str(child.slice.value).split(".")[0] in PACKAGES):
                yield "sys.modules", str(child.slice.value), func
            yield from visit(child, func)

    yield from visit(tree, "")


def check_layering(root: pathlib.Path) -> list[str]:
    """Every layering violation under ``root`` (empty when the tree is clean)."""
    mods = modules(root)
    known = set(mods)
    problems: list[str] = []
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        group, floor = group_of(mod)
        for target, private, func in imports(mod, path, known):
            if target == "sys.modules":
                problems.append(f"{mod}: sys.modules[{private!r}] lookup (import the module)")
                continue
            if target not in known:
                problems.append(f"{mod} imports {target}, which does not exist")
                continue
            if private and target != mod:
                problems.append(f"{mod} imports the private name {target}.{private}")
            if target == mod or mod.startswith(target + "."):
                continue  # a module's own package
            t_group, t_floor = group_of(target)
            if (mod.startswith("pallas_kernels") and t_group == "fp4jax.reference"
                    and func in REFERENCE_FUNCTIONS):
                continue
            if t_floor > floor or (t_floor == floor and t_group != group):
                kind = "upward" if t_floor > floor else "sideways"
                problems.append(
                    f"{mod} (floor {floor}) imports {target} (floor {t_floor}): {kind}"
                    + (f", in {func}()" if func else ""))
            edges[mod].add(target)
    problems += [f"import cycle: {' -> '.join(c)}" for c in _cycles(edges)]
    return problems


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One representative cycle per strongly connected component with a cycle."""
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            dfs(node)
    return found
