"""Tagged sentences read and checked: every record's words and tags, two lists of strings of the same
length, from any source ``data/sources.py`` reads.

Checks run on whole Arrow columns; only when one finds a problem is the column read row by row, to name
the first bad record (file and line for JSON Lines, else the row). A CSV cell cannot hold a list: there
the words and the tags are written separated by spaces. A hub dataset's tags may be class ids
(``Sequence(ClassLabel)``, as in conll2003): they are read as the names the dataset gives them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from ..data.loader import DataError
from ..data.sources import Source, SplitReader, first_row, is_string_column, require_fields
from .entities import is_tag

TAG_FORM = "O, or B-, I-, E- or S- followed by the entity type (e.g. B-PER)"


def is_string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def list_feature(dataset: datasets.Dataset, field: str) -> Any:
    """The feature of a list column's items; None for a column of anything but lists."""
    feature = dataset.features[field]
    return feature.feature if isinstance(feature, (datasets.List, datasets.LargeList)) else None


def named_class_ids(column: pa.ChunkedArray, names: list[str]) -> pa.ChunkedArray:
    """A list column of class ids as the lists of their names."""
    table = pa.array(names)
    chunks = [pa.ListArray.from_arrays(c.offsets, pc.take(table, c.values)) for c in column.chunks]
    return pa.chunked_array(chunks, type=pa.list_(pa.string()))


def holds_json(source: Source) -> bool:
    """A JSON (Lines) file, which holds lists as lists: a string there is a mistake, not words."""
    return Path(source.path).suffix.lower() in (".json", ".jsonl")


def string_lists(dataset: datasets.Dataset, source: Source, field: str) -> pa.ChunkedArray:
    """Column ``field`` as lists of strings, or a DataError naming the first record where it is not."""
    column, item = dataset.data.column(field), list_feature(dataset, field)
    if is_string_column(dataset, field) and not holds_json(source):  # CSV: words separated by spaces
        return pc.utf8_split_whitespace(column)
    strings = isinstance(item, datasets.Value) and item.dtype in ("string", "large_string")
    if strings and not column.null_count and not pc.list_flatten(column).null_count:
        return column.cast(pa.list_(pa.string()))
    if isinstance(item, datasets.ClassLabel) and not column.null_count:
        return named_class_ids(column, list(item.names))
    found = first_row(dataset, field, lambda value: not is_string_list(value))
    row, value = found if found is not None else (0, dataset[0][field])
    hint = "" if holds_json(source) else " (in a CSV cell: the items separated by spaces)"
    raise DataError(
        f"{source.where(row)}: field {field!r} must be a list of strings{hint}, got {short(value)}"
    )


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def first_true(bad: Any) -> int:
    """The first row where the boolean column ``bad`` is true."""
    return int(pc.index(bad, True).as_py())


class TaggedSplit:
    """One split's words and tags as two Arrow list columns, checked."""

    def __init__(self, reader: SplitReader, source: Source, tokens_field: str, tags_field: str) -> None:
        rows = reader.read(source)
        require_fields(rows, source, (tokens_field, tags_field))
        self.source, self.tags_field = source, tags_field
        self.tokens = string_lists(rows, source, tokens_field)
        self.tags = string_lists(rows, source, tags_field)
        words = pc.list_value_length(self.tokens)
        empty = pc.equal(words, 0)
        if pc.any(empty).as_py():
            row = first_true(empty)
            raise DataError(
                f"{source.where(row)}: field {tokens_field!r} is an empty list; give it the words"
            )
        differ = pc.not_equal(words, pc.list_value_length(self.tags))
        if pc.any(differ).as_py():
            row = first_true(differ)
            raise DataError(
                f"{source.where(row)}: {words[row].as_py()} tokens but {len(self.tags[row])} tags; "
                f"give {tags_field!r} one tag per token"
            )
        self.tag_names = sorted(pc.unique(pc.list_flatten(self.tags)).to_pylist())
        wrong = [name for name in self.tag_names if not is_tag(name)]
        if wrong:
            raise DataError(f"{self.where_tag(wrong[0])}: tag {wrong[0]!r} is not {TAG_FORM}")

    def __len__(self) -> int:
        return len(self.tokens)

    def where_tag(self, name: str) -> str:
        """Where the first record with tag ``name`` is (an error path: read row by row)."""
        for row, tags in enumerate(self.tags.to_pylist()):
            if name in tags:
                return self.source.where(row)
        return self.source.name

    def require_known(self, names: list[str], trained_on: str) -> None:
        """Every tag is one of ``names`` (the training split's)."""
        unknown = sorted(set(self.tag_names) - set(names))
        if unknown:
            raise DataError(
                f"{self.where_tag(unknown[0])}: tag {unknown[0]!r} never appears in {trained_on}; "
                "every validation tag must be one the model is trained on"
            )

    def dataset(self) -> datasets.Dataset:
        """The words and tags alone, under the fields ``tokens`` and ``tags``."""
        return datasets.Dataset(pa.table({"tokens": self.tokens, "tags": self.tags}))
