"""Predict with a fine-tuned model: ``python -m <package>.predict MODEL_DIR INPUT [--output FILE]``.

One process, on the GPU if there is one. The inputs are read in this project's own data format (the
model type's ``model_type/predict.py`` knows it), prepared, and run in batches of similar length, longest
first; the records come out as JSON Lines, one line per input, in input order. A progress bar shows on a
terminal. Bad input ends the command with one line naming the file and line, as in training; the model
type's warnings (files it skipped) reach standard error through logging's last-resort handler.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .config.cli import CommandParser, command_parser, whole_number
from .data.loader import DataError
from .task.spec import PredictError, Predictor

DESCRIPTION = """Runs the fine-tuned model in MODEL_DIR (a run's final/ folder, e.g. outputs/run/final) on
INPUT, in this project's data format, and writes one JSON line per input, in input order, to
standard output or --output FILE. One process: the GPU if there is one, else the CPU."""


def build_parser(add_type_arguments: Any) -> CommandParser:
    parser = command_parser("predict", DESCRIPTION)
    parser.add_argument("model_dir", metavar="MODEL_DIR", type=Path, help="a run's final/ folder")
    parser.add_argument("input", metavar="INPUT", type=Path, help="the inputs, in this project's data format")
    parser.add_argument("--output", metavar="FILE", type=Path, help="default: standard output")
    parser.add_argument(
        "--batch-size", type=whole_number(1), default=32, metavar="N", help="inputs per batch (default: 32)"
    )
    parser.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="default: cuda if there is a GPU"
    )
    add_type_arguments(parser)
    return parser


def batches_by_length(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Input positions in batches of similar length, longest first; equal lengths keep input order."""
    order = sorted(range(len(lengths)), key=lambda position: -lengths[position])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def select_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise PredictError("--device cuda: CUDA is not available on this machine; use --device cpu")
    return torch.device(choice)


def predict_all(predictor: Predictor, inputs: list[Any], batch_size: int) -> list[dict[str, Any]]:
    """The records of every input, in input order; a progress bar on a terminal."""
    items = predictor.prepare(inputs)
    records: list[dict[str, Any]] = [{} for _ in items]
    batches = batches_by_length([predictor.length(item) for item in items], batch_size)
    with tqdm(total=len(items), unit="input", disable=not sys.stderr.isatty(), file=sys.stderr) as bar:
        for batch in batches:
            with torch.inference_mode():
                predicted = predictor.predict([items[position] for position in batch])
            for position, record in zip(batch, predicted, strict=True):
                records[position] = record
            bar.update(len(batch))
    return records


def write_records(records: list[dict[str, Any]], output: Path | None) -> None:
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    if output is None:
        sys.stdout.write(text)
        return
    partial = output.with_name(output.name + ".partial")  # a killed run leaves no half-written file
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, output)


def main(argv: list[str] | None = None) -> int:
    from .model_type.predict import PREDICTION  # its model library, and the options it adds

    args = build_parser(PREDICTION.add_arguments).parse_args(argv)
    try:
        if not args.model_dir.is_dir():
            raise PredictError(f"{args.model_dir}: not a folder; pass a run's final/, e.g. outputs/run/final")
        if not args.input.exists():
            raise PredictError(f"{args.input}: no such file or folder")
        inputs = PREDICTION.read_inputs(args.input)
        predictor = PREDICTION.load(args.model_dir, args, select_device(args.device))
        records = predict_all(predictor, inputs, args.batch_size)
        write_records(records, args.output)
    except (DataError, PredictError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.output is not None:
        print(f"{len(records)} predictions written to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
