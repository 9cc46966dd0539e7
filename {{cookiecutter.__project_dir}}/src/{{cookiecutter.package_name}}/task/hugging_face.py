"""Hugging Face helpers shared by the model types that fine-tune a transformers checkpoint.

transformers is imported inside the functions: a custom project does not depend on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from .spec import PredictError

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def quiet_transformers() -> None:
    """No per-rank load reports or download bars in the job log; the model types log one summary line."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()


# The attribute of a loaded model that names the modules the checkpoint lacked (initialised at loading).
NEW_MODULES = "modules_new_at_fine_tuning"


def load_classifier(auto_class: Any, pretrained: str, label_names: list[str]) -> PreTrainedModel:
    """A pretrained model with a classification head for ``label_names`` (ids in their order), in fp32:
    the head is new when the checkpoint's label count differs; master weights stay fp32 under autocast.
    The modules whose weights the checkpoint lacked are listed in the model's ``NEW_MODULES`` attribute."""
    import torch

    model, info = auto_class.from_pretrained(
        pretrained,
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={name: index for index, name in enumerate(label_names)},
        ignore_mismatched_sizes=True,
        dtype=torch.float32,
        output_loading_info=True,
    )
    missing = [*info.get("missing_keys", ()), *(key for key, *_ in info.get("mismatched_keys", ()))]
    setattr(model, NEW_MODULES, sorted({key.rpartition(".")[0] for key in missing}))
    return model


def head_modules(model: nn.Module) -> list[str]:
    """The names of the modules new at fine-tuning, which LoRA trains whole (task/lora.py): the model's own
    modules beside its pretrained body (``base_model``) and its output layer (a classification head), and
    those the checkpoint lacked (``NEW_MODULES``: a BERT pooler of a masked-LM checkpoint), which would
    otherwise stay at a random start that the adapter alone cannot restore."""
    body = getattr(model, "base_model", model)
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    heads = [
        name
        for name, child in model.named_children()
        if body is not model
        and child is not body
        and child is not output
        and any(True for _ in child.parameters())
    ]
    inside_heads = tuple(f"{head}." for head in heads)
    new = [name for name in getattr(model, NEW_MODULES, []) if name and not name.startswith(inside_heads)]
    return [*heads, *(name for name in new if name not in heads)]


def save_pretrained(model: nn.Module, preprocessor: Any, directory: Path) -> None:
    """``final/``: weights as safetensors, the config, and the tokenizer or image processor beside them,
    so ``from_pretrained(directory)`` loads both."""
    model.save_pretrained(directory, safe_serialization=True)  # type: ignore[operator]
    preprocessor.save_pretrained(directory)


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def load_fine_tuned(auto_class: Any, model_dir: Path, kind: str) -> PreTrainedModel:
    """The model saved in ``model_dir`` by training (a ``final/``, or a LoRA run's ``final/adapter/`` on
    top of the base model it names), in fp32 and in eval mode.

    A folder whose weights leave part of the model to be initialised at random (a pretrained checkpoint
    without the head, or another type's model) is refused: its predictions would be noise. This is the
    one place predict reads a model folder.
    """
    import torch

    if (model_dir / "adapter_config.json").is_file():
        return load_adapter(auto_class, model_dir, kind)
    if not (model_dir / "config.json").is_file():
        raise PredictError(
            f"{model_dir}: no config.json; pass a folder saved by training, e.g. outputs/run/final"
        )
    quiet_transformers()
    try:
        model, info = auto_class.from_pretrained(model_dir, output_loading_info=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as error:
        raise PredictError(f"{model_dir}: cannot load a {kind} ({_first_line(error)})") from None
    mismatched = (key[0] if isinstance(key, tuple) else key for key in info["mismatched_keys"])
    missing = sorted(info["missing_keys"]) + sorted(str(key) for key in mismatched)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise PredictError(
            f"{model_dir}: not a fine-tuned {kind}: its weights lack {missing[0]}{more}; "
            "pass the final/ folder of a training run"
        )
    return model.eval()


def load_adapter(auto_class: Any, adapter_dir: Path, kind: str) -> PreTrainedModel:
    """The base model ``adapter_config.json`` names, with the adapter merged in (the head it trained
    included): what the same run's merged ``final/`` holds."""
    import json
    import warnings

    import torch
    from transformers import AutoConfig

    try:
        import peft
    except ImportError:
        raise PredictError(f"{adapter_dir}: a LoRA adapter, which needs peft; pip install peft") from None
    base = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    base_model = base.get("base_model_name_or_path") or ""
    quiet_transformers()
    try:
        # The adapter folder's config.json: the fine-tuned model's (its labels, for a classifier); a head of
        # another size in the base is replaced by the adapter's trained one, as training replaced it.
        # The config as an object: an Auto class given a path reads the base model's config instead.
        config = AutoConfig.from_pretrained(adapter_dir)
        model = auto_class.from_pretrained(
            base_model, config=config, dtype=torch.float32, ignore_mismatched_sizes=True
        )
        with warnings.catch_warnings():  # peft reads transformers' deprecated name for it
            warnings.filterwarnings("ignore", ".is_gradient_checkpointing. is deprecated", FutureWarning)
            warnings.filterwarnings("ignore", "fan_in_fan_out is set to False but the target module is")
            adapted = peft.PeftModel.from_pretrained(model, str(adapter_dir))
    except (OSError, ValueError, KeyError) as error:
        raise PredictError(
            f"{adapter_dir}: cannot load the adapter on its base model {base_model!r} "
            f"({_first_line(error)}); pass the merged final/ folder instead"
        ) from None
    return adapted.merge_and_unload().eval()


def load_preprocessor(auto_class: Any, model_dir: Path, **options: Any) -> Any:
    """The tokenizer or image processor saved beside the model in ``model_dir``."""
    try:
        return auto_class.from_pretrained(model_dir, **options)
    except (OSError, ValueError, KeyError) as error:
        reason = _first_line(error)
        raise PredictError(f"{model_dir}: cannot load its {auto_class.__name__} ({reason})") from None
