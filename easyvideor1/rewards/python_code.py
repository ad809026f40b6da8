"""Python code: run the sample's reference tests against the response in the sandbox.

Tests come from the sample's extra fields, first found of:
  `tests`      list of snippets (each run separately, e.g. "assert add(1, 2) == 3") or one string;
  `test_list`  the same (MBPP's name), with optional `test_setup_code` run before each;
  `test`       one HumanEval-style string; with `entry_point`, "check(<entry_point>)" is appended.
accuracy = fraction of tests passed. The code is the last ```python fenced block of the answer
text (else of the response), else the answer text itself. It is only ever compiled to check
syntax in this process (format validity); it runs only in `sandbox.run_python`. Identical
(code, tests) runs are cached per process (GRPO groups repeat answers), so a flaky program
keeps its first score within a process.
"""

from __future__ import annotations

import re
from functools import lru_cache

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.sandbox import SandboxRun, run_python
from easyvideor1.rewards.verdict import Verdict

MAX_CODE_CHARS = 100_000
_FENCE = re.compile(r"```[ \t]*+(?:python3|python|py)?[ \t]*+\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    """The program a response gives: last fenced block of the answer text or response, else the answer text."""
    for part in (answer_text(text), text):
        blocks = _FENCE.findall(part)
        if blocks:
            return blocks[-1]
    return answer_text(text)


def is_python(code: str) -> bool:
    """Non-empty, not too long, and compiles (catches `return` outside a function too)."""
    if not code.strip() or len(code) > MAX_CODE_CHARS:
        return False
    try:
        compile(code, "<response>", "exec", dont_inherit=True)  # compiles, never runs
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def sample_tests(sample: Sample) -> list[str]:
    """The test snippets of a sample (see module docstring); ValueError when there are none."""
    extra = sample.extra
    tests = extra.get("tests", extra.get("test_list"))
    if tests is None and isinstance(extra.get("test"), str):
        tests = extra["test"] + (
            f"\ncheck({extra['entry_point']})\n" if extra.get("entry_point") else ""
        )
    if isinstance(tests, str):
        tests = [tests]
    if not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(
            f"code sample {sample.problem_id!r} has no tests: add `tests` (a list of snippets "
            "such as 'assert f(1) == 2'), `test_list`, or `test` + `entry_point`"
        )
    setup = extra.get("test_setup_code") or ""
    return [f"{setup}\n{t}" if setup else t for t in tests]


@lru_cache(maxsize=1024)
def _run_cached(code: str, tests: tuple[str, ...], timeout_s: float, memory_mb: int) -> SandboxRun:
    return run_python(code, list(tests), timeout_s=timeout_s, memory_mb=memory_mb)


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = passed / total reference tests; 0 for code that does not parse."""
    tests = sample_tests(sample)
    code = extract_code(response)
    content = answer_content(response)
    valid = content is not None and is_python(extract_code(content))
    if not is_python(code):
        return Verdict(accuracy=0.0, valid=valid, parts={"pass_rate": 0.0, "compiles": 0.0})
    run = _run_cached(code, tuple(tests), cfg.code_timeout_s, cfg.code_memory_mb)
    accuracy = sum(run.passed) / len(tests)
    parts = {"pass_rate": accuracy, "compiles": 1.0, "timed_out": float(run.timed_out)}
    return Verdict(accuracy=accuracy, valid=valid, parts=parts)
