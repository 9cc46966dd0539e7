"""The configuration reference of README.md, generated from the schema in config.py, never written by hand.

    python -m <package>.config_reference            # print the Markdown table
    python -m <package>.config_reference --write    # refresh README.md's copy after changing config.py
    python -m <package>.config_reference --check    # exit 1 when README.md's copy is out of date

Each key's meaning is the comment after its field in config.py; its type comes from the annotation.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

from .config import Config

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN = "<!-- config reference: begin -->"
END = "<!-- config reference: end -->"
FIELD_WITH_COMMENT = re.compile(r"^\s+(\w+):[^#]*#\s*(.+)$")


def field_comments(schema: type) -> dict[str, str]:
    """The comment after each field in the class's source: the schema documents itself."""
    comments = {}
    for line in inspect.getsource(schema).splitlines():
        match = FIELD_WITH_COMMENT.match(line)
        if match:
            comments[match.group(1)] = match.group(2).strip()
    return comments


def type_name(kind: type) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return " \\| ".join(f"`{member.value}`" for member in kind)
    return kind.__name__


def rows(schema: type = Config, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(dotted key, type, meaning) of every leaf of the schema, in declaration order."""
    hints = typing.get_type_hints(schema)
    comments = field_comments(schema)
    for field in dataclasses.fields(schema):
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            yield from rows(kind, f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}", type_name(kind), comments.get(field.name, "")


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


def main(argv: list[str]) -> int:
    if "--write" in argv or "--check" in argv:
        current = README.read_text(encoding="utf-8")
        expected = readme_with_reference(current)
        if "--check" in argv:
            if current != expected:
                fix = f"python -m {__spec__.name} --write"
                print(f"error: the config reference in {README} is out of date; run {fix}", file=sys.stderr)
                return 1
            return 0
        README.write_text(expected, encoding="utf-8")
        return 0
    print(markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
