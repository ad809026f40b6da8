"""Captions judged through a multiple-choice question (TempCompass' `captioning` protocol).

The model writes a caption; an LLM judge reads only that caption and answers a multiple-choice
question about the video (`sample.extra["mc_question"]`, its key `sample.extra["mc_answer"]`,
e.g. "B. dunking a basketball"). The caption is right when the judge picks the key's letter.
Rule as TempCompass' `eval_captioning.py` (`parse_llm_output`, github.com/llyx97/TempCompass):
the judge's "Answer:" line (else its whole reply) must start with the key's letter before ". "
and name exactly one of "A.", "B.", "C.", "D."; "None of the choices are correct" is wrong.
The judge prompt below paraphrases the official `caption_evaluation_prompt` (same task, same
"Reasoning: / Answer:" reply format, without its worked examples).

Without a judge (`RewardConfig.judge` unset) there is no score: the scorer raises, so the
sample is a failed row naming what to configure, never a silent 0 or a ROUGE stand-in.
"""

from __future__ import annotations

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_text
from easyvideor1.rewards.judge import judge_reply
from easyvideor1.rewards.verdict import Verdict

CAPTION_JUDGE_PROMPT = (
    "You are given a description of a video and a multiple-choice question about that video. "
    "Using only the description, choose the correct option and explain your choice in one sentence. "
    "If no option is correct or the description does not say enough to decide, answer "
    "\"None of the choices are correct\".\nReply in exactly this format:\n"
    "Reasoning: <your reason>\nAnswer: <the option, e.g. B. text>\n\n"
    "Video Description: {caption}\nMulti-Choice Question:\n{question}\n"
)


def rating(reply: str, key: str) -> float:
    """1.0 when the judge's answer is `key`'s option (the official rule), else 0.0.

    >>> rating("Reasoning: it dunks.\\nAnswer: B. dunking a basketball", "B. dunking a basketball")
    1.0
    >>> rating("Answer: A. or B.", "B. dunking"), rating("None of the choices are correct", "B. x")
    (0.0, 0.0)
    """
    answer = reply
    for line in reply.split("\n"):
        if "Answer" in line:
            answer = line.strip().replace("Answer:", "").strip()
    letters = sum(answer.count(p) for p in ("A.", "B.", "C.", "D."))
    return float(answer.split(". ")[0] == key.split(". ")[0] and letters == 1)


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """The judge's reading of the caption against the sample's multiple-choice question."""
    question, key = sample.extra.get("mc_question"), sample.extra.get("mc_answer")
    if not question or not key:
        raise ValueError(f"caption sample {sample.problem_id!r} has no mc_question/mc_answer to judge against")
    if cfg.judge is None:
        raise ValueError("captions are scored by an LLM judge reading them: pass --judge-endpoint and "
                         "--judge-model (RewardConfig.judge)")
    caption = answer_text(response)
    reply = judge_reply(cfg.judge, CAPTION_JUDGE_PROMPT.format(caption=caption, question=question))
    value = rating(reply, str(key))
    return Verdict(accuracy=value, valid=bool(caption.strip()), parts={"judge": value})
