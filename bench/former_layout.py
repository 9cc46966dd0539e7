"""The package's layout before it was grouped by concern, and the code of then read in today's layout.

One commit moved the generated package's modules into subpackages (config/, parallel/, observe/, task/,
data/, launch/, loop/) and rewrote the imports, and the causal-lm task gave its preprocessing recipe a
file of its own. A results table measured before that commit is still evidence for today's code when
the code it ran defines the same things: every function, class and module-level statement compared as
Python parses it, wherever it now lives, with imports and docstrings aside, module references in strings
and in launch.sh read with the new module paths. Any other change shows as before.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import PurePosixPath

# Old module (dotted, under the package) -> the module it became.
MOVED_MODULES = {
    "launcher": "launch.launcher",
    "launch_status": "launch.status",
    "lifeline": "launch.lifeline",
    "lock": "launch.lock",
    "preemption": "launch.preemption",
    "errors": "launch.errors",
    "preflight": "launch.preflight",
    "validation": "config.validation",
    "constants": "config.constants",
    "cli": "config.cli",
    "data_settings": "config.hub_data",
    "model_type.settings": "config.data",
    "distributed": "parallel.process_group",
    "model": "parallel.ddp",
    "fsdp": "parallel.fsdp",
    "parallel": "parallel.strategy",
    "checkpoint": "parallel.checkpoint",
    "sharded_checkpoint": "parallel.sharded_checkpoint",
    "state": "parallel.training_state",
    "rng": "parallel.rng",
    "precision": "parallel.precision",
    "data": "data.loader",
    "data_cache": "data.cache",
    "data_sources": "data.sources",
    "arrow_rows": "data.arrow_rows",
    "labels": "data.labels",
    "sampling": "data.sampling",
    "batch_plan": "data.batch_plan",
    "task_spec": "task.spec",
    "hf": "task.hugging_face",
    "lora": "task.lora",
    "classification": "task.classification",
    "pretrained": "task.pretrained",
    "trainer": "loop.trainer",
    "setup": "loop.setup",
    "evaluation": "loop.evaluation",
    "optim": "loop.optim",
    "nonfinite": "loop.nonfinite",
    "generations": "loop.generations",
    "longest_batch": "loop.longest_batch",
    "log": "observe.log",
    "metrics": "observe.metrics",
    "trackers": "observe.trackers",
    "throughput": "observe.throughput",
    "memory": "observe.memory",
}
# A file that exists at a commit only in the old layout: tells the layouts apart.
OLD_LAYOUT_MARK = "{{cookiecutter.__project_dir}}/src/{{cookiecutter.package_name}}/trainer.py"
_PACKAGE_DIR = "{{cookiecutter.package_name}}"
_ALTERNATIVES = "|".join(re.escape(old) for old in sorted(MOVED_MODULES, key=len, reverse=True))
# `<package>.old` as the package is written in templates, format strings and %-strings.
_MODULE_REFERENCE = re.compile(
    r"(\{\{ cookiecutter\.package_name \}\}|\{package\}|\{PACKAGE\}|%\(package\)s)\.("
    + _ALTERNATIVES
    + r")\b(?!\.)"
)
# The shared defaults moved into config/ beside the schema.
_SHARED_DEFAULTS = re.compile(r"(\{\{ cookiecutter\.package_name \}\}/)defaults\.yaml")
_FILE_REFERENCE = re.compile(r"(?<![\w/.])(" + _ALTERNATIVES + r")\.py\b")


def new_path(old: str) -> str:
    """Where a file of the old layout lives now (itself when it did not move)."""
    parts = PurePosixPath(old).parts
    if _PACKAGE_DIR not in parts or not old.endswith(".py"):
        return old
    at = parts.index(_PACKAGE_DIR) + 1
    module = ".".join(parts[at:])[: -len(".py")]
    moved = MOVED_MODULES.get(module)
    return old if moved is None else "/".join([*parts[:at], *moved.split(".")]) + ".py"


def translate_text(text: str) -> str:
    """Module and file references of the old layout, written as the new layout writes them."""
    text = _MODULE_REFERENCE.sub(lambda found: f"{found[1]}.{MOVED_MODULES[found[2]]}", text)
    text = _SHARED_DEFAULTS.sub(r"\1config/defaults.yaml", text)
    return _FILE_REFERENCE.sub(lambda found: MOVED_MODULES[found[1]].replace(".", "/") + ".py", text)


class _Normalise(ast.NodeTransformer):
    """Drops imports and docstrings; reads old module references in strings in the new layout."""

    def __init__(self, translate: bool) -> None:
        self.translate = translate

    def _without_docstring(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", [])
        first = body[0] if body else None
        docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        if docstring and isinstance(first.value.value, str):  # type: ignore[union-attr]
            node.body = body[1:]  # type: ignore[attr-defined]
        return self.generic_visit(node)

    visit_Module = visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _without_docstring

    def visit_Import(self, node: ast.AST) -> None:
        return None

    visit_ImportFrom = visit_Import

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        if self.translate and isinstance(node.value, str):
            return ast.Constant(translate_text(node.value))
        return node


def definitions(source: str, translate: bool) -> Counter[str]:
    """Each top-level statement of a module, as Python parses it, without imports and docstrings."""
    tree = _Normalise(translate).visit(ast.parse(source))
    return Counter(ast.dump(statement) for statement in tree.body if not isinstance(statement, ast.Pass))


def changed_files(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The files (today's paths) whose code differs between ``old`` (path -> text at a commit of the old
    layout) and ``new`` (path -> text now), definitions compared wherever they live."""
    changed = set()
    for path in {*old, *new}:
        if path.endswith(".py"):
            continue
        then, now = old.get(path), new.get(path)
        if then is None or now is None or translate_text(then) != now:
            changed.add(path)
    old_python = {path: text for path, text in old.items() if path.endswith(".py")}
    new_python = {path: text for path, text in new.items() if path.endswith(".py")}
    before = {path: definitions(text, translate=True) for path, text in old_python.items()}
    after = {path: definitions(text, translate=False) for path, text in new_python.items()}
    gone = sum(before.values(), Counter()) - sum(after.values(), Counter())
    added = sum(after.values(), Counter()) - sum(before.values(), Counter())
    changed |= {path for path, found in after.items() if found & added}
    changed |= {new_path(path) for path, found in before.items() if found & gone}
    return sorted(changed)
