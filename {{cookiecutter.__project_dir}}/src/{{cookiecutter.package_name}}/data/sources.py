"""One split of data as a ``datasets.Dataset``, read the way Hugging Face's ``load_dataset`` reads it.

A split comes from a local file (JSON Lines, JSON, CSV or Parquet, by extension) or from
``data.hub_dataset``: a hub id, a local folder of data files, or a folder saved with ``save_to_disk``.
Every problem is one ``DataError`` line naming the file and line (JSON Lines) or row. Used by the model
types that read data through ``datasets``; a custom project does not import it.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import datasets

from ..config.hub_data import HubDataSettings
from .loader import DataError, iter_jsonl

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes at a folder's top
SCAN_BATCH = 10_000  # rows per step of a scan for the first bad record (error paths only)


def quiet_datasets() -> None:
    """No progress bars or per-file error logs: the job log gets one line per problem, from here."""
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)


@dataclass(frozen=True)
class Source:
    """Where one split comes from: a local data file, or a split of ``data.hub_dataset``."""

    path: str = ""
    hub: str = ""
    split: str = ""

    @property
    def name(self) -> str:
        return self.path or f"{self.hub}[{self.split}]"

    @property
    def is_json_lines(self) -> bool:
        return Path(self.path).suffix.lower() == ".jsonl"

    def where(self, row: int) -> str:
        """How a message names record ``row`` (from 0): ``file:line`` for JSON Lines, else its row."""
        if self.is_json_lines:
            return f"{self.path}:{json_lines_line(self.path, row)}"
        return f"{self.name}: row {row + 1}"

    def record(self, row: int) -> str:
        """How a message names record ``row`` (from 0) after its source's name: ``line N`` or ``row N``."""
        return f"line {json_lines_line(self.path, row)}" if self.is_json_lines else f"row {row + 1}"

    def lacks(self, row: int, field: str) -> bool:
        """Whether record ``row`` has no ``field`` at all (JSON Lines), rather than a null in it."""
        if not self.is_json_lines:
            return True
        line = json_lines_line(self.path, row)
        with open(self.path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if number == line:
                    return field not in json.loads(raw)
        return True

    def fingerprint(self) -> Any:
        """What identifies the data without reading it (local files and folders); None for a hub id."""
        target = Path(self.path or self.hub)
        if target.is_file():
            return file_stat(target)
        if target.is_dir():
            return sorted(file_stat(path) for path in target.rglob("*") if path.is_file())
        return None


def file_stat(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def json_lines_line(path: str, row: int) -> int:
    """The line number of record ``row``: records are the lines that are not blank."""
    seen = -1
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                seen += 1
                if seen == row:
                    return number
    return number + 1 if seen >= 0 else 1


def split_sources(settings: HubDataSettings, train_file: str, val_file: str) -> tuple[Source, Source | None]:
    """The training and validation sources the config names (no validation: None)."""
    if settings.hub_dataset:
        hub = settings.hub_dataset
        val = Source(hub=hub, split=settings.val_split) if settings.val_split else None
        return Source(hub=hub, split=settings.train_split), val
    return Source(path=train_file), Source(path=val_file) if val_file else None


class SplitReader:
    """Reads sources into memory-mapped ``datasets.Dataset`` splits.

    Local data is converted to Arrow in a scratch folder under ``cache_root``, removed on exit (the
    preprocessed result is what the cache keeps); a hub id uses the Hugging Face cache, as
    ``load_dataset`` does by default.
    """

    def __init__(self, cache_root: Path) -> None:
        self.cache_root = cache_root
        self._scratch: Path | None = None
        self._hub: dict[str, datasets.DatasetDict] = {}

    def __enter__(self) -> SplitReader:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def scratch(self) -> str:
        if self._scratch is None:
            self.cache_root.mkdir(parents=True, exist_ok=True)
            self._scratch = Path(tempfile.mkdtemp(prefix=".raw-", dir=self.cache_root))
        return str(self._scratch)

    def read(self, source: Source) -> datasets.Dataset:
        dataset = self._read_file(source) if source.path else self._read_hub_split(source)
        if not len(dataset):
            what = "the file is empty" if source.path else "the split is empty"
            raise DataError(f"{source.name}: no records; {what}")
        return dataset

    def _read_file(self, source: Source) -> datasets.Dataset:
        path = Path(source.path)
        kind = FILE_FORMATS.get(path.suffix.lower())
        if path.is_dir():
            raise DataError(
                f"{path}: a folder, not a data file; to read a folder use data.hub_dataset={path}"
            )
        if kind is None:
            known = ", ".join(FILE_FORMATS)
            raise DataError(f"{path}: unknown file type {path.suffix!r}; use one of {known}")
        try:
            return load(kind, data_files={"train": str(path)}, split="train", cache_dir=self.scratch())
        except DataError:
            raise
        except Exception as error:
            if kind == "json" and starts_like_json_lines(path):
                for _ in iter_jsonl(path, ()):  # names the first line that is not a JSON object
                    pass
            raise DataError(f"{path}: not readable as {kind.upper()} ({reason(error)})") from None

    def _read_hub_split(self, source: Source) -> datasets.Dataset:
        if source.hub not in self._hub:
            self._hub[source.hub] = self._load_hub(source.hub)
        splits = self._hub[source.hub]
        if source.split not in splits:
            names = ", ".join(splits) or "none"
            raise DataError(
                f"data.hub_dataset={source.hub!r} has no split {source.split!r} (it has: {names}); "
                "set data.train_split / data.val_split (data.val_split= for no evaluation)"
            )
        return splits[source.split]

    def _load_hub(self, hub: str) -> datasets.DatasetDict:
        folder = Path(hub)
        try:
            if folder.is_dir() and any((folder / marker).is_file() for marker in SAVED_MARKERS):
                saved = datasets.load_from_disk(str(folder))
                return saved if isinstance(saved, datasets.DatasetDict) else datasets.DatasetDict(train=saved)
            cache_dir = self.scratch() if folder.is_dir() else None  # a hub id: the Hugging Face cache
            return load(hub, cache_dir=cache_dir)
        except DataError:
            raise
        except Exception as error:
            what = (
                "a local dataset folder"
                if folder.is_dir()
                else "a hub dataset (offline: from the local cache)"
            )
            raise DataError(f"data.hub_dataset={hub!r}: cannot load it as {what} ({reason(error)})") from None


def load(path: str, **options: Any) -> Any:
    """``datasets.load_dataset``, its exceptions unwrapped to the reader's own."""
    try:
        return datasets.load_dataset(path, **options)
    except datasets.exceptions.DatasetGenerationError as error:
        raise (error.__cause__ or error) from None


@contextmanager
def naming_undecodable(*sources: Source | None) -> Iterator[None]:
    """Text that is not UTF-8 surfaces only when a string is read (in ``map``, say): name its line."""
    try:
        yield
    except UnicodeDecodeError as error:
        for source in sources:
            if source is not None and source.path and starts_like_json_lines(Path(source.path)):
                for _ in iter_jsonl(source.path, ()):  # names the first line that is not UTF-8
                    pass
        names = ", ".join(source.name for source in sources if source is not None)
        raise DataError(f"{names}: text that is not UTF-8 ({reason(error)}); save it as UTF-8") from None


def starts_like_json_lines(path: Path) -> bool:
    """JSON Lines rather than one JSON document (an array), which has no meaningful line numbers."""
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip()
    return not head.startswith(b"[")


def reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def python_values(dataset: datasets.Dataset, field: str) -> Iterator[tuple[int, Any]]:
    """(row, value) of one column, a batch at a time: for finding the first bad record."""
    column = dataset.select_columns([field])
    for start in range(0, len(column), SCAN_BATCH):
        for offset, value in enumerate(column[start : start + SCAN_BATCH][field]):
            yield start + offset, value


def first_row(dataset: datasets.Dataset, field: str, bad: Callable[[Any], bool]) -> tuple[int, Any] | None:
    return next(((row, value) for row, value in python_values(dataset, field) if bad(value)), None)


def is_string_column(dataset: datasets.Dataset, field: str) -> bool:
    """Strings in every row, per the column's feature (a ``Json`` feature also stores strings: JSON text)."""
    feature = dataset.features[field]
    plain = isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
    return plain and not dataset.data.column(field).null_count


def require_fields(dataset: datasets.Dataset, source: Source, fields: tuple[str, ...]) -> None:
    """Every record has each of ``fields`` (a null is a wrong value, checked later; a gap is missing)."""
    for field in fields:
        if field not in dataset.column_names:
            raise DataError(f"{source.where(0)}: missing field {field!r}")
    gaps = [found[0] for field in fields if (found := first_null(dataset, field)) is not None]
    for row in sorted(gaps):
        for field in fields:
            if dataset[row][field] is None and source.lacks(row, field):
                raise DataError(f"{source.where(row)}: missing field {field!r}")


def first_null(dataset: datasets.Dataset, field: str) -> tuple[int, None] | None:
    if not dataset.data.column(field).null_count:
        return None
    return first_row(dataset, field, lambda value: value is None)


def require_text(dataset: datasets.Dataset, source: Source, field: str) -> None:
    """Every record's ``field`` is a string."""
    if is_string_column(dataset, field):
        return
    found = first_row(dataset, field, lambda value: not isinstance(value, str))
    if found is not None:
        raise DataError(f"{source.where(found[0])}: field {field!r} must be a string")


def read_text_split(
    reader: SplitReader, source: Source, text_field: str, *other_fields: str
) -> datasets.Dataset:
    """A split whose every record has a string in ``text_field`` (and has the other fields)."""
    rows = reader.read(source)
    require_fields(rows, source, (text_field, *other_fields))
    require_text(rows, source, text_field)
    return rows
