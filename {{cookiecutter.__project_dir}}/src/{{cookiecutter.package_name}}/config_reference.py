"""The configuration reference of README.md, generated from the schema (config/schema.py), never by hand.

    python -m <package>.config_reference            # print the Markdown table
    python -m <package>.config_reference --write    # refresh README.md's copy after changing the schema
    python -m <package>.config_reference --check    # exit 1 when README.md's copy is out of date

Each key's meaning is the docstring under its field (in config/schema.py, or config/data.py for this
model type's own keys); its type comes from the annotation.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import sys
import textwrap
import typing
from collections.abc import Iterator
from pathlib import Path

from .config import Config, public_key
from .config.cli import command_parser

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN = "<!-- config reference: begin -->"
END = "<!-- config reference: end -->"


def field_docs(schema: type) -> dict[str, str]:
    """The docstring under each field of a dataclass and of its bases: the schema documents itself."""
    docs: dict[str, str] = {}
    for klass in reversed(schema.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        assert isinstance(body, ast.ClassDef)
        for field, following in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[field.target.id] = " ".join(following.value.value.split())
    return docs


def type_name(kind: type) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return " \\| ".join(f"`{member.value}`" for member in kind)
    return kind.__name__


def section(kind: object) -> type | None:
    """The dataclass of a section of the schema, optional ones (``lora``) included; None for a leaf."""
    candidates = [kind, *typing.get_args(kind)]
    return next((c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)), None)


def rows(schema: type = Config, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(dotted key, type, meaning) of every leaf of the schema, in declaration order."""
    hints = typing.get_type_hints(schema)
    docs = field_docs(schema)
    for field in dataclasses.fields(schema):
        kind = hints[field.name]
        nested = section(kind)
        if nested is not None:
            yield from rows(nested, f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{public_key(field.name)}", type_name(kind), docs.get(field.name, "")


def markdown() -> str:
    lines = ["| key | type | meaning |", "| --- | --- | --- |"]
    for key, kind, meaning in rows():
        escaped = meaning.replace("|", "\\|")
        lines.append(f"| `{key}` | {kind} | {escaped} |")
    return "\n".join(lines) + "\n"


def readme_with_reference(readme: str) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        markers = f"{BEGIN} ... {END}"
        raise SystemExit(f"error: {README} lacks the markers {markers}; add them where the table goes")
    return readme[: start + len(BEGIN)] + "\n" + markdown() + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("config_reference", "Prints the README's config reference, or refreshes it.")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="refresh README.md's copy")
    action.add_argument("--check", action="store_true", help="exit 1 when README.md's copy is out of date")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print(markdown(), end="")
        return 0
    current = README.read_text(encoding="utf-8")
    expected = readme_with_reference(current)
    if args.write:
        README.write_text(expected, encoding="utf-8")
    elif current != expected:
        fix = f"python -m {__spec__.name} --write"
        print(f"error: the config reference in {README} is out of date; run {fix}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
