"""Config keys as users write them, and the field names behind them.

A key that is a Python keyword (``checkpoint.async``) is a dataclass field with a trailing underscore.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from typing import Any


def public_key(name: str) -> str:
    """The config key of a field: a Python keyword (``async``) is a field with a trailing underscore."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


def field_name(key: str) -> str:
    return f"{key}_" if keyword.iskeyword(key) else key


def renamed(tree: Any, rename: Callable[[str], str]) -> Any:
    if not isinstance(tree, dict):
        return tree
    return {rename(str(key)): renamed(value, rename) for key, value in tree.items()}
