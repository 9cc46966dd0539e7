"""Rows of memory-mapped Arrow columns, read without copying the table: what map-style Datasets index.

``datasets.Dataset.__getitem__`` converts each row to Python objects (tens of microseconds); these views
cost a few, and hold no per-row Python objects, so forked DataLoader workers share every page.
"""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np
import pyarrow as pa


class ChunkedColumn:
    """One column of a dataset, as its Arrow chunks (record batches) and where each starts."""

    def __init__(self, dataset: datasets.Dataset, name: str) -> None:
        self.chunks: list[Any] = list(dataset.data.column(name).chunks)
        self.starts = np.cumsum([0, *(len(chunk) for chunk in self.chunks)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """(chunk, row within it) of row ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        chunk = int(np.searchsorted(self.starts, index, side="right")) - 1
        return chunk, index - int(self.starts[chunk])


class IntegerLists(ChunkedColumn):
    """A column of integer lists (token ids): row i as a read-only numpy view into the mapped file."""

    def __init__(self, dataset: datasets.Dataset, name: str) -> None:
        super().__init__(dataset, name)
        # List offsets index the chunk's whole value buffer, slice offset included.
        self.offsets = [chunk.offsets.to_numpy() for chunk in self.chunks]
        self.values = [chunk.values.to_numpy() for chunk in self.chunks]

    def __getitem__(self, index: int) -> np.ndarray:
        chunk, row = self.locate(index)
        offsets = self.offsets[chunk]
        return self.values[chunk][offsets[row] : offsets[row + 1]]

    def lengths(self) -> np.ndarray:
        """Every row's length (4 bytes a row: the one per-row array a rank holds)."""
        if not self.offsets:
            return np.zeros(0, dtype=np.int32)
        return np.concatenate([np.diff(offsets).astype(np.int32) for offsets in self.offsets])


class Integers(ChunkedColumn):
    """A column of integers (labels): row i as a Python int."""

    def __init__(self, dataset: datasets.Dataset, name: str) -> None:
        super().__init__(dataset, name)
        self.values = [chunk.to_numpy() for chunk in self.chunks]

    def __getitem__(self, index: int) -> int:
        chunk, row = self.locate(index)
        return int(self.values[chunk][row])


def flat_values(lists: pa.ChunkedArray) -> np.ndarray:
    """The concatenated values of a (sliced) list column: e.g. the token stream of a range of documents."""
    return np.concatenate([chunk.flatten().to_numpy() for chunk in lists.chunks] or [np.zeros(0, np.int32)])
