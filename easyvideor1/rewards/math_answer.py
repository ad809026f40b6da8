"""Math: symbolic equivalence of the final answer with `math-verify`, bounded by a timeout.

The answer is read from the `<answer>` tag, else `\\boxed{}` or the last expression of the
response (math-verify's own extraction). Parsing and comparison are limited to
`RewardConfig.math_timeout_s`; a timeout raises TimeoutError (the batch records it as an error
for that sample) instead of silently scoring 0.

math-verify enforces its limit with SIGALRM, which only works in a process's main thread. In
other threads the limit is off and the bound comes from the batch pool's per-sample timeout:
score math in `batch.score_batch`, not in threads of your own.
"""

from __future__ import annotations

import re
import threading

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.verdict import Verdict


def _limit(cfg: RewardConfig) -> int | None:
    return (
        max(1, int(cfg.math_timeout_s))
        if threading.current_thread() is threading.main_thread()
        else None
    )


def _parse(text: str, limit: int | None) -> list:
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        return parse(text, parsing_timeout=limit, raise_on_error=True)
    except TimeoutException as e:
        raise TimeoutError(f"math-verify could not parse {text[:80]!r} within {limit} s") from e
    except Exception:  # math-verify/sympy choke on malformed LaTeX: not an answer
        return []


_FUNCTIONS = {"sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "sqrt", "max", "min", "mod",
              "gcd", "lcm", "det", "lim", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh"}  # fmt: skip


def _is_bare_math(text: str) -> bool:
    """A lone expression ("x^2 + 2x + 1", "2\\pi r"), not prose ("no idea", "the answer is 5")."""
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text:
        return False
    words = re.findall(r"[A-Za-z]{3,}", re.sub(r"\\[A-Za-z]+", " ", text))
    return all(word.lower() in _FUNCTIONS for word in words)


def _read(text: str, limit: int | None) -> list:
    """Parsed final answer: a bare expression is wrapped in $...$ (else math-verify reads only
    its last number: "x^2 + 2x + 1" -> 1); otherwise math-verify's own extraction."""
    tail = answer_text(text)
    if _is_bare_math(tail):
        parsed = _parse(f"${tail}$", limit)
        if parsed:
            return parsed
    parsed = _parse(tail, limit)
    if not parsed and tail != text:
        parsed = _parse(text, limit)
    return parsed


def equivalent(gold: list, pred: list, limit: int | None) -> bool:
    """math-verify equivalence of two parsed answers; TimeoutError past the limit."""
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        return bool(verify(gold, pred, timeout_seconds=limit, raise_on_error=True))
    except TimeoutException as e:
        raise TimeoutError(f"math-verify comparison exceeded {limit} s") from e
    except Exception:  # sympy cannot compare these objects: not equivalent
        return False


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """1 when the response's final answer is mathematically equivalent to the reference."""
    limit = _limit(cfg)
    gold = _read(sample.answer, limit)
    if not gold:
        raise ValueError(
            f"math sample {sample.problem_id!r}: math-verify cannot parse answer {sample.answer!r}"
        )
    pred = _read(response, limit)
    accuracy = 1.0 if pred and equivalent(gold, pred, limit) else 0.0
    content = answer_content(response)
    valid = bool(content) and bool(_read(content, limit))
    return Verdict(accuracy=accuracy, valid=valid, parts={"equivalent": accuracy})
