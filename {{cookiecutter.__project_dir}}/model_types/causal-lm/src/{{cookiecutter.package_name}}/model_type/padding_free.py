"""Padding-free batches of instruction samples: a micro-batch's samples end to end in one row.

Each sample's position ids start again at 0 and the batch has no attention mask. From such position ids
transformers builds a causal mask that is block-diagonal, one block per sample, so no sample attends to
another and no compute goes to padding. Two things would silently break that isolation: a 2-D attention
mask (all ones over the row, it lets every token see the samples before it) and a key/value cache. A
padding-free forward never gets an attention mask (``model_inputs`` refuses one), and every training
and evaluation forward runs with ``use_cache=False``.

It pays where the attention kernel takes such a row as it is: flash attention's variable-length kernels
(``data.padding_free=auto``, the default, packs there only). With sdpa or eager attention transformers
builds a mask over the whole row instead, whose cost grows with the square of the row: on the bench's
CPU that halved the samples/s of length-grouped padded batches. ``always`` packs with any attention.

Not every model reads sample boundaries from position ids (older or remote-code attention ignores them),
so ``attends_within_samples`` checks the loaded model itself before the first step: two samples packed
into one row must give the logits they give alone. Models that fail it get padded batches, grouped by
length, as before. The collator adds the padding-free row to every padded batch of instruction samples
(``PACKED`` keys; a few integers per token, no device work), and the forward takes the form the model
was found to handle: the choice lives with the model, not with the loaders built before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..config.data import PaddingFree
from ..task.spec import Batch
from .instructions import IGNORE_INDEX

# The check's samples: short, so it costs one small forward even for a large model on the CPU.
PROBE_TOKENS = 12
# Packed and separate logits differ by rounding only (another summation order); a sample that sees
# another one moves them by orders of magnitude more.
PROBE_TOLERANCE = 1e-4


# The padding-free row of a batch, beside its padded rows: its keys, and the batch keys they stand for.
PACKED = {"packed_input_ids": "input_ids", "packed_position_ids": "position_ids", "packed_labels": "labels"}
# Set on the model by ``choose``: True once the model passed the check.
SAMPLES_APART = "keeps_packed_samples_apart"


def worth_trying(mode: PaddingFree, model: nn.Module) -> bool:
    """Whether to check the model for padding-free rows at all (``data.padding_free``)."""
    attention = str(getattr(getattr(model, "config", None), "_attn_implementation", ""))
    return mode is PaddingFree.always or (mode is PaddingFree.auto and "flash_attention" in attention)


def padding_free_batch(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Batch:
    """One row of every sample's tokens; labels as each sample's, but its first position (predicted
    from the previous sample's last token) is no target, as it is none in a padded row."""
    input_ids = torch.cat([ids for ids, _ in pairs]).long().unsqueeze(0)
    labels = torch.cat([targets for _, targets in pairs]).long()
    starts = torch.cumsum(torch.tensor([0] + [len(ids) for ids, _ in pairs[:-1]]), dim=0)
    labels[starts] = IGNORE_INDEX
    position_ids = torch.cat([torch.arange(len(ids)) for ids, _ in pairs]).unsqueeze(0)
    return {"input_ids": input_ids, "position_ids": position_ids, "labels": labels.unsqueeze(0)}


def with_packed_row(batch: Batch, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Batch:
    packed = padding_free_batch(pairs)
    return batch | {key: packed[name] for key, name in PACKED.items()}


def the_form_for(model: nn.Module, batch: Batch) -> Batch:
    """The padding-free row of ``batch`` when it has one and the model keeps packed samples apart, else
    its padded rows."""
    if PACKED.keys() <= batch.keys() and getattr(model, SAMPLES_APART, False):
        return {name: batch[key] for key, name in PACKED.items()}
    return {key: value for key, value in batch.items() if key not in PACKED}


def model_inputs(batch: Batch) -> Batch:
    """What a training or evaluation forward gets of a padded or a padding-free batch."""
    if "position_ids" not in batch:
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if "attention_mask" in batch:
        raise ValueError("a padding-free batch has no attention mask: with one, samples see each other")
    return {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}


def attends_within_samples(model: nn.Module, samples: Sequence[torch.Tensor]) -> bool:
    """Whether ``model`` gives two samples packed into one row the logits they get alone. Runs in eval
    mode without gradients: no dropout draw, no trace in the weights or any random generator."""
    pieces = [ids[:PROBE_TOKENS].long() for ids in samples[:2] if len(ids) >= 2]
    if len(pieces) < 2:
        return False
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            packed = padding_free_batch([(ids, ids) for ids in pieces])
            together = model(**model_inputs(packed), use_cache=False).logits[0]
            alone = [model(input_ids=ids.unsqueeze(0), use_cache=False).logits[0] for ids in pieces]
    except (RuntimeError, TypeError, ValueError):  # a model that takes no position ids, or no such rows
        return False
    finally:
        model.train(was_training)
    separate = torch.cat(alone)
    scale = float(separate.abs().max()) + 1.0
    return bool((together - separate).abs().max() <= PROBE_TOLERANCE * scale)
