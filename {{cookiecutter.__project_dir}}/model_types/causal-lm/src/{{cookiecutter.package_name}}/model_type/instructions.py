"""Instruction data for causal language modelling: ``{"prompt", "completion"}`` and ``{"messages"}``.

A file holds one format, told by its first record; plain ``{"text"}`` documents are packed into blocks
(task.py), instruction samples are not: each is one sequence, padded in its batch, with loss on the
response tokens only (the completion, or the assistant turns). Samples longer than the window keep the
end of their prompt and the start of their response: the window starts at most half its length before
the first response token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import jinja2
import numpy as np
import pyarrow.compute as pc
import torch
from torch.utils.data import Dataset

from ..data.arrow_rows import IntegerLists
from ..data.cache import arrow_file, map_batches, processes
from ..data.loader import DataError
from ..data.sources import Source, SplitReader, python_values, require_fields, require_text
from ..observe.log import log

IGNORE_INDEX = -100  # label of a position that is no target
ROLES = ("system", "user", "assistant")
PROMPT_FIELDS = ("prompt", "completion")
SAMPLES = datasets.Features(
    {"input_ids": datasets.List(datasets.Value("int32")), "labels": datasets.List(datasets.Value("int32"))}
)
ENCODED = datasets.Features(
    {
        **SAMPLES,
        "targets": datasets.Value("int32"),
        "cut": datasets.Value("bool"),
        "problem": datasets.Value("string"),
    }
)


def format_fields(text_field: str) -> dict[str, tuple[str, ...]]:
    """The formats by precedence, with the fields that make a record one of them."""
    return {"messages": ("messages",), "prompt": PROMPT_FIELDS, "text": (text_field,)}


def describe(fields: tuple[str, ...]) -> str:
    return "{" + ", ".join(f'"{field}"' for field in fields) + "}"


def record_format(record: dict[str, Any], formats: dict[str, tuple[str, ...]]) -> str | None:
    for name, fields in formats.items():
        if all(record.get(field) is not None for field in fields):
            return name
    return None


def detect_format(rows: datasets.Dataset, source: Source, text_field: str) -> str:
    """``text``, ``prompt`` or ``messages``: the first record's format, which every record must share."""
    formats = format_fields(text_field)
    present = {name: fields for name, fields in formats.items() if set(fields) <= set(rows.column_names)}
    if not present:
        wanted = " or ".join(describe(fields) for fields in formats.values())
        raise DataError(f"{source.where(0)}: a record is {wanted}; found fields {rows.column_names}")
    if len(present) == 1:  # one format's columns only: gaps are missing fields, reported as such
        return next(iter(present))
    columns = sorted({field for fields in present.values() for field in fields})
    first = record_format(rows.select_columns(columns)[0], present)
    if first is None:
        raise DataError(f"{source.where(0)}: a record is " + " or ".join(map(describe, present.values())))
    for row, record in records(rows, columns):
        kind = record_format(record, present)
        if kind != first:
            what = f"a {describe(present[kind])} record" if kind else "a record of no known format"
            raise DataError(
                f"{source.where(row)}: {what}, but {source.record(0)} is a {describe(present[first])} "
                "one; use one format per file"
            )
    return first


def records(rows: datasets.Dataset, columns: list[str]) -> Any:
    """(row, record) over ``columns``, a batch at a time (error paths and mixed files only)."""
    values = [python_values(rows, column) for column in columns]
    for cells in zip(*values, strict=True):
        yield cells[0][0], {column: value for column, (_, value) in zip(columns, cells, strict=True)}


def window(ids: list[int], labels: list[int], size: int) -> tuple[list[int], list[int], bool]:
    """At most ``size`` tokens: the prompt's end and the response's start (see the module's doc)."""
    if len(ids) <= size:
        return ids, labels, False
    first_target = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
    start = max(0, min(len(ids) - size, first_target - size // 2))
    return ids[start : start + size], labels[start : start + size], True


class ChatRenderer:
    """A conversation as (text, is target) segments: each assistant turn's text is a target, its header
    and every other turn are not. Cut out of the renders of growing prefixes of the conversation."""

    def __init__(self, tokenizer: Any, template: str | None) -> None:
        self.tokenizer, self.template = tokenizer, template

    def render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.template, tokenize=False, add_generation_prompt=generation_prompt
        )

    def segments(self, messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
        segments, done = [], ""
        for turn, message in enumerate(messages):
            if message["role"] == "assistant":
                header = self.render(messages[:turn], generation_prompt=True)
                segments.append((self.after(done, header), False))
                done = header
            whole = self.render(messages[: turn + 1], generation_prompt=False)
            segments.append((self.after(done, whole), message["role"] == "assistant"))
            done = whole
        return segments

    @staticmethod
    def after(prefix: str, text: str) -> str:
        if not text.startswith(prefix):
            raise ValueError(
                "the chat template does not render a conversation as the start of its continuation, so "
                "turns cannot be told apart; use one that does (data.chat_template)"
            )
        return text[len(prefix) :]


def message_problem(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return 'field \'messages\' must be a non-empty list of {"role", "content"} objects'
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return f"message {number}: 'role' must be one of {', '.join(ROLES)}"
        if not isinstance(message.get("content"), str):
            return f"message {number}: 'content' must be a string"
    return None


class Encode:
    """The tokenizing ``map`` of instruction samples: token ids, labels (targets or IGNORE_INDEX), the
    number of targets, whether the sample was cut to fit, and what is wrong with a bad record."""

    def __init__(self, tokenizer: Any, kind: str, size: int, template: str | None) -> None:
        self.tokenizer, self.kind, self.size = tokenizer, kind, size
        self.chat = ChatRenderer(tokenizer, template)

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        encode: Callable[..., tuple[list[int], list[int]]]
        rows: list[tuple[Any, ...]]
        if self.kind == "messages":
            encode, rows = self.conversation, [(messages,) for messages in batch["messages"]]
        else:
            encode, rows = self.completion, list(zip(batch["prompt"], batch["completion"], strict=True))
        out: dict[str, list[Any]] = {name: [] for name in ENCODED}
        for row in rows:
            try:
                ids, labels = encode(*row)
                problem = None
            except ValueError as error:
                ids, labels, problem = [], [], str(error)
            except jinja2.TemplateError as error:  # the template's own refusal (roles out of order, ...)
                ids, labels, problem = [], [], f"the chat template refused the conversation: {error}"
            targets = sum(label != IGNORE_INDEX for label in labels)
            ids, labels, cut = window(ids, labels, self.size) if targets else (ids, labels, False)
            for name, value in zip(ENCODED, (ids, labels, targets, cut, problem), strict=True):
                out[name].append(value)
        return out

    def completion(self, prompt: Any, completion: Any) -> tuple[list[int], list[int]]:
        for field, value in zip(PROMPT_FIELDS, (prompt, completion), strict=True):
            if not isinstance(value, str):
                raise ValueError(f"field {field!r} must be a string")
        prompt_ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        completion_ids = self.tokenizer(completion, add_special_tokens=False)["input_ids"]
        if completion_ids:
            completion_ids.append(self.tokenizer.eos_token_id)  # the model learns where to stop
        ids = prompt_ids + completion_ids
        return ids, [IGNORE_INDEX] * len(prompt_ids) + completion_ids

    def conversation(self, messages: Any) -> tuple[list[int], list[int]]:
        problem = message_problem(messages)
        if problem:
            raise ValueError(problem)
        segments = [(text, target) for text, target in self.chat.segments(messages) if text]
        encoded = self.tokenizer([text for text, _ in segments], add_special_tokens=False)["input_ids"]
        ids: list[int] = []
        labels: list[int] = []
        for piece, (_, target) in zip(encoded, segments, strict=True):
            ids += piece
            labels += piece if target else [IGNORE_INDEX] * len(piece)
        return ids, labels


def first_problem(encoded: datasets.Dataset) -> tuple[int, str] | None:
    if encoded.data.column("problem").null_count == len(encoded):
        return None
    return next((row, value) for row, value in python_values(encoded, "problem") if value is not None)


class KeepTrainable:
    """The ``map`` that keeps the samples with response tokens, as ids and labels only."""

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        keep = [row for row, targets in enumerate(batch["targets"]) if targets]
        return {name: [batch[name][row] for row in keep] for name in SAMPLES}


def samples(
    reader: SplitReader,
    rows: datasets.Dataset,
    source: Source,
    kind: str,
    encoding: tuple[Any, int, str | None, int],
    folder: Path,
    split: str,
    warnings: list[str],
) -> datasets.Dataset:
    """A split of instruction samples, tokenized in parallel into ``folder``; what was cut or left out is
    added to ``warnings`` (kept with the cache, so that every run that trains on it says so)."""
    tokenizer, size, template, configured = encoding
    if kind == "messages" and template is None and tokenizer.chat_template is None:
        raise DataError(
            f"{source.name}: chat data, but the tokenizer has no chat template; set "
            "data.chat_template=<a Jinja file> (the demo writes one: chat_template.jinja)"
        )
    fields = format_fields("")[kind]
    require_fields(rows, source, fields)
    for field in fields if kind == "prompt" else ():
        require_text(rows, source, field)
    started, workers = time.monotonic(), processes(len(rows), configured)
    encode = Encode(tokenizer, kind, size, template)
    scratch = Path(reader.scratch()) / f"encoded-{split}.arrow"
    encoded = map_batches(rows, encode, ENCODED, str(scratch), f"encoded-{split}", workers)
    problem = first_problem(encoded)
    if problem is not None:
        raise DataError(f"{source.where(problem[0])}: {problem[1]}")
    kept = map_batches(encoded, KeepTrainable(), SAMPLES, arrow_file(folder, split), f"samples-{split}")
    if not len(kept):
        raise DataError(f"{source.name}: no sample has a response token (completion, assistant turn)")
    cut, left_out = int(pc.sum(encoded.data.column("cut")).as_py() or 0), len(encoded) - len(kept)
    if cut or left_out:
        warnings.append(
            f"{source.name}: {cut} of {len(encoded)} samples were longer than {size} tokens "
            f"(data.max_length) and lost their prompt's start or response's end; {left_out} had no "
            "response tokens and were left out"
        )
    seconds = time.monotonic() - started
    log.info(f"tokenized {len(kept)} {split} {kind} samples in {seconds:.1f} s with {workers} process(es)")
    return kept


class SampleDataset(Dataset):
    """Instruction samples, memory-mapped: sample i as (token ids, labels), int32 tensors."""

    def __init__(self, rows: datasets.Dataset) -> None:
        self.ids, self.labels = IntegerLists(rows, "input_ids"), IntegerLists(rows, "labels")

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(self.ids[index]), torch.tensor(self.labels[index])

    def lengths(self) -> np.ndarray:
        return self.ids.lengths()
