"""A tiny ViT with its image processor, and three classes of generated images: where a bright band lies.

The band's position survives what the data loading does to an image (conversion to RGB, resizing,
horizontal flips), so the classes stay learnable; the images come in mixed sizes, modes and formats, as
real folders do.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import transformers
from PIL import Image, ImageDraw
from transformers import ViTConfig, ViTForImageClassification
from transformers.utils import logging as transformers_logging

# transformers 5 names the PIL/numpy image processor apart (the plain name needs torchvision there);
# in transformers 4 the plain name is the PIL/numpy one.
ViTImageProcessor = getattr(transformers, "ViTImageProcessorPil", None) or transformers.ViTImageProcessor

CLASSES = ("bottom", "middle", "top")
IMAGE_SIZE = 32
# (PIL mode, file suffix) of the stored images; training converts every one of them to RGB.
VARIANTS = [("RGB", ".png")] * 4 + [("L", ".png"), ("RGBA", ".png"), ("P", ".png"), ("RGB", ".jpg")]

# Overrides that make two runs on the demo differ by their arithmetic only: no random flips.
REPRODUCIBLE = ["data.augment=false"]


def draw(rng: random.Random, label: str) -> Image.Image:
    width, height = rng.randint(24, 48), rng.randint(24, 48)
    background = tuple(rng.randint(0, 80) for _ in range(3))
    image = Image.new("RGB", (width, height), background)
    canvas = ImageDraw.Draw(image)
    band = height // 3
    top = {"top": 0, "middle": band, "bottom": 2 * band}[label]
    canvas.rectangle((0, top, width - 1, top + band - 1), fill=tuple(rng.randint(170, 255) for _ in range(3)))
    for _ in range(rng.randint(0, 3)):  # small dark or bright specks: noise, not signal
        x, y = rng.randrange(width), rng.randrange(height)
        canvas.rectangle((x, y, x + 2, y + 2), fill=tuple(rng.randint(0, 255) for _ in range(3)))
    return image


def write_split(directory: Path, rng: random.Random, count: int) -> None:
    for number in range(count):
        label = CLASSES[number % len(CLASSES)]
        mode, suffix = rng.choice(VARIANTS)
        image = draw(rng, label)
        if mode == "RGBA":
            image.putalpha(rng.randint(128, 255))
        (directory / label).mkdir(parents=True, exist_ok=True)
        image.convert(mode).save(directory / label / f"{number:04d}{suffix}")


def build(directory: Path) -> list[str]:
    transformers_logging.disable_progress_bar()
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    write_split(directory / "train", rng, 300)
    write_split(directory / "val", rng, 67)  # not a multiple of the world size
    config = ViTConfig(
        image_size=IMAGE_SIZE,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    config.num_labels = 5  # not the demo's 3: fine-tuning must replace the head
    model_dir = directory / "model"
    with torch.random.fork_rng():  # the same "pretrained" weights on every build, the caller's RNG untouched
        torch.manual_seed(0)
        ViTForImageClassification(config).save_pretrained(model_dir)
    ViTImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(model_dir)
    return [
        f"model.pretrained={model_dir}",
        f"data.train_file={directory / 'train'}",
        f"data.val_file={directory / 'val'}",
        "output_dir=outputs/demo",
        "data.batch_size=16",
        "train.epochs=2",
        "train.lr=3e-3",
        "train.warmup_ratio=0.1",
        "data.num_workers=1",
    ]
