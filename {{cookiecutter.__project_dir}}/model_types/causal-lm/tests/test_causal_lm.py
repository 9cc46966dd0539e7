"""Causal LM: packing, pad-less tokenizers, the model's context limit, exact evaluation, bad data, final/."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ON_THIS_MACHINE, read_metrics, run_launch
from predict_helpers import prediction_error, predictions, run_predict

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data.loader import (
    DataError,
)
from {{ cookiecutter.package_name }}.data.sampling import (
    EvalBatches,
)
from {{ cookiecutter.package_name }}.model_type import (
    packing,
    recipe,
    task,
)
from {{ cookiecutter.package_name }}.parallel.process_group import (
    DistEnv,
)

ENV = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _write(path: Path, rows: list[object]) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


def _config(demo, tmp_path: Path, train: list[object] | None = None, val: list[object] | None = None, *extra):
    directory, _ = demo
    train_file = _write(tmp_path / "train.jsonl", train) if train is not None else directory / "train.jsonl"
    val_file = _write(tmp_path / "val.jsonl", val) if val is not None else directory / "val.jsonl"
    return load_config(
        [
            f"model.pretrained={directory / 'model'}",
            f"data.train_file={train_file}",
            f"data.val_file={val_file}",
            f"output_dir={tmp_path / 'out'}",
            *ON_THIS_MACHINE,
            "data.max_length=16",
            *extra,
        ]
    )


def test_blocks_overlap_by_one_so_every_token_is_a_target_once() -> None:
    assert packing.block_count(20, size=6, keep_partial=True) == 4  # 0-5, 5-10, 10-15, 15-19
    assert packing.block_count(20, size=6, keep_partial=False) == 3
    assert packing.block_count(16, size=6, keep_partial=True) == 3  # 0-5, 5-10, 10-15
    assert packing.block_count(5, size=6, keep_partial=False) == 0
    assert packing.block_count(1, size=6, keep_partial=True) == 0


def _cut_whole_stream(texts: list[str], tokenizer, size: int, keep_partial: bool) -> list[list[int]]:
    """Packing as one pass over the whole token stream: what the batched, parallel map must equal."""
    stream = []
    for text in texts:
        stream += [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    starts = range(0, len(stream), size - 1)
    if keep_partial:
        return [stream[start : start + size] for start in starts if start + 1 < len(stream)]
    return [stream[start : start + size] for start in starts if start + size <= len(stream)]


@pytest.mark.parametrize("processes", [1, 2])
def test_packing_in_batches_and_processes_equals_cutting_the_whole_stream(
    demo, tmp_path: Path, monkeypatch, processes: int
) -> None:
    monkeypatch.setattr(recipe, "PACK_BATCH", 3)  # many batches, blocks spanning documents and batches
    config = _config(demo, tmp_path, None, None, f"data.preprocessing_processes={processes}")
    data = task.build_data(config, ENV)
    for split, dataset, keep_partial in (("train", data.train, False), ("val", data.val, True)):
        lines = (demo[0] / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        texts = [json.loads(line)["text"] for line in lines]
        expected = _cut_whole_stream(texts, data.preprocessor, 16, keep_partial)
        assert [block.tolist() for block in dataset] == expected, split


def test_tokenizer_without_pad_token_pads_with_end_of_text(demo, tmp_path: Path) -> None:
    config = _config(demo, tmp_path)
    tokenizer = task.load_tokenizer(config)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    batch = task.Collator(tokenizer.pad_token_id)([torch.tensor([5, 6, 7]), torch.tensor([8, 9])])
    assert batch["labels"].tolist() == [[5, 6, 7], [8, 9, task.IGNORE_INDEX]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


def test_batches_are_padded_to_a_multiple_of_8_within_the_block_size(demo, tmp_path: Path) -> None:
    """Few batch widths: on CPU each new shape of a bf16 matmul keeps cached kernels for good (memory)."""
    data = task.build_data(_config(demo, tmp_path, None, None, "data.max_length=20"), ENV)
    widths = {
        longest: data.collate([torch.arange(1, longest + 1), torch.tensor([7])])["input_ids"].shape[1]
        for longest in (3, 8, 9, 17, 20)
    }
    assert widths == {3: 8, 8: 8, 9: 16, 17: 20, 20: 20}  # the block size, 20, caps the rounding
    batch = data.collate([torch.tensor([5, 6, 7]), torch.tensor([8, 9])])
    assert batch["labels"].tolist() == [[5, 6, 7, *[task.IGNORE_INDEX] * 5], [8, 9, *[task.IGNORE_INDEX] * 6]]
    assert batch["attention_mask"].sum().item() == 5  # padding carries no attention and no loss


def test_block_size_is_capped_by_the_model_context(demo, tmp_path: Path) -> None:
    assert recipe.block_size(_config(demo, tmp_path, None, None, "data.max_length=100000")) == 128
    assert recipe.block_size(_config(demo, tmp_path)) == 16


def test_documents_are_separated_by_end_of_text(demo, tmp_path: Path) -> None:
    config = _config(demo, tmp_path, [{"text": "the cat"}, {"text": "a dog"}] * 20)
    data = task.build_data(config, ENV)
    eos = data.preprocessor.eos_token_id
    stream = torch.cat([data.train[0][:1], *[block[1:] for block in data.train]]).tolist()
    expected = _cut_whole_stream(["the cat", "a dog"] * 20, data.preprocessor, 16, keep_partial=False)
    documents = [*expected[0][:1], *[token for block in expected for token in block[1:]]]
    assert stream == documents  # each document's tokens, then end-of-text, in order
    assert stream.count(eos) >= 40 - 15 // 3  # only the last, partial block (< 15 new tokens) is left out


def test_parquet_and_a_hub_dataset_folder_pack_like_json_lines(demo, tmp_path: Path) -> None:
    import pandas as pd

    reference = task.build_data(_config(demo, tmp_path / "jsonl"), ENV)
    folder = tmp_path / "dataset"
    folder.mkdir()
    for split, name in (("train", "train"), ("val", "test")):
        frame = pd.read_json(demo[0] / f"{split}.jsonl", lines=True).rename(columns={"text": "body"})
        frame.to_parquet(folder / f"{name}.parquet", index=False)
    config = _config(demo, tmp_path / "parquet", None, None, "data.text_field=body")
    config.data.train_file, config.data.val_file = str(folder / "train.parquet"), str(folder / "test.parquet")
    hub = _config(
        demo,
        tmp_path / "hub",
        None,
        None,
        f"data.hub_dataset={folder}",
        "data.val_split=test",
        "data.text_field=body",
    )
    for data in (task.build_data(config, ENV), task.build_data(hub, ENV)):
        for split in ("train", "val"):
            blocks = [block.tolist() for block in getattr(data, split)]
            assert blocks == [block.tolist() for block in getattr(reference, split)], split


class UniformModel(torch.nn.Module):
    """Predicts every token with equal probability; only the counting matters here."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool
    ) -> SimpleNamespace:
        assert not use_cache  # training and evaluation never attend through a key/value cache
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_evaluation_scores_every_validation_token_once(demo, tmp_path: Path, world_size: int) -> None:
    data = task.build_data(_config(demo, tmp_path), ENV)
    model = UniformModel(len(data.preprocessor))
    total = 0.0
    for rank in range(world_size):
        env = DistEnv(rank=rank, local_rank=rank, world_size=world_size, device=torch.device("cpu"))
        for indices in EvalBatches(len(data.val), 3, env):
            batch = data.collate([data.val[index] for index in indices])
            total += task.evaluation_sums(model, batch)["count"].item()
    val_tokens = sum(len(block) for block in data.val) - (len(data.val) - 1)  # blocks overlap by one
    assert total == val_tokens - 1  # every token but the very first is predicted


@pytest.mark.parametrize(
    ("train", "val", "message"),
    [
        (['{"text": "a"}', "{oops"], None, "train.jsonl:2: not valid JSON"),
        ([{"text": "a"}, {"body": "b"}], None, "train.jsonl:2: missing field 'text'"),
        ([{"text": ["a"]}], None, "train.jsonl:1: field 'text' must be a string"),
        ([{"text": "a"}], None, "too little text for one block of 16 tokens"),
        (None, [{"text": ""}], "val.jsonl: fewer than 2 tokens"),
    ],
)
def test_bad_data_names_file_and_line(demo, tmp_path: Path, train, val, message: str) -> None:
    with pytest.raises(DataError) as error:
        task.build_data(_config(demo, tmp_path, train, val), ENV)
    assert message in str(error.value)


@pytest.mark.slow
def test_final_model_loads_with_auto_classes_and_perplexity_falls(trained: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(trained / "final")
    tokenizer = AutoTokenizer.from_pretrained(trained / "final")
    with torch.no_grad():
        logits = model(**tokenizer(["The cat saw"], return_tensors="pt")).logits
    assert logits.shape[-1] == len(tokenizer)
    evals = [record for record in read_metrics(trained) if "eval_perplexity" in record]
    assert all(math.isfinite(r["eval_perplexity"]) for r in evals)
    assert evals[-1]["eval_perplexity"] == pytest.approx(math.exp(evals[-1]["eval_loss"]))
    assert evals[-1]["eval_perplexity"] < evals[0]["eval_perplexity"] < len(tokenizer)


@pytest.mark.slow
def test_a_corrupt_line_ends_launch_in_one_line_naming_it(demo, tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.jsonl", ['{"text": "fine"}'] * 30 + ['{"text": "cut sho'])
    result = run_launch([*demo[1], f"data.train_file={bad}", f"output_dir={tmp_path / 'out'}"])
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}:31: not valid JSON"), errors
    assert not (tmp_path / "out" / "checkpoints").exists()


# ---- python -m <package>.predict ------------------------------------------------------------------
PROMPTS = ["The cat saw", "A dog", "", "My sister helped the old man in the park. The teacher"]


def test_predict_completes_each_prompt_in_order(demo, tmp_path: Path) -> None:
    """The demo checkpoint is a causal LM as training saves one; its greedy completions differ by prompt."""
    model, output = demo[0] / "model", tmp_path / "predictions.jsonl"
    rows = [{"text": prompt} for prompt in PROMPTS]
    alone = [
        predictions(model, Path(_write(tmp_path / "one.jsonl", [row])), output, "--max-new-tokens", "6")[0]
        for row in rows
    ]
    assert all(record.keys() == {"completion"} and record["completion"] for record in alone)
    assert len({record["completion"] for record in alone}) > 1  # so that the order shows
    inputs = Path(_write(tmp_path / "inputs.jsonl", rows))
    for batch_size in ("1", "3"):  # grouped by length and padded on the left: the records must not change
        assert (
            predictions(model, inputs, output, "--max-new-tokens", "6", "--batch-size", batch_size) == alone
        )


def test_sampled_completions_repeat_with_the_seed(demo, tmp_path: Path) -> None:
    inputs = Path(_write(tmp_path / "inputs.jsonl", [{"text": prompt} for prompt in PROMPTS]))
    sampled = ["--max-new-tokens", "6", "--temperature", "1.0", "--seed", "3"]
    first = predictions(demo[0] / "model", inputs, tmp_path / "first.jsonl", *sampled)
    assert first == predictions(demo[0] / "model", inputs, tmp_path / "second.jsonl", *sampled)


@pytest.mark.parametrize(
    ("rows", "options", "message"),
    [
        ([{"text": "fine"}, {"text": ["a"]}], [], "inputs.jsonl:2: field 'text' must be a string"),
        ([{"text": "fine"}, "{not json"], [], "inputs.jsonl:2: not valid JSON"),
        ([{"text": "fine"}], ["--max-new-tokens", "200"], "--max-new-tokens 200 leaves no room for a prompt"),
    ],
)
def test_predict_refuses_bad_input_in_one_line(demo, tmp_path: Path, capsys, rows, options, message) -> None:
    inputs = Path(_write(tmp_path / "inputs.jsonl", rows))
    assert message in prediction_error(demo[0] / "model", inputs, capsys, *options)


@pytest.mark.slow
def test_predict_with_the_trained_model_continues_the_prompts(trained: Path, tmp_path: Path) -> None:
    inputs = Path(_write(tmp_path / "inputs.jsonl", [{"text": prompt} for prompt in PROMPTS]))
    output = tmp_path / "predictions.jsonl"
    result = run_predict(
        str(trained / "final"), str(inputs), "--output", str(output), "--max-new-tokens", "8"
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(PROMPTS) and all(isinstance(record["completion"], str) for record in records)
    assert any(record["completion"].strip() for record in records)
