"""fsdp2's checkpoints: one directory per checkpoint, written by every rank through
``torch.distributed.checkpoint`` (DCP), readable by any number of processes.

    checkpoints/step-00000123/
        __0_0.distcp, __1_0.distcp, ...   each rank's shards of the model (LoRA: of its trainable
                                          parameters) and of the optimizer state
        .metadata                         DCP's index of the shards (rank 0)
        trainer.pt                        rank 0: scheduler, scaler, progress (the sampler's position),
                                          optimizer hyper-parameters, every rank's RNG states, the config

The directory is written as ``.step-00000123.partial`` and renamed by rank 0 once DCP reports every rank's
shards written (and fsynced): a kill mid-write, synchronous or in the background, leaves the previous
checkpoint as the newest. On load DCP reshards: a checkpoint of 4 processes resumes on 2, or on 1.

Nothing read from here runs code: DCP's ``.metadata`` is a pickle, so it is read by an unpickler that
builds DCP's index classes and nothing else; tensors are read with ``weights_only=True`` and only tensors
are ever requested (DCP unpickles other saved values with ``weights_only=False``); ``trainer.pt`` holds
tensors and plain values and is read with ``weights_only=True``.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from .checkpoint import CheckpointError, fsync_directory
from .process_group import DistEnv, barrier, is_distributed
from .training_state import Progress, TrainingState

FORMAT_VERSION = 1
TRAINER_FILE = "trainer.pt"
SHARD_FILE = re.compile(r"__\d+_\d+\.distcp")
# What DCP's .metadata is made of (torch 2.4 to 2.13), by module; torch dtypes and torch.Size besides.
INDEX_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}
# DCP warns on every call of one process without a process group, which is what no_dist=True asks for.
warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized", UserWarning)


class IndexUnpickler(pickle.Unpickler):
    """Builds DCP's index classes and nothing else: a planted ``.metadata`` cannot call anything."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        if name in INDEX_CLASSES.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint index")


def read_index(directory: Path) -> Metadata:
    with (directory / ".metadata").open("rb") as handle:
        index = IndexUnpickler(handle).load()
    if not isinstance(index, Metadata):
        raise CheckpointError("its .metadata is not a DCP index")
    return index


class IndexReader(FileSystemReader):
    """DCP's file reader with the restricted unpickler for ``.metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        index = read_index(Path(self.path))
        if getattr(index, "storage_meta", None) is None:
            index.storage_meta = StorageMeta()
        assert index.storage_meta is not None
        index.storage_meta.load_id = self.load_id
        return index


def check_shards(directory: Path, index: Metadata) -> None:
    """Every shard the index names is a file of this directory, long enough: a torn copy is unusable."""
    needed: dict[str, int] = {}
    for info in (index.storage_data or {}).values():
        name = info.relative_path
        if not SHARD_FILE.fullmatch(name):
            raise CheckpointError(f"its index names {name!r}, not a shard file of this checkpoint")
        needed[name] = max(needed.get(name, 0), info.offset + info.length)
    for name, size in needed.items():
        present = (directory / name).stat().st_size if (directory / name).is_file() else -1
        if present < size:
            raise CheckpointError(f"{name} is missing or cut short")


def model_options(state: TrainingState) -> StateDictOptions:
    """LoRA: the frozen base is left out (TrainingState.frozen_base), and loading does not miss it."""
    return StateDictOptions(ignore_frozen_params=state.frozen_base, strict=not state.frozen_base)


def tensors_of(state: TrainingState) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The state's tensors, sharded as this run holds them, and the optimizer's hyper-parameters (keyed
    by parameter name, so they fit any world size)."""
    optimizer: Any = get_optimizer_state_dict(state.module, state.optimizer)
    model = get_model_state_dict(state.module, options=model_options(state))
    return {"model": model, "optimizer": optimizer["state"]}, optimizer["param_groups"]


def first_failure(error: CheckpointException) -> BaseException:
    failures = list(error.failures.values())
    return failures[0][0] if failures else error


class ShardedDirectory:
    """The checkpoint layout of fsdp2 (see the module docstring)."""

    def __init__(self, env: DistEnv, asynchronous: bool) -> None:
        self.env = env
        # A background write runs DCP's collectives in another thread: on a group of its own, so they
        # never interleave with the training loop's on the default group.
        self.group = dist.new_group(backend="gloo") if asynchronous and is_distributed() else None
        self.background = ThreadPoolExecutor(1, "checkpoint") if asynchronous else None
        self.pending: Future | None = None

    def path_for(self, directory: Path, step: int) -> Path:
        return directory / f"step-{step:08d}"

    def write(
        self, state: TrainingState, header: dict[str, Any], final: Path, published: Callable[[Path], None]
    ) -> None:
        partial = final.with_name(f".{final.name}.partial")
        tensors, param_groups = tensors_of(state)
        if self.env.is_main:
            partial.mkdir()
            trainer = {
                "format": FORMAT_VERSION,
                **header,
                "param_groups": param_groups,
                "scheduler": state.scheduler.state_dict(),
                "scaler": state.scaler.state_dict(),
                "progress": vars(state.progress).copy(),
            }
            with (partial / TRAINER_FILE).open("wb") as handle:
                torch.save(trainer, handle)
                handle.flush()
                os.fsync(handle.fileno())
        barrier()  # the folder exists before any rank writes into it (and no torn one is being removed)
        writer = FileSystemWriter(partial)  # fsyncs every file it writes
        if self.background is None:
            self._run(lambda: dcp.save(tensors, storage_writer=writer, no_dist=not is_distributed()))
            self._publish(partial, final, published)
            return
        # Returns once the tensors are copied to host memory; the files are written meanwhile.
        upload = self._run(
            lambda: dcp.async_save(
                tensors, storage_writer=writer, process_group=self.group, no_dist=not is_distributed()
            )
        )
        self.pending = self.background.submit(self._publish_when_written, upload, partial, final, published)

    def _publish_when_written(
        self, upload: Future, partial: Path, final: Path, published: Callable[[Path], None]
    ) -> None:
        self._run(upload.result)
        self._publish(partial, final, published)

    def _publish(self, partial: Path, final: Path, published: Callable[[Path], None]) -> None:
        """Rank 0 renames the folder once DCP returned there, which it does only after every rank's
        shards are written: then the index, the last file, is written too."""
        if not self.env.is_main:
            return
        shutil.rmtree(final, ignore_errors=True)  # a torn one of the same step, skipped at resume
        partial.rename(final)
        fsync_directory(final.parent)
        published(final)

    @staticmethod
    def _run(action: Callable[[], Any]) -> Any:
        """DCP reports failures as a BaseException gathered from every rank: the first as itself."""
        try:
            return action()
        except CheckpointException as error:
            raise first_failure(error) from None

    def wait(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def read(self, path: Path) -> dict[str, Any]:
        if not path.is_dir():
            raise CheckpointError(
                "a single-file checkpoint of distributed.strategy=ddp; resume with distributed.strategy=ddp"
            )
        trainer = torch.load(path / TRAINER_FILE, map_location="cpu", weights_only=True)
        if not isinstance(trainer, dict) or trainer.get("format") != FORMAT_VERSION:
            raise CheckpointError("not a checkpoint of this project's format")
        check_shards(path, read_index(path))
        return trainer

    def restore(self, path: Path, payload: dict[str, Any], state: TrainingState) -> None:
        tensors, _ = tensors_of(state)  # shaped for this world size: DCP reads each rank's part
        failure = None
        try:
            dcp.load(tensors, storage_reader=IndexReader(path), no_dist=not is_distributed())
        except CheckpointException as error:  # raised on every rank alike
            failure = first_failure(error)
        if failure is not None:
            raise RuntimeError(str(failure).strip() or type(failure).__name__)
        set_model_state_dict(state.module, tensors["model"], options=model_options(state))
        optimizer = {"state": tensors["optimizer"], "param_groups": payload["param_groups"]}
        set_optimizer_state_dict(state.module, state.optimizer, optimizer)
        state.scheduler.load_state_dict(payload["scheduler"])
        state.scaler.load_state_dict(payload["scaler"])
        state.progress = Progress(**payload["progress"])
