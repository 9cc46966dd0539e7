"""fsdp2's checkpoint directories and sharding plan, in this process (world size 1, no torchrun): nothing
read from them runs code, a torn one is passed over, a background write saves the state of its step.
"""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest
import torch
from conftest import read_metrics
from inprocess import StopAfter, fit
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter

from {{ cookiecutter.package_name }}.config import (
    ConfigError,
    load_config,
)
from {{ cookiecutter.package_name }}.config.constants import (
    MODEL_TYPE,
)
from {{ cookiecutter.package_name }}.launch.preemption import (
    Preempted,
)

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.parallel.checkpoint import (
    Checkpointer,
    CheckpointError,
)
from {{ cookiecutter.package_name }}.parallel.fsdp import (
    shard_blocks,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)
from {{ cookiecutter.package_name }}.parallel.sharded_checkpoint import (
    IndexReader,
    ShardedDirectory,
    read_index,
    tensors_of,
)
from {{ cookiecutter.package_name }}.parallel.training_state import (
    Progress,
    TrainingState,
)

FSDP2 = ["distributed.strategy=fsdp2", *(["distributed.fsdp_wrap=Linear"] if MODEL_TYPE == "custom" else [])]
RUN = ["train.max_steps=4", "checkpoint.every_steps=2", "train.log_every_steps=1", "data.num_workers=0"]
ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "run"


class Planted:
    """A pickle that would create ``marker`` when unpickled by a loader that runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_planted_index_runs_no_code_and_a_torn_checkpoint_is_passed_over(deterministic, out: Path) -> None:
    run = [*deterministic, *RUN, *FSDP2, f"output_dir={out}"]
    fit(run)
    checkpoints = out / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000002", "step-00000004"]
    read_index(checkpoints / "step-00000002")  # DCP's own index passes the restricted unpickler
    marker = out / "code-ran"
    (checkpoints / "step-00000004" / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    torn = checkpoints / "step-00000003"
    torn.mkdir()
    for path in (checkpoints / "step-00000002").iterdir():
        torn.joinpath(path.name).write_bytes(path.read_bytes()[: 200 if path.suffix == ".distcp" else None])
    (out / "final").rename(out / "final-before")  # so the rerun resumes instead of stopping

    fit(run)
    assert not marker.exists()
    steps = [r["step"] for r in read_metrics(out) if "loss" in r]
    assert steps == [1, 2, 3, 4]  # resumed from step 2: the planted and the torn one were passed over


def test_retention_keeps_newer_directories_and_the_one_just_written(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path, ENV, keep_last=2, layout=ShardedDirectory(ENV, asynchronous=False))
    for step in (1, 2, 3, 4, 9):  # 9: newer than the run writes now, e.g. skipped as unreadable at resume
        (tmp_path / f"step-{step:08d}").mkdir()
        (tmp_path / f"step-{step:08d}" / "__0_0.distcp").touch()
    checkpointer.retain(tmp_path / "step-00000004")
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "step-00000003",
        "step-00000004",
        "step-00000009",
    ]


def test_a_checkpoint_of_the_other_strategy_stops_the_run_naming_it(deterministic, out: Path) -> None:
    run = [*deterministic, *RUN, "train.max_steps=2", f"output_dir={out}"]
    fit(run)  # ddp
    with pytest.raises(CheckpointError) as refused:
        fit([*run, *FSDP2])
    message = str(refused.value)
    assert "none can be read" in message and "resume with distributed.strategy=ddp" in message
    assert "\n" not in message


def test_preemption_waits_for_the_background_write(deterministic, out: Path) -> None:
    run = [*deterministic, *RUN, *FSDP2, "checkpoint.async=true", f"output_dir={out}"]
    with pytest.raises(Preempted):
        fit(run, StopAfter(3))
    checkpoints = out / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000002", "step-00000003"]
    assert (checkpoints / "step-00000003" / ".metadata").is_file()


def test_a_background_write_saves_the_state_of_its_step(tmp_path: Path, monkeypatch) -> None:
    """The write is held until training has changed the weights: it must still save the old ones."""
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    state = TrainingState(
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        progress=Progress(step=1),
    )
    saved = {name: value.clone() for name, value in model.state_dict().items()}
    training_went_on = threading.Event()
    write_data = FileSystemWriter.write_data

    def held_write(self, *args, **kwargs):
        assert training_went_on.wait(timeout=60)
        return write_data(self, *args, **kwargs)

    monkeypatch.setattr(FileSystemWriter, "write_data", held_write)
    layout = ShardedDirectory(ENV, asynchronous=True)
    published: list[Path] = []
    header = {"world_size": 1, "config": "", "rng": []}
    layout.write(state, header, tmp_path / "step-00000001", published.append)
    with torch.no_grad():
        model.weight.add_(1.0)  # the next optimizer step
    assert not published  # still being written
    training_went_on.set()
    layout.wait()
    assert published == [tmp_path / "step-00000001"]

    fresh = nn.Linear(4, 3)
    restored = TrainingState(fresh, torch.optim.AdamW(fresh.parameters()), state.scheduler, state.scaler)
    tensors, _ = tensors_of(restored)
    torch.distributed.checkpoint.load(
        tensors, storage_reader=IndexReader(tmp_path / "step-00000001"), no_dist=True
    )
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, saved[name]), name


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)


class Stack(nn.Module):
    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 10)
        if tied:
            self.layers[0].linear.weight = self.head.weight


def test_the_blocks_sharded_one_by_one() -> None:
    model = Stack()
    assert shard_blocks(model, "") == [model.layers[1], model.layers[0]]  # the layers of the block list
    model._no_split_modules = ["Block", "Embedding"]
    assert shard_blocks(model, "") == [model.layers[1], model.layers[0], model.embedding]
    assert shard_blocks(model, "Linear") == [model.head, model.layers[1].linear, model.layers[0].linear]
    tied = Stack(tied=True)
    assert shard_blocks(tied, "") == [tied.layers[1]]  # a block sharing a weight stays with the root


def test_a_model_without_blocks_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        shard_blocks(nn.Sequential(nn.Linear(2, 2), nn.GELU()), "")
    message = str(refused.value)
    assert message.startswith("distributed.fsdp_wrap: Sequential declares no blocks") and "\n" not in message
    assert "distributed.fsdp_wrap=<class name>" in message
    with pytest.raises(ConfigError, match="no module of class Block"):
        shard_blocks(nn.Sequential(nn.Linear(2, 2)), "Block")


def test_background_checkpoints_need_fsdp2() -> None:
    with pytest.raises(ConfigError, match=r"checkpoint\.async: needs distributed\.strategy=fsdp2"):
        load_config(["checkpoint.async=true", "distributed.strategy=ddp"])
    config = load_config(["checkpoint.async=true", "distributed.strategy=fsdp2"])
    assert config.checkpoint.async_ and "  async: true" in config.to_yaml()
