"""OCR: 1 - word error rate (`jiwer`), clipped to [0, 1], with exact match as a part.

Text is compared case-sensitively after collapsing whitespace (OCR answers are judged on what
was written). An empty prediction has WER 1 and scores 0.
"""

from __future__ import annotations

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.verdict import Verdict


def word_accuracy(prediction: str, reference: str) -> float:
    """max(0, 1 - WER).

    >>> word_accuracy("STOP HERE NOW", "STOP HERE")  # one insertion over two words
    0.5
    """
    import jiwer

    if not prediction.split():
        return 0.0
    return max(0.0, 1.0 - float(jiwer.wer(reference, prediction)))


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = 1 - WER of the answer text against the reference text."""
    reference = " ".join(answer_text(sample.answer).split())
    if not reference:
        raise ValueError(f"ocr sample {sample.problem_id!r} has an empty answer")
    prediction = " ".join(answer_text(response).split())
    accuracy = word_accuracy(prediction, reference)
    exact = 1.0 if prediction == reference else 0.0
    content = answer_content(response)
    return Verdict(
        accuracy=accuracy, valid=bool(content), parts={"wer_score": accuracy, "exact": exact}
    )
