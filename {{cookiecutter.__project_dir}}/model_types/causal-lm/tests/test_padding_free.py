"""Padding-free instruction batches: samples end to end in one row keep apart, give the padded batch's loss,
and a model that lets them meet gets padded rows."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from instruction_data import task_data
from transformers import AutoModelForCausalLM

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.config.data import (
    PaddingFree,
)
from {{ cookiecutter.package_name }}.model_type import (
    padding_free as padding_free_module,
)
from {{ cookiecutter.package_name }}.model_type import (
    task,
)


def packed_inputs_with(batch, **extra):
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], **extra}


def test_packed_samples_give_the_logits_they_give_alone(demo, tmp_path: Path) -> None:
    """The demo model attends within each sample of a padding-free row: packed logits equal unpacked
    ones. An all-ones 2-D mask over the same row lets samples see each other, which is why a
    padding-free batch never carries one."""
    data = task_data(demo, tmp_path, "chat-train.jsonl")
    model = AutoModelForCausalLM.from_pretrained(demo[0] / "model").eval()
    samples = [data.train[index] for index in range(5)]
    assert len({len(ids) for ids, _ in samples}) > 1
    packed = padding_free_module.padding_free_batch(samples)
    with torch.no_grad():
        together = model(**padding_free_module.model_inputs(packed), use_cache=False).logits[0]
        alone = torch.cat(
            [model(input_ids=ids[None].long(), use_cache=False).logits[0] for ids, _ in samples]
        )
        mask = torch.ones_like(packed["input_ids"])
        leaking = model(**packed_inputs_with(packed, attention_mask=mask), use_cache=False).logits[0]
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    first = len(samples[0][0])  # the first sample sees nothing before it either way
    assert (leaking[first:] - alone[first:]).abs().max() > 1e-2
    with pytest.raises(ValueError, match="no attention mask"):
        padding_free_module.model_inputs({**packed, "attention_mask": mask})


def test_padded_and_padding_free_batches_have_the_same_loss_and_targets(demo, tmp_path: Path) -> None:
    data = task_data(demo, tmp_path, "instructions-train.jsonl")
    model = AutoModelForCausalLM.from_pretrained(demo[0] / "model").eval()
    samples = [data.train[index] for index in range(7)]
    batch = data.collate(samples)
    packed = padding_free_module.the_form_for(model, batch)
    assert "packed_input_ids" in batch and "attention_mask" in packed  # not checked yet: padded rows
    setattr(model, padding_free_module.SAMPLES_APART, True)
    packed = padding_free_module.the_form_for(model, batch)
    assert "attention_mask" not in packed
    assert packed["input_ids"].shape == (1, sum(len(ids) for ids, _ in samples))
    assert task.count_targets(packed) == task.count_targets(batch)
    with torch.no_grad():
        torch.testing.assert_close(task.loss_sum(model, batch), task.loss_sum(model, packed))
        setattr(model, padding_free_module.SAMPLES_APART, False)
        torch.testing.assert_close(task.loss_sum(model, batch), task.loss_sum(model, packed))


def test_auto_packs_with_flash_attention_only() -> None:
    def model(attention: str) -> torch.nn.Module:
        module = torch.nn.Linear(1, 1)
        module.config = SimpleNamespace(_attn_implementation=attention)
        return module

    auto, always, never = PaddingFree.auto, PaddingFree.always, PaddingFree.never
    assert padding_free_module.worth_trying(auto, model("flash_attention_2"))
    assert not padding_free_module.worth_trying(auto, model("sdpa"))
    assert padding_free_module.worth_trying(always, model("sdpa"))
    assert not padding_free_module.worth_trying(never, model("flash_attention_2"))
    config = load_config(["data.padding_free=always"])
    assert config.data.padding_free is always and load_config([]).data.padding_free is auto


class AttendsAcrossSamples(torch.nn.Module):
    """A model that ignores position ids and sees the whole row, as older attention code does."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids=None, **kwargs):
        return self.model(input_ids=input_ids, **kwargs)


def test_a_model_that_lets_packed_samples_meet_gets_padded_batches(demo, tmp_path: Path) -> None:
    data = task_data(demo, tmp_path, "instructions-train.jsonl")
    model = AutoModelForCausalLM.from_pretrained(demo[0] / "model").train()
    samples = [data.train[index][0] for index in range(2)]
    assert padding_free_module.attends_within_samples(model, samples)
    assert model.training  # the check leaves the mode as it was
    leaky = AttendsAcrossSamples(model)
    task.choose_padding_free(leaky, data.train)
    assert not getattr(leaky, padding_free_module.SAMPLES_APART)
    batch = data.collate([data.train[index] for index in range(3)])
    assert "attention_mask" in padding_free_module.the_form_for(leaky, batch)
