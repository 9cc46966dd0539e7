"""eval.generate_samples: at each evaluation, greedy completions of the first validation prompts in
samples.jsonl, the same as transformers' greedy generate gives with the model of that step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ON_THIS_MACHINE, read_metrics, run_launch
from inprocess import StopAfter, fit
from transformers import AutoModelForCausalLM

from {{ cookiecutter.package_name }}.config import (
    ConfigError,
    load_config,
)

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.launch import preflight
from {{ cookiecutter.package_name }}.launch.preemption import (
    Preempted,
)
from {{ cookiecutter.package_name }}.model_type import generation, task
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def chat(directory: Path) -> list[str]:
    return [
        f"data.train_file={directory / 'chat-train.jsonl'}",
        f"data.val_file={directory / 'chat-val.jsonl'}",
        f"data.chat_template={directory / 'chat_template.jinja'}",
        "data.max_length=128",
    ]


def read_samples(output_dir: Path) -> list[dict]:
    lines = (output_dir / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def assert_greedy_completions_of(output_dir: Path, overrides: list[str], samples: list[dict]) -> None:
    """The records equal transformers' greedy generate with final/, cut at the end-of-text token."""
    config = load_config([*overrides, f"output_dir={output_dir}"])
    data = task.build_data(config, ENV)
    model = AutoModelForCausalLM.from_pretrained(output_dir / "final")
    tokenizer = data.preprocessor
    for record in samples:
        prompt, reference = generation.prompt_and_reference(data.val[record["index"]])
        ids = torch.tensor([prompt])
        new = model.generate(
            ids, max_new_tokens=5, do_sample=False, use_cache=False, pad_token_id=tokenizer.eos_token_id
        )[0, len(prompt) :].tolist()
        if tokenizer.eos_token_id in new:
            new = new[: new.index(tokenizer.eos_token_id)]
        assert record["prompt"] == tokenizer.decode(prompt)
        assert record["completion"] == tokenizer.decode(new)
        assert record["reference"] == tokenizer.decode(reference, skip_special_tokens=True)


def test_prompt_and_reference_of_a_sample_and_of_a_block() -> None:
    ignore = generation.IGNORE_INDEX
    ids = torch.tensor([5, 6, 7, 8, 9, 10, 11])
    labels = torch.tensor([ignore, ignore, 7, 8, ignore, 10, 11])  # two responses: the first is the reference
    assert generation.prompt_and_reference((ids, labels)) == ([5, 6], [7, 8])
    assert generation.prompt_and_reference(torch.tensor([1, 2, 3, 4, 5])) == ([1, 2], [3, 4, 5])


def test_each_evaluation_adds_the_greedy_completions_of_the_first_prompts(demo, tmp_path: Path) -> None:
    directory, overrides = demo
    run = [*ON_THIS_MACHINE, *overrides, *chat(directory), "lora=null", "train.max_steps=4"]
    run += ["train.eval_every_steps=2", "eval.generate_samples=3", "eval.max_new_tokens=5"]
    fit([*run, f"output_dir={tmp_path}"])
    samples = read_samples(tmp_path)
    evaluations = [record["step"] for record in read_metrics(tmp_path) if "eval_loss" in record]
    assert evaluations == [2, 4]
    assert [(record["step"], record["index"]) for record in samples] == [
        (s, i) for s in (2, 4) for i in range(3)
    ]
    assert_greedy_completions_of(tmp_path, run, samples[3:])  # step 4 is the final model's


def test_a_resumed_run_drops_the_samples_written_after_its_checkpoint(demo, tmp_path: Path) -> None:
    directory, overrides = demo
    run = [*ON_THIS_MACHINE, *overrides, *chat(directory), "lora=null", "train.max_steps=4"]
    run += ["train.eval_every_steps=1", "eval.generate_samples=1", "checkpoint.every_steps=2"]
    run.append(f"output_dir={tmp_path}")
    with pytest.raises(Preempted):
        fit(run, preemption=StopAfter(3))  # evaluated at steps 1-3, checkpointed on stopping at 3
    assert [record["step"] for record in read_samples(tmp_path)] == [1, 2, 3]
    stale = tmp_path / "samples.jsonl"
    # Written after the last checkpoint, as if never saved, and a line a kill tore in half.
    stale.write_text(stale.read_text() + json.dumps({"step": 9, "index": 0}) + '\n{"step": 9, "ind')
    fit(run)
    assert [record["step"] for record in read_samples(tmp_path)] == [1, 2, 3, 4]


def test_other_model_types_refuse_it_in_one_line(monkeypatch) -> None:
    config = load_config(["eval.generate_samples=2"])
    preflight.check_eval(config)
    monkeypatch.setattr(preflight, "MODEL_TYPE", "text-classification")  # the rendered answer
    with pytest.raises(ConfigError, match=r"eval\.generate_samples: only a causal-lm project"):
        preflight.check_eval(config)


@pytest.mark.slow
def test_two_sharded_processes_generate_together(demo, tmp_path: Path) -> None:
    """Under FSDP2 each forward gathers the weights from every rank: all of them generate, as often."""
    directory, overrides = demo
    run = [*overrides, *chat(directory), "lora=null", "train.max_steps=3", "train.eval_every_steps=3"]
    run += ["eval.generate_samples=2", "eval.max_new_tokens=5", "distributed.strategy=fsdp2"]
    result = run_launch([*run, f"output_dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-4000:]
    samples = read_samples(tmp_path)
    assert [(record["step"], record["index"]) for record in samples] == [(3, 0), (3, 1)]
    assert_greedy_completions_of(tmp_path, [*ON_THIS_MACHINE, *run], samples)
