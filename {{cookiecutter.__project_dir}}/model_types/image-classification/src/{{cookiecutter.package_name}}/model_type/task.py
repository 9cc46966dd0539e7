"""Image classification: a folder of class folders, or a hub dataset, fine-tuning an image classifier.

``data.train_file`` and ``data.val_file`` name folders with one sub-folder of images per class (see
image_folders.py); the folder names are the class names, with ids in sorted order. Or ``data.hub_dataset``
names a hub dataset or local dataset folder (an image folder laid out the same way, one saved with
``save_to_disk``, ...) with an image column (``data.image_field``) and a label column
(``data.label_field``: class ids, class names, or a ``ClassLabel``). The names are saved with the model
(``id2label`` / ``label2id`` in its config).

Nothing is decoded up front: one rank per filesystem lists the folders (reading each image's header to
check that it opens) or reads the hub dataset's labels, and writes the index (image path or encoded bytes,
label id) as Arrow files under ``output_dir/cache`` that every rank memory-maps (see data/cache.py). Pixels
are decoded in the Dataset's ``__getitem__``, i.e. inside the DataLoader workers of the one rank whose
shard holds the sample, and run through the checkpoint's image processor on its PIL/numpy backend, so
torchvision is never needed.
"""

from __future__ import annotations

import random
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import datasets
import torch
from datasets.fingerprint import Hasher
from PIL import ImageOps
from torch import nn
from torch.utils.data import Dataset, get_worker_info
from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageClassification

from ..config import Config
from ..data.arrow_rows import ChunkedColumn, Integers
from ..data.cache import arrow_file, prepare
from ..data.labels import read_classes, require_known
from ..data.loader import DataError
from ..data.sources import Source, SplitReader, file_stat, quiet_datasets, require_fields, split_sources
from ..observe.log import log
from ..parallel.process_group import DistEnv, main_process_first
from ..task import classification
from ..task.hugging_face import load_classifier, quiet_transformers, save_pretrained
from ..task.spec import Batch, Task, TaskData
from .image_folders import IMAGE_SUFFIXES, class_folders, load_image, scan_splits

# transformers 5 names its image-processor backends ("pil", "torchvision"); 4.x called them slow and fast.
# Either way: the PIL/numpy one.
PIL_PROCESSOR = (
    {"backend": "pil"} if find_spec("transformers.image_processing_backends") else {"use_fast": False}
)
CACHE_FORMAT = 2  # of the index; part of its key, so an older layout is never read
INDEX = datasets.Features(
    {"path": datasets.Value("string"), "bytes": datasets.Value("binary"), "label": datasets.Value("int64")}
)


class ImageFolderDataset(Dataset):
    """Decodes lazily: ``__getitem__`` opens, converts, augments and preprocesses one image."""

    def __init__(self, rows: datasets.Dataset, processor: Any, augment: bool, name: str) -> None:
        self.index = ChunkedColumn(rows, "path")
        self.paths = self.index.chunks
        self.encoded = ChunkedColumn(rows, "bytes").chunks
        self.labels = Integers(rows, "label")
        self.processor, self.augment, self.name = processor, augment, name

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        chunk, row = self.index.locate(index)
        path, data = self.paths[chunk][row].as_py(), self.encoded[chunk][row].as_py()
        image = load_image(path, data, name=f"{self.name}: row {index + 1}" if data is not None else "")
        if self.augment and self.flips(index):
            image = ImageOps.mirror(image)
        pixels = self.processor(images=image, return_tensors="pt")["pixel_values"][0]
        return pixels, self.labels[index]

    def flips(self, index: int) -> bool:
        """Whether this draw of sample ``index`` is mirrored (random horizontal flip, half the time)."""
        worker = get_worker_info()
        if worker is None:  # in the training process, whose random state checkpoints save and restore
            return bool(torch.randint(2, ()).item())
        # In a worker: a function of the epoch's loader seed (the same for all workers: seed minus id)
        # and the sample, so a run resumed mid-epoch, whose batches go to other workers, flips the same.
        return random.Random(f"{worker.seed - worker.id}/{index}").random() < 0.5


class EncodeImages:
    """The ``map`` that turns a hub dataset's rows into the index: the image's path or bytes, label id."""

    def __init__(self, image_field: str, label_field: str, ids: Any) -> None:
        self.image_field, self.label_field, self.ids = image_field, label_field, ids

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        images = batch[self.image_field]
        return {
            "path": [image["path"] or "" for image in images],
            "bytes": [image["bytes"] for image in images],
            "label": self.ids(batch[self.label_field]),
        }


class IndexRecipe:
    """How the image index is made (data_cache.Recipe): folders listed, or a hub dataset's rows."""

    name = "image-classification"

    def __init__(self, config: Config, reader: SplitReader) -> None:
        data = config.data
        self.train_source, self.val_source = split_sources(data, data.train_file, data.val_file)
        self.hub, self.reader = bool(data.hub_dataset), reader
        self.image_field, self.label_field = data.image_field, data.label_field

    def key(self) -> str:
        sources = [source for source in (self.train_source, self.val_source) if source is not None]
        if self.hub:
            # A hub id is known by the fingerprint datasets gives what it loaded (no public name for it).
            data: list[Any] = [s.fingerprint() or self.reader.read(s)._fingerprint for s in sources]
        else:  # a folder's mtime changes when entries are added, removed or renamed in it
            roots = [Path(source.path) for source in sources]
            data = [
                [file_stat(folder) for folder in (root, *class_folders(root))]
                for root in roots
                if root.exists()
            ]
        return str(Hasher.hash((CACHE_FORMAT, data, IMAGE_SUFFIXES, self.image_field, self.label_field)))

    def build(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        build = self.from_hub if self.hub else self.from_folders
        return build(folder)

    def from_folders(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        val_root = Path(self.val_source.path) if self.val_source else None
        names, train, val = scan_splits(Path(self.train_source.path), val_root)
        ids = {name: number for number, name in enumerate(names)}
        index = {}
        for split, images in (("train", train), ("val", val)):
            if images is not None:
                paths = [path for name in images for path in images[name]]
                labels = [ids[name] for name in images for _ in images[name]]
                rows = {"path": paths, "bytes": [None] * len(paths), "label": labels}
                index[split] = datasets.Dataset.from_dict(rows, features=INDEX).map(
                    cache_file_name=arrow_file(folder, split), new_fingerprint=f"index-{split}"
                )
        return index, {"labels": names, "names": {split: self.name_of(split) for split in index}}

    def from_hub(self, folder: Path) -> tuple[dict[str, datasets.Dataset], dict[str, Any]]:
        splits = {"train": self.train_source, "val": self.val_source}
        rows = {split: self.read(source) for split, source in splits.items() if source is not None}
        classes = read_classes(rows["train"], self.train_source, self.label_field)
        if self.val_source is not None:
            trained = f"split {self.train_source.split!r}"
            require_known(rows["val"], self.val_source, self.label_field, classes, trained)
        encode = EncodeImages(self.image_field, self.label_field, classes.ids)
        index = {
            split: data.map(
                encode,
                batched=True,
                remove_columns=data.column_names,
                features=INDEX,
                cache_file_name=arrow_file(folder, split),
                new_fingerprint=f"index-{split}",
            )
            for split, data in rows.items()
        }
        return index, {"labels": classes.names, "names": {split: self.name_of(split) for split in index}}

    def read(self, source: Source) -> datasets.Dataset:
        rows = self.reader.read(source)
        require_fields(rows, source, (self.image_field, self.label_field))
        if not isinstance(rows.features[self.image_field], datasets.Image):
            raise DataError(
                f"{source.name}: column {self.image_field!r} holds no images; set data.image_field"
            )
        return rows.cast_column(self.image_field, datasets.Image(decode=False))

    def name_of(self, split: str) -> str:
        source = self.train_source if split == "train" else self.val_source
        return source.name if source is not None else split


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
    quiet_datasets()
    root = Path(config.output_dir) / "cache"
    with SplitReader(root) as reader:
        prepared = prepare(IndexRecipe(config, reader), root, env)
    with main_process_first(env):  # rank 0 fetches a hub checkpoint's files, the others read its copy
        processor = load_processor(config)
        patch_size = getattr(AutoConfig.from_pretrained(config.model.pretrained), "patch_size", None)
    splits, names = prepared.splits, prepared.meta["names"]
    val = splits.get("val")
    return TaskData(
        train=ImageFolderDataset(splits["train"], processor, config.data.augment, names["train"]),
        val=ImageFolderDataset(val, processor, False, names["val"]) if val is not None else None,
        collate=collate,
        label_names=prepared.meta["labels"],
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
