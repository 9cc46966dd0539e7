"""The package's layout: rooms by concern that import each other one way, no import circle, short files.

The README's "Where things are" table shows the same order (LAYERS); a new module goes in the room whose
concern it is, and may import only its own room and the rooms listed before it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.config.constants import PACKAGE

SOURCE = Path(__file__).resolve().parents[1] / "src" / PACKAGE
# Each room may import itself and the rooms before it; "" is the package's own files: the entry points
# and the `python -m <package>.X` commands, which may import every room.
LAYERS = ["config", "parallel", "observe", "task", "data", "model_type", "launch", "loop", ""]
MOST_TOP_LEVEL_FILES = 10
MOST_LINES = 300


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` (at ``path``) imports, at any depth in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
                target = node.module[len(PACKAGE) + 1 :]
            else:
                continue
            for alias in node.names:  # `from . import x` imports the module x
                child = f"{target}.{alias.name}" if target else alias.name
                found.add(child if child in known else target)
        elif isinstance(node, ast.Import):
            found |= {a.name[len(PACKAGE) + 1 :] for a in node.names if a.name.startswith(PACKAGE + ".")}
    return {target for target in found if target in known and target != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def room(module: str) -> str:
    return module.split(".")[0] if "." in module or module in LAYERS else ""


def test_no_import_circle_between_files() -> None:
    graph = import_graph()
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            circle = [*trail[trail.index(module) :], module]
            pytest.fail(f"import circle: {' -> '.join(circle)}")
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_rooms_import_one_way() -> None:
    wrong = [
        f"{module} ({room(module) or 'top'}) imports {target} ({room(target) or 'top'})"
        for module, targets in import_graph().items()
        for target in sorted(targets)
        if LAYERS.index(room(target)) > LAYERS.index(room(module))
    ]
    assert not wrong, "a room imports a room listed after it:\n" + "\n".join(wrong)


def test_every_room_is_in_the_layers() -> None:
    rooms = {path.name for path in SOURCE.iterdir() if (path / "__init__.py").exists()}
    assert rooms == set(LAYERS) - {""}


def test_the_package_root_holds_the_commands_only() -> None:
    top = sorted(path.name for path in SOURCE.glob("*.py"))
    assert len(top) <= MOST_TOP_LEVEL_FILES, top


def test_no_file_is_longer_than_300_lines() -> None:
    project = SOURCE.parents[1]
    long = [
        f"{path.relative_to(project)}: {len(path.read_text(encoding='utf-8').splitlines())}"
        for path in sorted([*SOURCE.rglob("*.py"), *(project / "tests").rglob("*.py")])
        if len(path.read_text(encoding="utf-8").splitlines()) > MOST_LINES
    ]
    assert not long, f"files over {MOST_LINES} lines: {long}"
