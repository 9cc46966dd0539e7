"""Class labels of classification data: names and ids from a label column, checked column-wise.

Labels are integers (class ids from 0, kept as they are) or strings (ids in sorted order); a hub
dataset's ``ClassLabel`` column brings its names and ids. Arrow compute checks a whole column at once;
only when it finds a problem is the column read row by row, to name the first bad record. Shared by the
classifying model types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from .loader import DataError
from .sources import Source, first_row, is_string_column

ARTICLE = {"integer": "an", "string": "a"}  # of each label kind, in messages
MAX_UNUSED_LABEL_IDS = 100  # integer labels may skip ids (classes absent from the training data), up to this


def label_kind(label: Any) -> str | None:
    # bool is an int subclass in Python, but true/false are not class ids.
    return {int: "integer", str: "string"}.get(type(label))


@dataclass(frozen=True)
class Classes:
    """The class names by id, and whether the data's labels are the ids themselves or names."""

    names: list[str]
    kind: str  # "integer": labels are ids; "string": labels are names
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", {name: number for number, name in enumerate(self.names)})

    def known(self, label: Any) -> bool:
        if label_kind(label) != self.kind:
            return False
        return 0 <= label < len(self.names) if self.kind == "integer" else label in self.index

    def ids(self, labels: list[Any]) -> list[int]:
        return list(labels) if self.kind == "integer" else [self.index[label] for label in labels]


def is_fractional_or_other(label: Any) -> bool:
    return not (isinstance(label, float) and label.is_integer())


def is_integer_column(dataset: datasets.Dataset, name: str) -> bool:
    feature, column = dataset.features[name], dataset.data.column(name)
    plain = isinstance(feature, (datasets.Value, datasets.ClassLabel)) and pa.types.is_integer(column.type)
    return plain and not column.null_count


def read_classes(dataset: datasets.Dataset, source: Source, name: str) -> Classes:
    """The classes of a training split's label column ``name``."""
    feature = dataset.features[name]
    if is_string_column(dataset, name):
        return Classes(sorted(pc.unique(dataset.data.column(name)).to_pylist()), "string")
    if not is_integer_column(dataset, name):
        first = dataset[0][name]
        first_kind = label_kind(first)
        if first_kind is None:  # e.g. a float column (1 and 1.5 read as 1.0, 1.5): name a fractional one
            found = first_row(dataset, name, is_fractional_or_other)
        else:
            found = first_row(dataset, name, lambda label: label_kind(label) != first_kind)
        row, label = found if found is not None else (0, first)
        kind = label_kind(label)
        if kind is None or first_kind is None:
            raise DataError(f"{source.where(row)}: label {label!r} must be an integer or a string")
        raise DataError(
            f"{source.name}: {source.record(row)} has {ARTICLE[kind]} {kind} label, "
            f"{source.record(0)} {ARTICLE[first_kind]} {first_kind} label; use one kind"
        )
    column = dataset.data.column(name)
    if pc.min(column).as_py() < 0:
        row = pc.index(pc.less(column, 0), True).as_py()
        raise DataError(f"{source.where(row)}: label {dataset[row][name]} is negative; ids start at 0")
    if isinstance(feature, datasets.ClassLabel):
        return Classes(list(feature.names), "integer")
    largest = pc.max(column).as_py()
    used = pc.count_distinct(column).as_py()
    unused = largest + 1 - used
    if unused > max(MAX_UNUSED_LABEL_IDS, 10 * used):
        # A typo (1000000 among 0, 1, 2) would train a head of a million classes for hours.
        row = pc.index(column, largest).as_py()
        raise DataError(
            f"{source.where(row)}: label {largest} makes a head of {largest + 1} classes, {unused} of them "
            f"never used ({used} distinct labels occur); renumber the labels from 0, or write them as strings"
        )
    return Classes([str(number) for number in range(largest + 1)], "integer")


def require_known(
    dataset: datasets.Dataset, source: Source, name: str, classes: Classes, trained_on: str
) -> None:
    """Every label of a validation split is one of the training classes."""
    column = dataset.data.column(name)
    if classes.kind == "string" and is_string_column(dataset, name):
        if pc.all(pc.is_in(column, value_set=pa.array(classes.names))).as_py():
            return
    elif (
        classes.kind == "integer"
        and is_integer_column(dataset, name)
        and pc.min(column).as_py() >= 0
        and pc.max(column).as_py() < len(classes.names)
    ):
        return
    found = first_row(dataset, name, lambda label: not classes.known(label))
    if found is not None:
        raise DataError(
            f"{source.where(found[0])}: label {found[1]!r} never appears in {trained_on}; "
            "every validation label must be one the model is trained on"
        )
