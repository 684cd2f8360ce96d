"""The import graph of kev/ runs one way: each folder imports only folders on lower floors, and no file imports
itself back through others. An AST scan (no imports run): an import inside a function counts, one under
`if TYPE_CHECKING:` does not (it never runs). docs/design.md's map lists the same floors with what each owns.
"""
from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

KEV = Path(__file__).resolve().parents[1] / "kev"

# The floors, bottom to top: the one place this order is written. A folder (a subfolder too) is its own floor and
# may import its own files and any floor below it. kev.errors is the root package's one leaf module, the floor
# every other stands on; the root package itself (kev/__init__.py: the public facade and __version__) re-exports
# the engine, so it stands above the engine and below the front ends that ask it for __version__.
FLOORS = [
    "kev.errors",
    "kev.results",
    "kev.config",
    "kev.model.triton",
    "kev.model.cpu_kernels",
    "kev.model",
    "kev.router",
    "kev.engine.kv",
    "kev.engine",
    "kev",
    "kev.isolation",
    "kev.distributed",
    "kev.wire.bodies",
    "kev.wire.tools",
    "kev.wire.responses",
    "kev.wire",
    "kev.backend",
    "kev.batch",
    "kev.server.playground",
    "kev.server",
    "kev.bench",
    "kev.cli",
]


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(KEV.rglob("*.py")):
        parts = list(path.relative_to(KEV.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def floor_of(module: str) -> str:
    return module if module == "kev.errors" or _is_package(module) else module.rsplit(".", 1)[0]


def _type_checking_only(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            skipped |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}  # its else branch runs
    return skipped


def _known(name: str) -> str | None:
    """The kev module an imported name lives in (`from kev.x import y`: y may be a module or a name in kev.x)."""
    while name and name not in MODULES:
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return name or None


def imports() -> dict[str, dict[str, int]]:
    """module -> {kev module it imports: line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped, found = _type_checking_only(tree), dict[str, int]()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = module if _is_package(module) else module.rsplit(".", 1)[0]
                    for _ in range(node.level - 1):
                        package = package.rsplit(".", 1)[0]
                    base = f"{package}.{base}" if base else package
                names = [f"{base}.{alias.name}" for alias in node.names] + [base]
            else:
                continue
            for name in names:
                target = _known(name) if name.startswith("kev") else None
                if target is not None and target != module:
                    found.setdefault(target, node.lineno)
        graph[module] = found
    return graph


def test_every_folder_has_a_floor() -> None:
    folders = {floor_of(m) for m in MODULES}
    assert sorted(folders - set(FLOORS)) == [], "a new folder: put it on its floor in FLOORS (and in docs/design.md)"
    assert sorted(set(FLOORS) - folders) == [], "FLOORS names a folder that is gone"


def test_the_design_map_lists_the_same_floors() -> None:
    """docs/design.md's map is the reader's copy of FLOORS: same floors, same order."""
    doc = (KEV.parent / "docs" / "design.md").read_text()
    rows = [line.split(" | ")[0] for line in doc.split("## The map")[1].splitlines() if line.startswith("| `kev")]
    listed = [name.strip("/").removesuffix(".py").replace("/", ".")
              for row in rows for name in re.findall(r"`(kev[^`]*)`", row)]
    assert listed == FLOORS


def test_no_import_runs_back_up() -> None:
    rank = {floor: i for i, floor in enumerate(FLOORS)}
    upward = [f"{MODULES[a].relative_to(KEV.parent)}:{line} imports {b} ({floor_of(a)} is below {floor_of(b)})"
              for a, targets in imports().items() for b, line in targets.items()
              if rank[floor_of(b)] > rank[floor_of(a)]]
    assert upward == [], "imports that run from a lower floor to a higher one:\n" + "\n".join(upward)


def test_no_file_circles() -> None:
    graph = imports()
    try:
        graphlib.TopologicalSorter({m: set(targets) for m, targets in graph.items()}).prepare()
    except graphlib.CycleError as err:
        circle = err.args[1]
        steps = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in zip(circle, circle[1:])]
        raise AssertionError("files that import each other round a circle:\n" + "\n".join(steps)) from None


def test_the_scan_sees_lazy_imports_and_skips_type_checking_ones() -> None:
    """The scan is what the two tests above stand on: a function-level import counts (it runs when called)."""
    graph = imports()
    assert "kev.distributed.router_engine" in graph["kev.backend.factory"]  # imported inside build_backend
    assert "kev.server.service" not in graph["kev.batch.server_batches"]  # only under TYPE_CHECKING
