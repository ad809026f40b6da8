"""LLM-as-judge over any OpenAI-compatible `/v1/chat/completions` server (vLLM, SGLang, APIs).

The prompt (a `str.format` template with {question}, {reference}, {answer}) asks for a final
line "Verdict: correct | partially correct | incorrect"; `parse_verdict` reads it (and a few
common alternatives) into 1.0 / 0.5 / 0.0. Requests time out, are retried with exponential
backoff on timeouts, transport errors, 429 and 5xx, and are cached on disk keyed by
sha256(model, prompt), so a batch can prefetch all verdicts concurrently (`judge_many`) and the
scorer processes then read them from the cache (`judge_one`). An unreadable verdict or
exhausted retries raise `JudgeError`: never a silent 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PROMPT = (
    "You are grading an answer to a question about a video.\n"
    "Question: {question}\n"
    "Reference answer: {reference}\n"
    "Model answer: {answer}\n"
    "Decide whether the model answer means the same as the reference answer. Explain briefly, "
    "then end with exactly one line: 'Verdict: correct', 'Verdict: partially correct' or "
    "'Verdict: incorrect'."
)
_LABELS = {"correct": 1.0, "right": 1.0, "yes": 1.0, "partially correct": 0.5,
           "partially": 0.5, "incorrect": 0.0, "wrong": 0.0, "no": 0.0}  # fmt: skip
_LABEL = r"(partially correct|partially|incorrect|correct|right|wrong|yes|no)"
_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


@dataclass(frozen=True)
class JudgeConfig:
    """Where and how to ask the judge model."""

    endpoint: str
    """Base URL such as http://127.0.0.1:8000/v1 (or the full .../chat/completions URL)."""
    model: str
    """Model name sent in the request."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the bearer token (unset: no Authorization header)."""
    prompt: str = DEFAULT_PROMPT
    """Template with {question}, {reference} and {answer}."""
    timeout_s: float = 60.0
    """Limit for one HTTP request."""
    max_retries: int = 3
    """Retries after the first attempt (timeouts, transport errors, 408/409/429/5xx)."""
    backoff_s: float = 1.0
    """First retry delay; doubled each retry."""
    concurrency: int = 16
    """Requests in flight at once in `judge_many`."""
    max_tokens: int = 512
    """Generation limit of the judge."""
    cache_dir: str | None = None
    """Verdict cache directory; None disables caching."""


class JudgeError(RuntimeError):
    """The judge could not give a verdict (server failing, timeouts, unreadable text)."""


def parse_verdict(text: str) -> float | None:
    """1.0 / 0.5 / 0.0 from a judge's reply, or None when no verdict can be read.

    >>> parse_verdict("The answers agree.\\nVerdict: correct"), parse_verdict("[[Incorrect]]")
    (1.0, 0.0)
    >>> parse_verdict("Score: 7/10"), parse_verdict("I am not sure.")
    (0.7, None)
    """
    lowered = text.lower()
    for pattern in (rf"verdict\s*[:：]\s*[\*\"'\[]*\s*{_LABEL}\b", rf"\[\[\s*{_LABEL}\s*\]\]"):
        found = re.findall(pattern, lowered)
        if found:
            return _LABELS[found[-1]]
    scored = re.findall(r"(?:score|rating)[\s:：]*+(\d+(?:\.\d+)?)\s*+/\s*+(10|5|100)\b", lowered)
    if scored:
        value, scale = scored[-1]
        return min(1.0, float(value) / float(scale))
    lines = [line.strip(" .*:!") for line in lowered.splitlines() if line.strip()]
    if lines and lines[-1] in _LABELS:
        return _LABELS[lines[-1]]
    return None


def build_prompt(cfg: JudgeConfig, question: str, reference: str, answer: str) -> str:
    """The judge prompt for one item."""
    return cfg.prompt.format(question=question, reference=reference, answer=answer)


def _url(cfg: JudgeConfig) -> str:
    base = cfg.endpoint.rstrip("/")
    return base if base.endswith("/chat/completions") else base + "/chat/completions"


def _request(cfg: JudgeConfig, prompt: str) -> tuple[dict, dict]:
    headers = {"Content-Type": "application/json"}
    if os.environ.get(cfg.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[cfg.api_key_env]}"
    body = {"model": cfg.model, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0.0, "max_tokens": cfg.max_tokens}  # fmt: skip
    return headers, body


def _cache_path(cfg: JudgeConfig, prompt: str) -> Path | None:
    if cfg.cache_dir is None:
        return None
    key = hashlib.sha256(json.dumps([cfg.model, prompt]).encode()).hexdigest()
    return Path(cfg.cache_dir) / f"{key}.json"


def _cached(cfg: JudgeConfig, prompt: str) -> float | None:
    path = _cache_path(cfg, prompt)
    if path is None or not path.exists():
        return None
    return float(json.loads(path.read_text())["verdict"])


def _store(cfg: JudgeConfig, prompt: str, text: str, verdict: float) -> None:
    path = _cache_path(cfg, prompt)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"model": cfg.model, "prompt": prompt, "text": text, "verdict": verdict}, f)
    os.replace(tmp, path)  # atomic: concurrent scorer processes never read half a file


def _verdict_from(cfg: JudgeConfig, prompt: str, payload: dict) -> float:
    try:
        text = payload["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError) as e:
        raise JudgeError(f"judge reply has no choices[0].message.content: {payload!r:.300}") from e
    verdict = parse_verdict(text)
    if verdict is None:
        raise JudgeError(f"cannot read a verdict from the judge's reply: {text!r:.300}")
    _store(cfg, prompt, text, verdict)
    return verdict


def _retryable(error: Exception) -> bool:
    import httpx

    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code in _RETRY_STATUS
    return isinstance(error, (httpx.TimeoutException, httpx.TransportError))


def judge_one(cfg: JudgeConfig, question: str, reference: str, answer: str) -> float:
    """Verdict for one item (cache first), with timeouts and retries; raises JudgeError."""
    prompt = build_prompt(cfg, question, reference, answer)
    cached = _cached(cfg, prompt)
    if cached is not None:
        return cached
    return _verdict_from(cfg, prompt, _post(cfg, prompt))


def judge_reply(cfg: JudgeConfig, prompt: str) -> str:
    """The judge's raw reply to `prompt` (no verdict parsing, no cache), with timeouts and
    retries; for protocols that read the reply their own way (TempCompass captioning)."""
    payload = _post(cfg, prompt)
    try:
        return payload["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError) as e:
        raise JudgeError(f"judge reply has no choices[0].message.content: {payload!r:.300}") from e


def _post(cfg: JudgeConfig, prompt: str) -> dict:
    """POST one chat request; retry timeouts, transport errors, 408/409/429/5xx; raise JudgeError."""
    import httpx

    headers, body = _request(cfg, prompt)
    last: Exception | None = None
    with httpx.Client(timeout=cfg.timeout_s) as client:
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                time.sleep(cfg.backoff_s * 2 ** (attempt - 1))
            try:
                reply = client.post(_url(cfg), headers=headers, json=body)
                reply.raise_for_status()
                return reply.json()
            except (httpx.HTTPError, ValueError) as e:
                if not _retryable(e):
                    raise JudgeError(f"judge request failed: {e}") from e
                last = e
    raise JudgeError(f"judge failed after {cfg.max_retries + 1} attempts: {last!r}")


async def _judge_async(client, cfg: JudgeConfig, gate: asyncio.Semaphore, prompt: str) -> float:
    import httpx

    cached = _cached(cfg, prompt)
    if cached is not None:
        return cached
    headers, body = _request(cfg, prompt)
    last: Exception | None = None
    for attempt in range(cfg.max_retries + 1):
        if attempt:
            await asyncio.sleep(cfg.backoff_s * 2 ** (attempt - 1))
        try:
            async with gate:
                reply = await client.post(_url(cfg), headers=headers, json=body)
            reply.raise_for_status()
            return _verdict_from(cfg, prompt, reply.json())
        except (httpx.HTTPError, ValueError) as e:
            if isinstance(e, JudgeError) or not _retryable(e):
                raise JudgeError(f"judge request failed: {e}") from e
            last = e
    raise JudgeError(f"judge failed after {cfg.max_retries + 1} attempts: {last!r}")


async def _judge_all(cfg: JudgeConfig, prompts: list[str]) -> list[float | JudgeError]:
    import httpx

    gate = asyncio.Semaphore(cfg.concurrency)
    limits = httpx.Limits(max_connections=cfg.concurrency)
    async with httpx.AsyncClient(timeout=cfg.timeout_s, limits=limits) as client:
        tasks = [_judge_async(client, cfg, gate, p) for p in prompts]
        return await asyncio.gather(*tasks, return_exceptions=True)


def judge_many(cfg: JudgeConfig, items: list[tuple[str, str, str]]) -> list[float | JudgeError]:
    """Verdicts for (question, reference, answer) items, `concurrency` requests at a time.

    Failures come back as JudgeError values in their slot (the rest still complete).
    """
    prompts = [build_prompt(cfg, *item) for item in items]
    return asyncio.run(_judge_all(cfg, prompts))
