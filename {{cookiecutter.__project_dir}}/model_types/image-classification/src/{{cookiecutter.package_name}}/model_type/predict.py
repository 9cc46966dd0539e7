"""``python -m <package>.predict``: classify images with a fine-tuned image classifier. INPUT is a folder
(every image in it and its sub-folders, in sorted order: a validation split works as it is) or a text
file listing one image path per line, relative to the list's folder. Each record: ``image`` (its path),
``label`` and ``score``, plus ``scores`` with ``--top-k``. ``PREDICTION`` at the end hands it to the
shared command."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoImageProcessor, AutoModelForImageClassification

from ..data.loader import DataError
from ..observe.log import log
from ..task import classification
from ..task.hugging_face import load_fine_tuned, load_preprocessor
from ..task.spec import Prediction
from .image_folders import IMAGE_SUFFIXES, check_headers, load_image
from .task import PIL_PROCESSOR


def is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


def images_in(folder: Path) -> list[str]:
    """The images under ``folder``, in sorted order; other files are skipped with one warning, hidden
    entries (``.DS_Store``) silently."""
    images: list[str] = []
    skipped: list[str] = []
    for root, folders, files in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in sorted(name for name in files if not name.startswith(".")):
            (images if is_image(Path(name)) else skipped).append(os.path.join(root, name))
    if skipped:
        entries = (
            "entry that is not an image file" if len(skipped) == 1 else "entries that are not image files"
        )
        log.warning(f"skipped {len(skipped)} {entries}, e.g. {skipped[0]}")
    if not images:
        raise DataError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)}) in it or its sub-folders")
    return images


def images_listed(list_file: Path) -> list[str]:
    images = []
    for number, line in enumerate(list_file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        path = list_file.parent / line.strip()
        if not path.is_file():
            raise DataError(f"{list_file}:{number}: {path} does not exist (paths are relative to the list)")
        if not is_image(path):
            raise DataError(f"{list_file}:{number}: {path} is not an image ({', '.join(IMAGE_SUFFIXES)})")
        images.append(str(path))
    if not images:
        raise DataError(f"{list_file}: no image paths; list one per line")
    return images


def read_inputs(path: Path) -> list[str]:
    images = images_in(path) if path.is_dir() else images_listed(path)
    check_headers(images)  # every image opens: a broken one is named before the model loads
    return images


class ImageClassifier:
    def __init__(self, model: Any, processor: Any, device: torch.device, top_k: int) -> None:
        self.model, self.processor, self.device, self.top_k = model.to(device), processor, device, top_k
        self.names = classification.class_names(model.config.id2label)

    def prepare(self, inputs: list[str]) -> list[str]:
        return inputs  # decoded batch by batch in predict: memory for one batch of images only

    def length(self, item: str) -> int:
        return 1  # every image is resized alike: batches in input order

    def predict(self, batch: list[str]) -> list[dict[str, Any]]:
        pixels = self.processor(images=[load_image(path) for path in batch], return_tensors="pt")[
            "pixel_values"
        ]
        logits = self.model(pixel_values=pixels.to(self.device)).logits
        records = classification.prediction_records(logits, self.names, self.top_k)
        return [{"image": path, **record} for path, record in zip(batch, records, strict=True)]


def load(model_dir: Path, options: argparse.Namespace, device: torch.device) -> ImageClassifier:
    model = load_fine_tuned(AutoModelForImageClassification, model_dir, "image classifier")
    processor = load_preprocessor(AutoImageProcessor, model_dir, **PIL_PROCESSOR)
    return ImageClassifier(model, processor, device, options.top_k)


PREDICTION = Prediction(read_inputs=read_inputs, load=load, add_arguments=classification.add_top_k)
