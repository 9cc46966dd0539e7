"""Model types. Each module in this package is one model type, chosen when the project was rendered.

A model type module provides these functions; the shared loop calls nothing else:

- ``build_data(config, env) -> TaskData``: datasets, collate function and extras (label names, ...).
- ``build_model(config, data) -> nn.Module``: the pretrained model with its head sized from the data.
- ``training_loss(model, batch) -> Tensor``: mean loss of the batch.
- ``EVALUATION_SUMS``: the names of the sums evaluation adds up, e.g. ``("loss", "correct", "count")``.
- ``evaluation_sums(model, batch) -> dict[str, Tensor]``: those sums for one batch; they add up
  across batches and ranks, so the reduced metrics are exact whatever the world size.
- ``evaluation_metrics(sums) -> dict[str, float]``: ``eval_loss`` and the type's metric from the sums.
- ``save_final(model, data, directory)``: the fine-tuned model, loadable the way users load it.

Its companion ``<model type>_checks.py`` provides ``check_config(config)``: refuse missing paths or
settings (raises ``ConfigError``). It imports nothing heavy, so launch.sh's pre-check runs it in a second.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..constants import MODEL_TYPE


def load_task() -> ModuleType:
    return importlib.import_module(f"{__name__}.{MODEL_TYPE.replace('-', '_')}")


def load_checks() -> ModuleType:
    return importlib.import_module(f"{__name__}.{MODEL_TYPE.replace('-', '_')}_checks")
