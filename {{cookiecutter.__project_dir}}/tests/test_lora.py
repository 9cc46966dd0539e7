"""LoRA adapters (the ``lora`` config section): what checkpoints and ``final/`` hold, and that two DDP
processes and a resume after SIGKILL train what one uninterrupted process trains.

The in-process tests share one short run; the slow ones run real torchrun with 2 gloo processes. A
project rendered with ``finetune=full`` trains adapters with ``lora.*`` overrides once peft is installed.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FAULT_RUN, interrupted_run, read_metrics, run_launch
from process_tree import children, signal_all
from safetensors.torch import load_file
from test_equivalence import FLOAT64, assert_same_tensors, float64_probe
from weights import assert_same_weights, final_weights

from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.config.validation import (
    ConfigError,
)
from {{ cookiecutter.package_name }}.loop.trainer import (
    Trainer,
)
from {{ cookiecutter.package_name }}.model_type.task import (
    TASK,
)

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.parallel.checkpoint import (
    CheckpointError,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    distributed,
)
from {{ cookiecutter.package_name }}.task.hugging_face import (
    load_fine_tuned,
)

pytest.importorskip("peft", reason="LoRA needs peft, which finetune=lora projects install")

# Small adapters without dropout: runs that differ only by their arithmetic.
LORA = ["lora.r=4", "lora.alpha=8", "lora.dropout=0"]
SHORT_RUN = ["train.max_steps=4", "checkpoint.every_steps=2", "train.lr=1e-2", "data.num_workers=0"]


def train(overrides: list[str]) -> tuple[Trainer, Any]:
    """A run in this process (world size 1): its trainer, with the trained model, and its config."""
    config = load_config(overrides)
    with distributed(config.distributed) as env:
        trainer = Trainer(config, TASK, env)
        trainer.fit()
    return trainer, config


@pytest.fixture(scope="module")
def adapted(deterministic_module, tmp_path_factory) -> tuple[Trainer, Any, Path]:
    output_dir = tmp_path_factory.mktemp("lora")
    trainer, config = train([*deterministic_module, *LORA, *SHORT_RUN, f"output_dir={output_dir}"])
    return trainer, config, output_dir


def newest_checkpoint(output_dir: Path) -> dict[str, Any]:
    newest = sorted((output_dir / "checkpoints").glob("step-*.pt"))[-1]
    return torch.load(newest, map_location="cpu", weights_only=True)


def test_checkpoints_hold_the_trainable_parameters_and_their_optimizer_state_only(adapted) -> None:
    trainer, _, output_dir = adapted
    module = trainer.state.module
    parameters = list(module.named_parameters(remove_duplicate=False))  # tied weights by each name
    frozen = {name for name, parameter in parameters if not parameter.requires_grad}
    trainable = {name for name, parameter in module.named_parameters() if parameter.requires_grad}
    assert all("lora_" in name or "modules_to_save" in name for name in trainable), sorted(trainable)
    if trainer.data.label_names:  # a classification head trains whole, beside the adapters
        assert any("modules_to_save" in name for name in trainable)

    payload = newest_checkpoint(output_dir)
    assert set(payload["model"]) == set(module.state_dict()) - frozen  # the buffers stay
    assert not set(payload["model"]) & frozen
    assert len(payload["optimizer"]["state"]) == len(trainable)
    held = sum(tensor.numel() for tensor in payload["model"].values())
    assert held < sum(parameter.numel() for parameter in module.parameters()) / 2


def adapter_delta(adapter: dict[str, torch.Tensor], module: str, scale: float, conv1d: bool) -> torch.Tensor:
    """B @ A x alpha / r of one adapted module, as peft merges it (transposed for GPT-2's Conv1D, which
    stores its weight as input x output)."""
    delta = (adapter[f"{module}.lora_B.weight"] @ adapter[f"{module}.lora_A.weight"]) * scale
    return delta.T if conv1d else delta


PREFIX = "base_model.model."  # of the pretrained model's names inside peft's model


def starting_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The frozen base the adapters trained on, as training held it, by the pretrained model's names."""
    return {
        name[len(PREFIX) :].replace(".base_layer.", "."): tensor
        for name, tensor in trainer.state.module.state_dict().items()
        if not any(part in name for part in ("lora_", ".modules_to_save.", ".original_module."))
    }


def test_final_holds_the_base_plus_each_adapters_delta(adapted) -> None:
    trainer, _, output_dir = adapted
    final = output_dir / "final"
    # Loaded as users load it: transformers may name modules in memory otherwise than in the file.
    model_class = type(trainer.state.module.get_base_model())  # type: ignore[operator]
    merged = model_class.from_pretrained(final, dtype=torch.float32).state_dict()
    base = starting_weights(trainer)
    adapter = load_file(final / "adapter" / "adapter_model.safetensors")
    settings = json.loads((final / "adapter" / "adapter_config.json").read_text())
    scale = settings["lora_alpha"] / settings["r"]
    adapted_modules = {key[len(PREFIX) :].rpartition(".lora_A.")[0] for key in adapter if ".lora_A." in key}
    whole = {key[len(PREFIX) :]: tensor for key, tensor in adapter.items() if ".lora_" not in key}  # the head
    assert adapted_modules

    moved = 0
    for name, tensor in merged.items():
        module, _, kind = name.rpartition(".")
        if module in adapted_modules and kind == "weight":
            layer = trainer.state.module.get_submodule(PREFIX + module).get_base_layer()
            conv1d = type(layer).__name__ == "Conv1D"
            expected = base[name] + adapter_delta(adapter, PREFIX + module, scale, conv1d)
            moved += not torch.equal(expected, base[name])
        elif name in whole:
            expected = whole[name]
        else:
            expected = base[name]  # frozen: the tensor training started from
        assert torch.equal(tensor, expected), name
    assert moved, "training left every adapter at zero"


@pytest.mark.filterwarnings("ignore:.is_gradient_checkpointing. is deprecated:FutureWarning")
def test_the_adapter_reloads_with_peft_on_the_base_and_gives_the_trained_logits(adapted) -> None:
    from peft import PeftModel

    trainer, config, output_dir = adapted
    reloaded = PeftModel.from_pretrained(
        TASK.build_model(config, trainer.data), output_dir / "final" / "adapter"
    )
    batch = next(iter(trainer.plan.val_loader))
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    with torch.no_grad():
        expected = trainer.state.module.eval()(**inputs).logits
        actual = reloaded.eval()(**inputs).logits
    assert torch.equal(actual, expected)


def test_predict_loads_the_adapter_on_its_base_as_the_merged_final(adapted) -> None:
    """``predict final/adapter`` reads the model ``predict final`` reads: the base with the adapter merged."""
    trainer, _, output_dir = adapted
    model_class = type(trainer.state.module.get_base_model())
    merged = load_fine_tuned(model_class, output_dir / "final", "model").state_dict()
    from_adapter = load_fine_tuned(model_class, output_dir / "final" / "adapter", "model").state_dict()
    assert from_adapter.keys() == merged.keys()
    for name, tensor in merged.items():
        torch.testing.assert_close(from_adapter[name], tensor, msg=name)


def checkpointed_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that recompute their activations, each with the non-reentrant variant."""
    blocks = [
        module for module in model.modules() if getattr(module, "gradient_checkpointing", False) is True
    ]
    assert all(block._gradient_checkpointing_func.keywords == {"use_reentrant": False} for block in blocks)
    return blocks


def test_gradient_checkpointing_trains_the_same_adapters(adapted, deterministic_module, tmp_path) -> None:
    _, _, output_dir = adapted
    run = [*deterministic_module, *LORA, *SHORT_RUN, "model.gradient_checkpointing=true"]
    trainer, _ = train([*run, f"output_dir={tmp_path}"])
    assert checkpointed_blocks(trainer.state.module)
    assert_same_weights(output_dir, tmp_path)


def test_gradient_checkpointing_trains_every_parameter_the_same(deterministic_module, tmp_path) -> None:
    run = [*deterministic_module, *SHORT_RUN, "lora=null"]
    train([*run, f"output_dir={tmp_path / 'kept'}"])
    trainer, _ = train([*run, "model.gradient_checkpointing=true", f"output_dir={tmp_path / 'recomputed'}"])
    assert checkpointed_blocks(trainer.state.module)
    assert_same_weights(tmp_path / "kept", tmp_path / "recomputed")


def test_target_modules_the_model_lacks_stop_the_run_in_one_line(deterministic_module, tmp_path) -> None:
    run = [
        *deterministic_module,
        *SHORT_RUN,
        *LORA,
        "lora.target_modules=no_such_proj",
        f"output_dir={tmp_path}",
    ]
    with pytest.raises(ConfigError, match=r"^lora.target_modules='no_such_proj': .*, or use all-linear$"):
        train(run)


def test_a_lora_checkpoint_does_not_resume_a_full_run(adapted, deterministic_module, tmp_path) -> None:
    _, _, output_dir = adapted
    shutil.copytree(output_dir / "checkpoints", tmp_path / "checkpoints")
    before = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(CheckpointError, match="trained LoRA adapters, and this run trains every parameter"):
        train([*deterministic_module, *SHORT_RUN, "lora=null", f"output_dir={tmp_path}"])
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == before


@pytest.mark.slow
@pytest.mark.ddp_guarantees
def test_two_ddp_processes_train_the_adapters_one_process_trains(deterministic, tmp_path: Path) -> None:
    """In float64, plain SGD: 1 process x 12 samples against 2 processes x 3 samples x 2 micro-batches
    (no_sync), with gradient checkpointing on the frozen base."""
    steps = [*deterministic, *LORA, "train.max_steps=3", "train.lr=0.05"]
    one = float64_probe("sgd", "1x12", steps, tmp_path)
    two = float64_probe("sgd", "2x3x2", [*steps, "model.gradient_checkpointing=true"], tmp_path)
    (tmp_path / "start").mkdir()
    start = float64_probe("sgd", "1x12", [*steps, "train.lr=1e-30"], tmp_path / "start")
    adapters = [name for name in one if "lora_" in name]
    assert adapters and any(not torch.allclose(one[name], start[name], **FLOAT64) for name in adapters)
    assert_same_tensors(two, one, "2x3x2")


@pytest.fixture(scope="module")
def lora_reference(demo, tmp_path_factory) -> Path:
    output_dir = tmp_path_factory.mktemp("lora-reference")
    result = run_launch([*demo[1], *FAULT_RUN, "lora.r=4", f"output_dir={output_dir}"])
    assert result.returncode == 0, result.stderr[-4000:]
    return output_dir


@pytest.mark.slow
@pytest.mark.ddp_guarantees
def test_a_killed_lora_job_resumes_to_the_same_weights(demo, lora_reference: Path, tmp_path: Path) -> None:
    """With the default adapter dropout: the resumed run restores every rank's RNG too."""
    launch, workers = interrupted_run(demo, tmp_path, "lora.r=4")
    signal_all([launch.pid, *children(launch.pid), *workers], signal.SIGKILL)
    launch.wait()

    resumed = run_launch([*demo[1], *FAULT_RUN, "lora.r=4", f"output_dir={tmp_path}"])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr
    steps = [r["step"] for r in read_metrics(tmp_path) if "loss" in r]
    assert steps == [r["step"] for r in read_metrics(lora_reference) if "loss" in r]
    assert_same_weights(lora_reference, tmp_path)
    adapter = Path("final", "adapter", "adapter_model.safetensors")
    expected, actual = load_file(lora_reference / adapter), load_file(tmp_path / adapter)
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


@pytest.mark.slow
@pytest.mark.ddp_guarantees
def test_lora_with_gradient_checkpointing_compiles_under_ddp_and_trains_like_eager(
    deterministic, tmp_path
) -> None:
    """torch.compile around DDP around adapters on a model with non-reentrant gradient checkpointing, with
    no_sync accumulation: the first loss agrees to float32 rounding and the weights after 3 steps to
    1e-4 (a tenth of a step at lr 1e-3; see test_training.py's compile test for the bound)."""
    run = [*deterministic, *LORA, "model.gradient_checkpointing=true", "train.max_steps=3"]
    run += ["train.grad_accum_steps=2", "data.batch_size=4", "train.lr=1e-3", "train.log_every_steps=1"]
    for name, compiled in (("eager", "false"), ("compiled", "true")):
        result = run_launch([*run, f"train.compile={compiled}", f"output_dir={tmp_path / name}"], timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
    first = {
        name: next(r for r in read_metrics(tmp_path / name) if "loss" in r) for name in ("eager", "compiled")
    }
    assert first["compiled"]["loss"] == pytest.approx(first["eager"]["loss"], rel=1e-6)
    eager, compiled = final_weights(tmp_path / "eager"), final_weights(tmp_path / "compiled")
    worst = max((eager[name] - compiled[name]).abs().max().item() for name in eager)
    assert worst <= 1e-4, f"compiled training drifted from eager by {worst:.2e}"
