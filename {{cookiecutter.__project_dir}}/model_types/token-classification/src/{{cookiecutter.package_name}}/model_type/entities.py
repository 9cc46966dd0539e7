"""Entities of a tag sequence and the counts behind entity-level precision, recall and F1, read the way
``seqeval`` reads them in its default mode (the conlleval rules), without depending on it.

That mode needs no scheme: the same rules chunk IOB1, IOB2, IOE and IOBES tags, and give malformed
sequences (``I-PER`` after ``O``, ``I-LOC`` after ``B-PER``) the meaning conlleval gives them: a tag whose
type differs from the one before starts a new entity. Tags are ``O`` or a prefix ``B``, ``I``, ``E``,
``S``, a ``-`` and a type (``B-PER``): the data reader refuses others. seqeval chunks a list of sentences
as one sequence with an ``O`` between sentences, so no entity spans two sentences, and counting sentence
by sentence, on any rank, adds up to what it counts over the whole set.
"""

from __future__ import annotations

from collections.abc import Sequence

OUTSIDE = "O"
PREFIXES = ("B", "I", "E", "S")
COUNT_NAMES = ("true_positives", "predicted_entities", "true_entities")


def is_tag(name: str) -> bool:
    """``O``, or a prefix, ``-`` and a non-empty type."""
    return name == OUTSIDE or (len(name) > 2 and name[0] in PREFIXES and name[1] == "-")


def _split(tag: str) -> tuple[str, str | None]:
    return (OUTSIDE, None) if tag == OUTSIDE else (tag[0], tag[2:])


def _ends(previous: str, tag: str, previous_type: str | None, kind: str | None) -> bool:
    """Whether an entity ends before ``tag`` (seqeval's ``end_of_chunk``)."""
    if previous in ("E", "S"):
        return True
    if previous in ("B", "I") and tag in ("B", "S", OUTSIDE):
        return True
    return previous != OUTSIDE and previous_type != kind


def _starts(previous: str, tag: str, previous_type: str | None, kind: str | None) -> bool:
    """Whether an entity starts at ``tag`` (seqeval's ``start_of_chunk``)."""
    if tag in ("B", "S"):
        return True
    if previous in ("E", "S", OUTSIDE) and tag in ("E", "I"):
        return True
    return tag != OUTSIDE and previous_type != kind


def entities(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """The entities of one sentence as (type, first word, last word)."""
    found: set[tuple[str, int, int]] = set()
    previous, previous_type, begin = OUTSIDE, None, 0
    for index, name in enumerate([*tags, OUTSIDE]):  # the final O closes an entity at the end
        tag, kind = _split(name)
        if _ends(previous, tag, previous_type, kind) and previous_type is not None:
            found.add((previous_type, begin, index - 1))
        if _starts(previous, tag, previous_type, kind):
            begin = index
        previous, previous_type = tag, kind
    return found


def entity_counts(true_tags: Sequence[str], predicted_tags: Sequence[str]) -> tuple[int, int, int]:
    """(true positives, predicted entities, true entities) of one sentence: an entity is found when
    its type and both of its ends match."""
    truth, predicted = entities(true_tags), entities(predicted_tags)
    return len(truth & predicted), len(predicted), len(truth)


def entity_scores(true_positives: float, predicted: float, true: float) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 from summed counts, 0 where undefined, computed in the
    order of seqeval's arithmetic, so the floats are the same."""
    precision = true_positives / predicted if predicted else 0.0
    recall = true_positives / true if true else 0.0
    denominator = precision + recall
    f1 = (1 + 1.0) * precision * recall / (denominator if denominator else 1.0)
    return {"eval_precision": precision, "eval_recall": recall, "eval_f1": f1}
