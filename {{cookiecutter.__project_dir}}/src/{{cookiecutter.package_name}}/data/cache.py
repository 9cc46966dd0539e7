"""Preprocess once, memory-map everywhere: the preprocessed data under ``output_dir/cache``.

One rank builds the cache; the others wait for it without any collective, so preprocessing may take as
long as it takes (``distributed.timeout_s`` bounds collectives only). The builder is global rank 0 or, on
a node that does not see rank 0's ``output_dir`` (no shared filesystem), that node's first rank: once per
filesystem, not once per rank. It publishes the outcome, the cache folder's name or its error in one
line, on the process group's store; the others wait on the store for that key, which wakes them the moment
it is set, one of them logging a line every minute.

A cache folder holds Arrow files and ``manifest.json``: data, nothing that is unpickled, so a file planted
in ``output_dir`` cannot run code. It is named by a key of everything the data was made from, written
under a temporary name and renamed when complete; a folder that does not read back is built again. Every
rank memory-maps the same files, so a node's page cache holds one copy, whatever the number of ranks and
DataLoader workers, and a process's memory does not grow with the data set.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import datasets
import pyarrow
import torch.distributed as dist

from ..observe.log import log
from ..parallel.process_group import DistEnv, broadcast_object, control_store, gather_objects
from .loader import DataError

MANIFEST = "manifest.json"
FORMAT = 1  # of the manifest; part of reading it back, so another layout is rebuilt, never misread
# A waiting rank blocks on the store until the builder publishes, so it starts the moment the data is
# there: polling every 0.5 s started the waiting ranks a median 0.25 s late after a quick build, and even a
# doubling pause from 10 ms left them up to 0.5 s behind (measured), while the first step waits for the
# last rank. The wait wakes once a minute only, for the progress line.
PROGRESS_EVERY_S = 60.0
MIN_ROWS_PER_PROCESS = 10_000  # below this, starting processes costs more than it saves
# Rows per Arrow record batch of a cache file (datasets writes 1,000). Opening a memory-mapped file reads
# every batch's header, and each read maps the pages around it: at 1,000 rows a batch, opening a cache of
# a million samples added 80 MB to every rank's resident memory (measured); at 20,000, a few.
RECORD_BATCH_ROWS = 20_000
_calls = itertools.count()  # every rank prepares the same data in the same order: one store key per call


class Recipe(Protocol):
    """What a model type preprocesses: a key of everything the result depends on, and the build."""

    name: str
    """The cache folder's prefix (the model type)."""

    def key(self) -> str: ...

    def build(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        """The splits, written as Arrow files into ``folder`` (see ``arrow_file``), and JSON metadata."""
        ...


@dataclass
class Prepared:
    folder: Path
    splits: dict[str, datasets.Dataset]
    meta: dict[str, Any]


def processes(rows: int, configured: int = 0) -> int:
    """Processes for ``map`` over ``rows``: ``configured``, or every core this process may use."""
    if configured:
        return max(1, min(configured, rows))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, rows // MIN_ROWS_PER_PROCESS))


def arrow_file(folder: Path, split: str) -> str:
    """Where ``map`` writes a split (``map(cache_file_name=...)``; with processes, one file each)."""
    return str(folder / f"{split}.arrow")


def map_batches(
    rows: datasets.Dataset,
    function: Callable[[dict[str, list]], dict[str, list]],
    features: datasets.Features,
    file: str,
    fingerprint: str,
    workers: int = 1,
    **options: Any,
) -> datasets.Dataset:
    """``rows`` mapped batch by batch into the Arrow file ``file``, holding only ``function``'s columns
    (``features``), in ``workers`` processes when more than one; ``fingerprint`` names the result in
    place of datasets' hash of ``function``, which may not pickle the same twice."""
    return rows.map(
        function,
        batched=True,
        num_proc=workers if workers > 1 else None,
        remove_columns=rows.column_names,
        features=features,
        writer_batch_size=RECORD_BATCH_ROWS,
        cache_file_name=file,
        new_fingerprint=fingerprint,
        **options,
    )


def tokenize_split(
    rows: datasets.Dataset,
    tokenize: Callable[[dict[str, list]], dict[str, list]],
    features: datasets.Features,
    folder: Path,
    split: str,
    configured_processes: int,
    unit: str,
) -> datasets.Dataset:
    """A split tokenized into the cache ``folder`` (``map_batches``) in as many processes as its size is
    worth (``processes``), logging the rate in ``unit`` (texts, sentences, pairs)."""
    workers = processes(len(rows), configured_processes)
    started = time.monotonic()
    name = f"{folder.name[-16:]}-{split}"
    tokenized = map_batches(rows, tokenize, features, arrow_file(folder, split), name, workers)
    seconds = time.monotonic() - started
    log.info(
        f"tokenized {len(rows)} {split} {unit} in {seconds:.1f} s with {workers} process(es): "
        f"{len(rows) / max(seconds, 1e-9):.0f} {unit}/s"
    )
    return tokenized


def prepare(recipe: Recipe, root: Path, env: DistEnv) -> Prepared:
    """The recipe's data, built once per filesystem and memory-mapped on every rank."""
    builders = plan_builders(root, env)
    builder = builders[env.rank]
    store_key = f"data-cache/{next(_calls)}/{builder}"
    store = control_store()
    if builder == env.rank:
        try:
            prepared = build_or_open(recipe, root)
        except Exception as error:
            if store is not None:
                failed = {"error": one_line(error), "data_error": isinstance(error, DataError)}
                store.set(store_key, json.dumps(failed))
            raise
        if store is not None:
            store.set(store_key, json.dumps({"folder": prepared.folder.name}))
        return prepared
    assert store is not None  # more than one rank
    waiting = [rank for rank, other in enumerate(builders) if other == builder and rank != builder]
    wait_for(published(store, store_key), builder, reporting=env.rank == waiting[0])
    outcome = json.loads(store.get(store_key))
    if "error" in outcome:
        if outcome["data_error"]:
            raise DataError(outcome["error"])
        raise RuntimeError(f"rank {builder} failed to preprocess the data: {outcome['error']}")
    folder = root / outcome["folder"]
    found = open_prepared(folder)
    if found is None:
        raise DataError(
            f"{folder}: the data rank {builder} preprocessed does not read here; delete it and rerun"
        )
    return found


def wait_for(ready: Callable[[float], bool], builder: int, reporting: bool) -> None:
    """Wait until ``ready(seconds)``, which blocks up to ``seconds`` and says whether the outcome is
    published, with a progress line a minute when ``reporting``. No collective runs meanwhile, so the
    process group's timeout does not apply."""
    minutes = 0
    while not ready(PROGRESS_EVERY_S):
        minutes += 1
        if reporting:
            log.warning(f"waiting for rank {builder} to preprocess the data: {minutes} min so far")


def published(store: dist.Store, key: str) -> Callable[[float], bool]:
    """Whether ``key`` is set on ``store``, waiting up to the given seconds for it."""

    def ready(seconds: float) -> bool:
        try:
            store.wait([key], timedelta(seconds=seconds))
        except dist.DistStoreError:  # the wait timed out; a lost store raises DistNetworkError instead
            return False
        return True

    return ready


def plan_builders(root: Path, env: DistEnv) -> list[int]:
    """Each rank's builder: rank 0 where rank 0's cache folder is visible, else the node's first rank.

    Rank 0 creates a probe file in the cache folder and every rank looks for it: two quick collectives,
    before any preprocessing starts.
    """
    if env.world_size == 1:
        return [0]
    probe = None
    if env.is_main:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{uuid.uuid4().hex}"
        probe.touch()
    name = broadcast_object(probe.name if probe else None, env)
    node = os.environ.get("GROUP_RANK") or socket.gethostname()  # torchrun's node index
    seen = gather_objects((node, (root / name).exists()), env)
    if probe is not None:
        probe.unlink()
    return builders_by_rank(seen)


def builders_by_rank(seen: list[tuple[str, bool]]) -> list[int]:
    """From each rank's (node, sees rank 0's files): rank 0 for those who see them, else the node's first."""
    first_on_node: dict[str, int] = {}
    for rank, (node, _) in enumerate(seen):
        first_on_node.setdefault(node, rank)
    return [0 if sees else first_on_node[node] for node, sees in seen]


def build_or_open(recipe: Recipe, root: Path) -> Prepared:
    folder = root / f"{recipe.name}-{recipe.key()}"
    prepared = open_prepared(folder)
    if prepared is not None:
        log.info(f"preprocessed data: {folder}, from an earlier run")
        return prepared
    if folder.exists():  # torn, foreign or planted: built again, never trusted
        shutil.rmtree(folder)
    for stale in root.glob(f".{folder.name}.partial-*"):  # left by a build that was killed
        shutil.rmtree(stale, ignore_errors=True)
    partial = root / f".{folder.name}.partial-{uuid.uuid4().hex}"
    partial.mkdir(parents=True)
    started = time.monotonic()
    log.info(f"preprocessing the data once, into {folder}")
    try:
        splits, meta = recipe.build(partial)
        write_manifest(partial, splits, meta)
        try:
            partial.rename(folder)
        except OSError:  # another builder finished first (a filesystem seen late): use its result
            if open_prepared(folder) is None:
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    del splits
    # The build's Arrow buffers are freed, but pyarrow's pool (mimalloc) keeps their pages: ~30 MiB that
    # the builder alone would hold through training. Every rank reads the memory-mapped files from here.
    pyarrow.default_memory_pool().release_unused()
    built = open_prepared(folder)
    if built is None:
        raise DataError(f"{folder}: the data just preprocessed does not read back; is the disk full?")
    log.info(f"preprocessed in {time.monotonic() - started:.1f} s")
    return built


def write_manifest(folder: Path, splits: dict[str, datasets.Dataset], meta: dict[str, Any]) -> None:
    files = {}
    for name, dataset in splits.items():
        paths = [Path(item["filename"]) for item in dataset.cache_files]
        written_here = all(path.resolve().parent == folder.resolve() for path in paths)
        assert paths and written_here, f"{name} is not written to {folder}"
        files[name] = [path.name for path in paths]
    manifest = {"format": FORMAT, "splits": files, "meta": meta}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def open_prepared(folder: Path) -> Prepared | None:
    """The cache folder's splits, memory-mapped; None when it is absent or does not read back whole."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if manifest["format"] != FORMAT:
            return None
        splits = {}
        for name, files in manifest["splits"].items():
            if not files or any(Path(file).name != file for file in files):
                return None
            parts = [datasets.Dataset.from_file(str(folder / file)) for file in files]
            splits[name] = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
        return Prepared(folder, splits, manifest["meta"])
    except Exception:  # unreadable for whatever reason: the builder builds it again
        return None


def one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
