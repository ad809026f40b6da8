"""Open-ended answers (video QA, descriptions, free-form): ROUGE, or an LLM judge when configured.

accuracy = mean of ROUGE-1, ROUGE-2 and ROUGE-L F1 (`rouge-score`), or 1 when the normalised
answer equals the reference (case, punctuation, articles and spacing ignored).

Departures from upstream: ROUGE-2 is left out of the mean when the reference has fewer than two
tokens (it is 0 by construction there, which capped a perfect one-word paraphrase at 2/3); the
tokenizer keeps Unicode word characters and splits CJK characters one per token (rouge-score's
default drops everything outside [a-z0-9], so a Chinese answer always scored 0). With
`RewardConfig.judge` set, accuracy is the judge's verdict and ROUGE stays in `parts`.
"""

from __future__ import annotations

import re
from functools import lru_cache

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.judge import judge_one
from easyvideor1.rewards.verdict import Verdict

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")


class _Tokenizer:
    """Lower-cased Unicode word tokens; one token per CJK character."""

    def tokenize(self, text: str) -> list[str]:
        return _TOKEN.findall(text.lower())


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=_Tokenizer())


def normalize(text: str) -> str:
    """Lower case, punctuation and articles (a, an, the) removed, spaces collapsed."""
    words = re.sub(r"[^\w\s]", " ", text.lower()).split()
    return " ".join(w for w in words if w not in ("a", "an", "the"))


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L F1 and their mean ("rouge"), ROUGE-2 dropped for one-token references."""
    scores = _scorer().score(reference, prediction)
    parts = {name: float(scores[name].fmeasure) for name in ("rouge1", "rouge2", "rougeL")}
    used = ["rouge1", "rougeL"] + (["rouge2"] if len(_Tokenizer().tokenize(reference)) >= 2 else [])
    parts["rouge"] = sum(parts[name] for name in used) / len(used)
    return parts


def judge_item(response: str, sample: Sample) -> tuple[str, str, str] | None:
    """(question, reference, answer) to send to the judge, or None when an exact match decides."""
    reference, prediction = answer_text(sample.answer), answer_text(response)
    if _exact(prediction, reference):
        return None
    return (sample.problem, reference, prediction)


def _exact(prediction: str, reference: str) -> bool:
    norm = normalize(reference)
    return prediction.strip() == reference.strip() or (bool(norm) and normalize(prediction) == norm)


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """ROUGE mean (1 on an exact normalised match), or the judge's verdict when configured."""
    reference = answer_text(sample.answer)
    if not reference.strip():
        raise ValueError(f"open-ended sample {sample.problem_id!r} has an empty answer")
    prediction = answer_text(response)
    if _exact(prediction, reference):  # also spares ROUGE-L's quadratic cost on long captions
        parts = {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0, "rouge": 1.0, "exact": 1.0}
    else:
        parts = {**rouge(prediction, reference), "exact": 0.0}
    accuracy = parts["rouge"]
    item = judge_item(response, sample) if cfg.judge is not None else None
    if item is not None:
        parts["judge"] = accuracy = judge_one(cfg.judge, *item)
    content = answer_content(response)
    return Verdict(accuracy=accuracy, valid=bool(content), parts=parts)
