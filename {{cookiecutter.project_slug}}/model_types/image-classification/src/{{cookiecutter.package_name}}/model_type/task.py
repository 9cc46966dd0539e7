"""Image classification: a folder of class folders, fine-tuning an image classifier.

``data.train_file`` and ``data.val_file`` name folders with one sub-folder of images per class. The folder
names are the class names; they get ids in sorted order, saved with the model (``id2label`` /
``label2id`` in its config). Images (PNG, JPEG, BMP, GIF, WebP; any mode, converted to RGB) lie directly
in their class folder. Other files, folders inside a class folder and files in the top folder are
skipped with one warning; hidden entries (``.DS_Store``, ``.ipynb_checkpoints``) are skipped silently.

Nothing is decoded up front: rank 0 lists the folders once, reads only each image's header to check that
it opens, and shares the resulting file index (paths and labels) with the other ranks through a cache file
under ``output_dir/cache``. Pixels are decoded in the Dataset's ``__getitem__``, i.e. inside the DataLoader
workers of the one rank whose shard holds the sample, and run through the checkpoint's image processor on
its PIL/numpy backend, so torchvision is never needed.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import nn
from torch.utils.data import Dataset, get_worker_info
from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageClassification

from .. import classification
from ..config import Config
from ..data import DataError, cached, fingerprint
from ..distributed import DistEnv, main_process_first
from ..hf import load_classifier, quiet_transformers, save_pretrained
from ..log import log
from ..task_spec import Batch, Task, TaskData

IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")
# Header checks mostly wait on storage (a network filesystem above all), so threads overlap them well.
HEADER_CHECK_THREADS = 16
HEADER_CHECK_CHUNK = 4096  # files handed to the thread pool at a time: bounded memory for huge folders
# transformers 5 names its image-processor backends ("pil", "torchvision"); 4.x called them slow and fast.
# Either way: the PIL/numpy one.
PIL_PROCESSOR = (
    {"backend": "pil"} if find_spec("transformers.image_processing_backends") else {"use_fast": False}
)


class UnreadableImage(DataError):
    """An image that fails to decode, found in ``__getitem__`` (usually inside a DataLoader worker).

    The DataLoader re-raises a worker's exception in the training process as ``type(text)``, where the
    text is the whole worker traceback; the original one-line message is its last line, so keep that.
    """

    def __init__(self, message: str) -> None:
        if message.startswith("Caught ") and "Original Traceback" in message:
            message = message.rstrip().splitlines()[-1].split(": ", 1)[-1]
        super().__init__(message)


def _reason(error: Exception, path: str) -> str:
    """PIL's own message, unless it is empty or repeats the path (then the error's type)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines and path not in lines[0] else type(error).__name__


def load_image(path: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            # Camera JPEGs store their orientation in EXIF; the model should see them upright.
            return ImageOps.exif_transpose(image).convert("RGB")
    except Exception as error:  # PIL raises OSError, SyntaxError, ValueError, ... for broken files
        raise UnreadableImage(
            f"{path}: cannot decode the image ({_reason(error, path)}); replace or remove it"
        ) from None


def _check_header(path: str) -> None:
    try:
        with Image.open(path):  # reads the header only; the pixels are decoded later, in the workers
            pass
    except Exception as error:
        raise DataError(
            f"{path}: not a readable image ({_reason(error, path)}); replace or remove it"
        ) from None


def check_headers(paths: list[str]) -> None:
    """Every file opens as an image; the first bad one in sorted order is the one reported."""
    with ThreadPoolExecutor(max_workers=HEADER_CHECK_THREADS) as pool:
        for start in range(0, len(paths), HEADER_CHECK_CHUNK):
            for _ in pool.map(_check_header, paths[start : start + HEADER_CHECK_CHUNK]):
                pass


def _visible(folder: Path) -> list[os.DirEntry]:
    with os.scandir(folder) as entries:  # scandir: file types without a stat call per file
        return sorted((entry for entry in entries if not entry.name.startswith(".")), key=lambda e: e.name)


def class_folders(root: Path) -> list[Path]:
    """The sub-folders of ``root``; none when it is not a folder (``scan_split`` reports that)."""
    return [Path(entry.path) for entry in _visible(root) if entry.is_dir()] if root.is_dir() else []


def scan_split(root: Path, skipped: list[str]) -> dict[str, list[str]]:
    """The image paths of each class folder of ``root``, both in sorted order."""
    if not root.is_dir():
        raise DataError(f"{root}: not a folder; give a folder with one sub-folder of images per class")
    images: dict[str, list[str]] = {}
    for entry in _visible(root):
        if not entry.is_dir():
            skipped.append(entry.path)
            continue
        files: list[str] = []
        for item in _visible(Path(entry.path)):
            is_image = item.is_file() and Path(item.name).suffix.lower() in IMAGE_SUFFIXES
            (files if is_image else skipped).append(item.path)
        if not files:
            raise DataError(
                f"{entry.path}: class folder without images ({', '.join(IMAGE_SUFFIXES)}); "
                "add images or remove the folder"
            )
        images[entry.name] = files
    if not images:
        raise DataError(f"{root}: no class folders; put each class's images in a sub-folder {root}/<class>/")
    return images


def _encode(images: dict[str, list[str]], names: list[str]) -> dict[str, torch.Tensor]:
    """Paths as one byte matrix (a row per path, zero-padded) and labels as tensors: not lists of str,
    since forked workers that touch Python objects copy the memory pages holding their reference counts
    (a list of a million paths would end up copied into every worker), and tensors load from the cache
    with ``weights_only=True``."""
    ids = {name: index for index, name in enumerate(names)}
    paths = np.array([os.fsencode(path) for name in images for path in images[name]], dtype=np.bytes_)
    labels = [ids[name] for name in images for _ in images[name]]
    path_bytes = torch.from_numpy(paths.view(np.uint8).reshape(len(paths), paths.itemsize).copy())
    return {"paths": path_bytes, "labels": torch.tensor(labels, dtype=torch.int64)}


def build_index(train_root: Path, val_root: Path | None) -> dict[str, Any]:
    skipped: list[str] = []
    train = scan_split(train_root, skipped)
    if len(train) < 2:
        raise DataError(
            f"{train_root}: one class folder ({next(iter(train))}); a classifier needs at least 2 classes"
        )
    names = sorted(train)
    val = scan_split(val_root, skipped) if val_root else None
    for name in val or {}:
        if name not in train and val_root is not None:
            raise DataError(
                f"{val_root / name}: class {name!r} has no folder in data.train_file ({train_root}); "
                "every validation class must be one the model is trained on"
            )
    if skipped:
        entries = (
            "entry that is not an image file" if len(skipped) == 1 else "entries that are not image files"
        )
        log.warning(f"skipped {len(skipped)} {entries} in a class folder, e.g. {skipped[0]}")
    check_headers([path for split in (train, val or {}) for files in split.values() for path in files])
    return {"labels": names, "train": _encode(train, names), "val": _encode(val, names) if val else None}


class ImageFolderDataset(Dataset):
    """Decodes lazily: ``__getitem__`` opens, converts, augments and preprocesses one image."""

    def __init__(self, files: dict[str, torch.Tensor], processor: Any, augment: bool) -> None:
        byte_matrix = files["paths"].numpy()
        self.paths = byte_matrix.view(f"S{byte_matrix.shape[1]}").reshape(len(byte_matrix))
        self.labels = files["labels"].numpy()
        self.processor = processor
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = load_image(os.fsdecode(self.paths[index]))
        if self.augment and self.flips(index):
            image = ImageOps.mirror(image)
        pixels = self.processor(images=image, return_tensors="pt")["pixel_values"][0]
        return pixels, int(self.labels[index])

    def flips(self, index: int) -> bool:
        """Whether this draw of sample ``index`` is mirrored (random horizontal flip, half the time)."""
        worker = get_worker_info()
        if worker is None:  # in the training process, whose random state checkpoints save and restore
            return bool(torch.randint(2, ()).item())
        # In a worker: a function of the epoch's loader seed (the same for all workers: seed minus id)
        # and the sample, so a run resumed mid-epoch, whose batches go to other workers, flips the same.
        return random.Random(f"{worker.seed - worker.id}/{index}").random() < 0.5


class PatchCounter:
    """The positions a batch puts through the model: patches for a vision transformer, else one per image."""

    def __init__(self, patch_size: int | None) -> None:
        self.patch_size = patch_size

    def __call__(self, batch: Batch) -> int:
        images, _, height, width = batch["pixel_values"].shape
        if not self.patch_size:
            return images
        return images * (height // self.patch_size) * (width // self.patch_size)


def collate(samples: list[tuple[torch.Tensor, int]]) -> Batch:
    return {
        "pixel_values": torch.stack([pixels for pixels, _ in samples]),
        "labels": torch.tensor([label for _, label in samples], dtype=torch.long),
    }


def load_processor(config: Config) -> Any:
    return AutoImageProcessor.from_pretrained(config.model.pretrained, **PIL_PROCESSOR)


def build_data(config: Config, env: DistEnv) -> TaskData:
    quiet_transformers()
    train_root = Path(config.data.train_file)
    val_root = Path(config.data.val_file) if config.data.val_file else None
    # A folder's mtime changes when entries are added, removed or renamed in it, so the class folders'
    # stats notice new or deleted images without listing every file on every rank.
    watched = [train_root, *class_folders(train_root)]
    if val_root:
        watched += [val_root, *class_folders(val_root)]
    key = fingerprint(*watched, IMAGE_SUFFIXES)
    cache_file = Path(config.output_dir) / "cache" / f"image-classification-{key}.pt"
    index = cached(cache_file, lambda: build_index(train_root, val_root), env)
    with main_process_first(env):  # rank 0 fetches a hub checkpoint's files, the others read its copy
        processor = load_processor(config)
        patch_size = getattr(AutoConfig.from_pretrained(config.model.pretrained), "patch_size", None)
    val = index["val"]
    return TaskData(
        train=ImageFolderDataset(index["train"], processor, augment=config.data.augment),
        val=ImageFolderDataset(val, processor, augment=False) if val is not None else None,
        collate=collate,
        label_names=index["labels"],
        preprocessor=processor,
        count_tokens=PatchCounter(patch_size if isinstance(patch_size, int) else None),
        reseeds_workers=config.data.augment,  # flips follow the workers' per-epoch seed
    )


def build_model(config: Config, data: TaskData) -> nn.Module:
    names = data.label_names
    model = load_classifier(AutoModelForImageClassification, config.model.pretrained, names)
    log.info(f"loaded {config.model.pretrained} with a classification head for {len(names)} classes")
    return model


def logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(pixel_values=batch["pixel_values"]).logits


def save_final(model: nn.Module, data: TaskData, directory: Path) -> None:
    save_pretrained(model, data.preprocessor, directory)


TASK = Task(
    build_data=build_data,
    build_model=build_model,
    loss_sum=classification.loss_sum(logits),
    evaluation_sums=classification.evaluation_sums(logits),
    sum_names=classification.SUM_NAMES,
    evaluation_metrics=classification.evaluation_metrics,
    save_final=save_final,
)
