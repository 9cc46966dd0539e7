"""Hugging Face helpers shared by the model types that fine-tune a transformers checkpoint.

transformers is imported inside the functions: a custom project does not depend on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def quiet_transformers() -> None:
    """No per-rank load reports or download bars in the job log; the model types log one summary line."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()


def load_classifier(auto_class: Any, pretrained: str, label_names: list[str]) -> PreTrainedModel:
    """A pretrained model with a classification head for ``label_names`` (ids in their order), in fp32:
    the head is new when the checkpoint's label count differs; master weights stay fp32 under autocast."""
    import torch

    return auto_class.from_pretrained(
        pretrained,
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={name: index for index, name in enumerate(label_names)},
        ignore_mismatched_sizes=True,
        dtype=torch.float32,
    )


def save_pretrained(model: nn.Module, preprocessor: Any, directory: Path) -> None:
    """``final/``: weights as safetensors, the config, and the tokenizer or image processor beside them,
    so ``from_pretrained(directory)`` loads both."""
    model.save_pretrained(directory, safe_serialization=True)  # type: ignore[operator]
    preprocessor.save_pretrained(directory)
