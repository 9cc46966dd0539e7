"""BLEU and ROUGE-L of generated targets, exact over any split of the validation set.

sacreBLEU's corpus BLEU is a function of statistics that add up over sentences: the n-gram matches and
totals for n = 1..4, and the hypothesis and reference lengths. Each evaluation batch contributes its own
(``text_sums``); the loop adds them over batches and ranks (loop/evaluation.py) and ``bleu`` scores the
totals with sacreBLEU's own ``BLEU.compute_bleu``: the score of ``BLEU().corpus_score`` over every
prediction at once. ROUGE-L (rouge-score, F-measure) is a mean over samples: a sum and a count.
"""

from __future__ import annotations

from functools import cache
from typing import Any

ORDERS = (1, 2, 3, 4)  # sacreBLEU's default max_ngram_order
SUM_NAMES = (
    *(f"bleu_matches_{n}" for n in ORDERS),
    *(f"bleu_totals_{n}" for n in ORDERS),
    "bleu_sys_len",
    "bleu_ref_len",
    "rougeL_f",
    "generated",
)


@cache
def bleu_metric() -> Any:
    """sacreBLEU's BLEU with its defaults (13a tokenization, exponential smoothing), as corpus_score uses."""
    from sacrebleu.metrics import BLEU

    return BLEU()


@cache
def rouge_scorer() -> Any:
    from rouge_score import rouge_scorer as scoring

    return scoring.RougeScorer(["rougeL"])


def text_sums(predictions: list[str], references: list[str]) -> dict[str, float]:
    """The additive statistics of one batch of generated targets against their references."""
    score = bleu_metric().corpus_score(predictions, [references])
    sums: dict[str, float] = {}
    for n, matches, totals in zip(ORDERS, score.counts, score.totals, strict=True):
        sums[f"bleu_matches_{n}"], sums[f"bleu_totals_{n}"] = matches, totals
    sums["bleu_sys_len"], sums["bleu_ref_len"] = score.sys_len, score.ref_len
    scorer = rouge_scorer()
    rouge = [
        scorer.score(reference, prediction)["rougeL"].fmeasure
        for prediction, reference in zip(predictions, references, strict=True)
    ]
    sums["rougeL_f"], sums["generated"] = sum(rouge), len(predictions)
    return sums


def no_text_sums() -> dict[str, float]:
    """What a batch adds when nothing is generated (generation metrics off)."""
    return dict.fromkeys(SUM_NAMES, 0.0)


def generation_metrics(totals: dict[str, float]) -> dict[str, float]:
    """eval_bleu (0 to 100, as sacreBLEU reports it) and eval_rougeL (0 to 1) of the totals; none when
    nothing was generated."""
    if not totals["generated"]:
        return {}
    return {"eval_bleu": bleu(totals), "eval_rougeL": totals["rougeL_f"] / totals["generated"]}


def bleu(totals: dict[str, float]) -> float:
    metric = bleu_metric()
    score = metric.compute_bleu(
        correct=[round(totals[f"bleu_matches_{n}"]) for n in ORDERS],
        total=[round(totals[f"bleu_totals_{n}"]) for n in ORDERS],
        sys_len=round(totals["bleu_sys_len"]),
        ref_len=round(totals["bleu_ref_len"]),
        smooth_method=metric.smooth_method,
        smooth_value=metric.smooth_value,
        effective_order=metric.effective_order,
        max_ngram_order=metric.max_ngram_order,
    )
    return float(score.score)
