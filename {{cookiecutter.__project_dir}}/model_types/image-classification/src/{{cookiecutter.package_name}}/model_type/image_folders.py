"""Image folders: one sub-folder of images per class; listing them, checking headers, opening images.

Images (PNG, JPEG, BMP, GIF, WebP; any mode, converted to RGB) lie directly in their class folder. Other
files, folders inside a class folder and files in the top folder are skipped with one warning; hidden
entries (``.DS_Store``, ``.ipynb_checkpoints``) are skipped silently. Listing reads each image's header
only; the pixels are decoded when a sample is loaded.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image, ImageOps

from ..data.loader import DataError
from ..observe.log import log

IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")
# Header checks mostly wait on storage (a network filesystem above all), so threads overlap them well.
HEADER_CHECK_THREADS = 16
HEADER_CHECK_CHUNK = 4096  # files handed to the thread pool at a time: bounded memory for huge folders


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


def load_image(path: str, data: bytes | None = None, name: str = "") -> Image.Image:
    """The image at ``path``, or encoded in ``data`` (a hub dataset's row, called ``name``), in RGB."""
    try:
        with Image.open(path if data is None else io.BytesIO(data)) as image:
            # Camera JPEGs store their orientation in EXIF; the model should see them upright.
            return ImageOps.exif_transpose(image).convert("RGB")
    except Exception as error:  # PIL raises OSError, SyntaxError, ValueError, ... for broken files
        raise UnreadableImage(
            f"{name or path}: cannot decode the image ({_reason(error, name or path)}); replace or remove it"
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


def scan_splits(
    train_root: Path, val_root: Path | None
) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]] | None]:
    """The class names, and each split's image paths by class, every image's header checked."""
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
    return names, train, val
