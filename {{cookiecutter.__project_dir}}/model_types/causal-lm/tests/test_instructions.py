"""Instruction data: which tokens are targets, cut samples, refused files, and a step's loss as the mean
over every target token of the global batch, whatever the processes and micro-batches."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from conftest import ON_THIS_MACHINE, read_metrics, run_launch
from instruction_data import ENV, IGNORE, targets_of, task_data, write_rows
from predict_helpers import predictions
from test_equivalence import assert_same_tensors, float64_probe
from transformers import AutoModelForCausalLM, AutoTokenizer

# One name per line (kept so by the trailing commas): the package name may be long.
from {{ cookiecutter.package_name }}.config import (
    load_config,
)
from {{ cookiecutter.package_name }}.data.batch_plan import (
    plan_batches,
)
from {{ cookiecutter.package_name }}.data.loader import (
    DataError,
)
from {{ cookiecutter.package_name }}.model_type import (
    instructions,
    task,
)
from {{ cookiecutter.package_name }}.model_type import (
    padding_free as padding_free_module,
)


def test_prompt_completion_trains_on_the_completion_and_its_end_only(demo, tmp_path: Path) -> None:
    data = task_data(demo, tmp_path, "instructions-train.jsonl")
    tokenizer = data.preprocessor
    rows = [json.loads(line) for line in (demo[0] / "instructions-train.jsonl").read_text().splitlines()]
    assert len(data.train) == len(rows)
    for sample, row in zip(data.train, rows[:50], strict=False):
        prompt = tokenizer(row["prompt"])["input_ids"]
        completion = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        assert sample[0].tolist() == [*prompt, *completion, tokenizer.eos_token_id]
        assert sample[1][: len(prompt)].tolist() == [IGNORE] * len(prompt)
        assert targets_of(sample) == [*completion, tokenizer.eos_token_id]


@pytest.mark.parametrize("grouped", [False, True])
def test_instruction_batches_are_random_unless_grouped_by_length(demo, tmp_path: Path, grouped: bool) -> None:
    """Random batches by default (they learnt more per step in the bench); the lengths stay, for the
    largest-batch check before the first step either way."""
    extra = ["data.group_by_length=true"] if grouped else []
    data = task_data(demo, tmp_path, "instructions-train.jsonl", *extra)
    assert data.group_by_length is grouped
    assert data.train_lengths is not None
    plan = plan_batches(data, load_config([f"output_dir={tmp_path}", *ON_THIS_MACHINE]), ENV)
    assert (plan.sampler.lengths is not None) is grouped


def test_chat_trains_on_the_assistant_turns_only(demo, tmp_path: Path) -> None:
    data = task_data(demo, tmp_path, "chat-train.jsonl")
    tokenizer = data.preprocessor
    rows = [json.loads(line) for line in (demo[0] / "chat-train.jsonl").read_text().splitlines()]
    assert any(len(row["messages"]) > 3 for row in rows[:50])  # conversations of two answers among them
    for sample, row in zip(data.train, rows[:50], strict=False):
        whole = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        assert tokenizer.decode(sample[0]) == whole
        answers = [m["content"] + tokenizer.eos_token for m in row["messages"] if m["role"] == "assistant"]
        assert tokenizer.decode(targets_of(sample)) == "".join(answers)


@pytest.mark.parametrize("padding_free", ["never", "always"])
def test_prompt_positions_get_no_gradient(demo, tmp_path: Path, padding_free: str) -> None:
    """The loss reaches the logits that predict completion tokens, and no other: found through the
    gradient, against prompt lengths tokenized here, apart from the data pipeline."""
    data = task_data(demo, tmp_path, "instructions-train.jsonl")
    config = load_config(
        [f"model.pretrained={demo[0] / 'model'}", f"data.padding_free={padding_free}", *ON_THIS_MACHINE]
    )
    model = task.build_model(config, data)
    # The demo model keeps packed samples apart: it is checked, and trains padding-free, when asked to.
    assert getattr(model, padding_free_module.SAMPLES_APART, False) == (padding_free == "always")
    samples = [data.train[index] for index in range(6)]
    batch = task.Collator(data.preprocessor.pad_token_id, padding_free=True)(samples)
    logits: list[torch.Tensor] = []

    def keep(module, inputs, output):
        output.retain_grad()
        logits.append(output)

    model.lm_head.register_forward_hook(keep)
    task.TASK.loss_sum(model, batch).backward()
    touched = logits[0].grad.abs().sum(dim=-1) != 0  # (row, position)
    rows = [json.loads(line) for line in (demo[0] / "instructions-train.jsonl").read_text().splitlines()]
    expected = []
    for (ids, _), record in zip(samples, rows[:6], strict=True):
        prompt = len(data.preprocessor(record["prompt"])["input_ids"])
        # Position t predicts token t + 1: the last prompt position predicts the first completion token.
        expected.append([prompt - 1 <= t < len(ids) - 1 for t in range(len(ids))])
    if padding_free == "always":  # one row, the samples end to end
        assert touched.tolist() == [[t for sample in expected for t in sample]]
    else:
        assert [
            row[: len(sample)] for row, sample in zip(touched.tolist(), expected, strict=True)
        ] == expected
        assert not any(
            any(row[len(sample) :]) for row, sample in zip(touched.tolist(), expected, strict=True)
        )


def test_a_long_sample_keeps_its_prompt_end_and_its_response_start() -> None:
    ids = list(range(30))
    labels = [IGNORE] * 20 + ids[20:]  # a 20-token prompt, a 10-token response
    kept, kept_labels, cut = instructions.window(ids, labels, 12)
    assert cut and kept == list(range(14, 26))  # 6 = half the window before the response, 6 of it
    assert kept_labels == [IGNORE] * 6 + list(range(20, 26))
    short = [IGNORE] * 20 + ids[20:22]  # a short response: all of it, and the prompt's last tokens
    assert instructions.window(ids[:22], short, 12)[0] == list(range(10, 22))
    assert instructions.window(ids[:5], short[:5], 12) == (ids[:5], short[:5], False)


def test_cut_samples_and_samples_without_a_response_are_counted_in_one_warning(
    demo, tmp_path: Path, caplog
) -> None:
    long = {"prompt": "The cat saw the red ball. " * 20 + "Who?", "completion": " the cat"}
    rows = [long, {"prompt": "Who?", "completion": ""}, {"prompt": "What?", "completion": " a box"}]
    train = write_rows(tmp_path / "train.jsonl", rows)
    for run in ("preprocessing", "reading the cache"):  # every run on the data says so
        caplog.clear()
        with caplog.at_level("INFO"):
            data = task_data(demo, tmp_path, train, "data.max_length=32")
        cached = any("from an earlier run" in r.getMessage() for r in caplog.records)
        assert cached == (run == "reading the cache"), run
        assert len(data.train) == 2  # the sample with no response token is left out
        assert max(len(data.train[index][0]) for index in range(2)) == 32
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and "1 of 3 samples were longer than 32" in warnings[0], (run, warnings)
        assert "1 had no response tokens and were left out" in warnings[0]


@pytest.mark.parametrize(
    "rows,message",
    [
        (
            [{"prompt": "a", "completion": "b"}, {"messages": [{"role": "user", "content": "c"}]}],
            'train.jsonl:2: a {"messages"} record, but line 1 is a {"prompt", "completion"} one',
        ),
        ([{"text": "a"}, {"prompt": "a", "completion": "b"}], 'train.jsonl:2: a {"prompt", "completion"}'),
        ([{"messages": [{"role": "robot", "content": "c"}]}], "train.jsonl:1: message 1: 'role' must be"),
        ([{"messages": []}], "train.jsonl:1: field 'messages' must be a non-empty list"),
        ([{"prompt": "a", "completion": "b"}, {"prompt": "a"}], "train.jsonl:2: missing field 'completion'"),
        ([{"prompt": 3, "completion": "b"}], "train.jsonl:1: field 'prompt' must be a string"),
        ([{"prompt": "a", "completion": ""}], "no sample has a response token"),
    ],
)
def test_bad_instruction_data_names_file_and_line(demo, tmp_path: Path, rows, message: str) -> None:
    with pytest.raises(DataError) as raised:
        task_data(demo, tmp_path, rows)
    assert message in str(raised.value), str(raised.value)


def test_chat_data_without_a_template_names_data_chat_template(demo, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"has no chat template; set data\.chat_template="):
        task_data(demo, tmp_path, "chat-train.jsonl", "data.chat_template=")


def test_a_conversation_the_chat_template_refuses_is_named_by_line(demo, tmp_path: Path) -> None:
    template = Path(__file__).with_name("refusing_chat_template.jinja")
    rows = [
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"messages": [{"role": "system", "content": "a"}, {"role": "assistant", "content": "b"}]},
    ]
    with pytest.raises(DataError) as raised:
        task_data(demo, tmp_path, rows, f"data.chat_template={template}")
    assert "train.jsonl:2: the chat template refused the conversation: system messages" in str(raised.value)


def _completion_lengths_vary(path: Path, count: int, seed: int) -> None:
    """Prompt/completion pairs whose completions hold 1 to 20 tokens."""
    rng, words = random.Random(seed), ["cat", "dog", "ball", "tree", "box", "river", "house", "cup"]
    rows = []
    for _ in range(count):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) + "?"
        completion = " " + " ".join(rng.choice(words) for _ in range(rng.randint(1, 19)))
        rows.append({"prompt": prompt, "completion": completion})
    write_rows(path, rows)


LORA = ["lora.r=4", "lora.alpha=8", "lora.dropout=0", "train.lr=0.5"]


@pytest.mark.slow
@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_a_step_is_the_mean_over_every_target_token_of_the_global_batch(
    deterministic, tmp_path: Path, finetune: str
) -> None:
    """1 process x 8 samples and 2 processes x 2 samples x 2 micro-batches train the same weights in 5
    SGD steps (float64: they differ by the order of sums), though the micro-batches hold different
    numbers of target tokens; weighting each micro-batch's own mean by its samples does not."""
    if finetune == "lora":
        pytest.importorskip("peft", reason="LoRA needs peft, which finetune=lora projects install")
    data = tmp_path / "pairs.jsonl"
    _completion_lengths_vary(data, 40, seed=3)
    kept = [item for item in deterministic if not item.startswith(("data.train_file=", "data.val_file="))]
    overrides = [*kept, f"data.train_file={data}", "data.val_file=", "train.max_steps=5", "train.lr=0.05"]
    overrides += LORA if finetune == "lora" else ["lora=null"]
    overrides.append("data.padding_free=always")  # the demo model keeps packed samples apart
    one = float64_probe("sgd", "1x8x1", overrides, tmp_path)
    (tmp_path / "start").mkdir()  # the same run, its own files: about the initial weights
    start = float64_probe("sgd", "1x8x1", [*overrides, "train.lr=1e-30"], tmp_path / "start")
    assert any(not torch.allclose(one[name], start[name]) for name in start)  # training moved them
    two = float64_probe("sgd", "2x2x2", overrides, tmp_path)
    assert_same_tensors(two, one, "2 x 2 x 2")
    means = float64_probe("sgd", "2x2x2", overrides, tmp_path, "micro_batch_means")
    with pytest.raises(AssertionError):
        assert_same_tensors(means, one, "per-micro-batch means")


@pytest.mark.slow
def test_chat_demo_trains_with_two_processes_and_answers_through_predict(demo, tmp_path: Path) -> None:
    directory, overrides = demo
    chat = [
        f"data.train_file={directory / 'chat-train.jsonl'}",
        f"data.val_file={directory / 'chat-val.jsonl'}",
        f"data.chat_template={directory / 'chat_template.jinja'}",
        "data.max_length=128",
        "lora=null",
        "train.epochs=4",
    ]
    result = run_launch([*overrides, *chat, f"output_dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-4000:]
    losses = [record["eval_loss"] for record in read_metrics(tmp_path) if "eval_loss" in record]
    assert losses[-1] < losses[0] / 2, losses
    question = [{"role": "user", "content": "A dog found the red ball by the sea. Who?"}]
    inputs = Path(write_rows(tmp_path / "questions.jsonl", [{"messages": question}, {"text": "A dog"}]))
    answers = predictions(tmp_path / "final", inputs, tmp_path / "answers.jsonl", "--max-new-tokens", "4")
    assert len(answers) == 2
    # final/ carries the chat template, and predict asks through it as the assistant, as training did.
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "final")
    asked = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    assert asked.endswith("<|assistant|>\n")
    ids = tokenizer(asked, add_special_tokens=False, return_tensors="pt")["input_ids"]
    output = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert answers[0]["completion"] == tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True)
