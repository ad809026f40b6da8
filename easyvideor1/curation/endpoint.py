"""A teacher behind any OpenAI-compatible `/v1/chat/completions` server (e.g. `vllm serve`).

The sampled frames go as base64 JPEG images, each preceded by its timestamp in the text
("<2.5 s>"), since a chat API carries no video metadata; then the prompt text. `EndpointBackend`
is a `evaluation.pipeline.Backend`: it submits each request as soon as it is ready, at most
`concurrency` in flight, and yields outcomes as they finish. Timeouts, transport errors, 408,
409, 429 and 5xx are retried with exponential backoff (the judge's rule, `rewards.judge`); any
other error, or the last retry failing, fails that response with the reason.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from easyvideor1.evaluation.pipeline import GenerationOutcome, Item
from easyvideor1.records import Frames, Rollout, Sample
from easyvideor1.rollout.base import SamplingParams

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


@dataclass
class ChatRequest:
    """What the endpoint is sent for one sample: the user message's content parts."""

    sample: Sample
    content: list[dict[str, Any]]
    seed_offset: int | None = None  # response j of a sample is seeded seed + seed_offset (groups.py)


@dataclass(frozen=True)
class EndpointConfig:
    """Where and how to reach the teacher."""

    url: str
    """Base URL such as http://127.0.0.1:8000/v1 (or the full .../chat/completions URL)."""
    model: str
    """Model name sent in each request."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the bearer token (unset: no Authorization header)."""
    timeout_s: float = 300.0
    """Limit for one HTTP request."""
    retries: int = 3
    """Retries after the first attempt (timeouts, transport errors, 408/409/429/5xx)."""
    backoff_s: float = 1.0
    """First retry delay; doubled each retry."""
    concurrency: int = 32
    """Requests in flight at once."""
    jpeg_quality: int = 90
    """Quality of the frames sent."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """More request fields (e.g. top_k for vLLM)."""

    @property
    def chat_url(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith("/chat/completions") else base + "/chat/completions"


def _jpeg(pixels, quality: int) -> dict[str, Any]:
    """One [3, H, W] uint8 frame as an OpenAI image part."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy()).save(buf, format="JPEG", quality=quality)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{data}"}}


def chat_request(sample: Sample, media: list[Frames], text: str, quality: int = 90) -> ChatRequest:
    """The content parts for `sample`: each video's frames with their timestamps, each image, the text."""
    parts: list[dict[str, Any]] = []
    for frames in media:
        meta = frames.metadata
        if meta is None:  # an image
            parts.append(_jpeg(frames.pixels[0], quality))
            continue
        times = [i / meta.fps for i in meta.frames_indices]
        parts.append({"type": "text", "text": f"Video: {len(times)} frames sampled from {meta.duration:.1f} s; "
                                              "each frame follows its timestamp."})
        for t, px in zip(times, frames.pixels):
            parts.append({"type": "text", "text": f"<{t:.1f} s>"})
            parts.append(_jpeg(px, quality))
    parts.append({"type": "text", "text": text})
    return ChatRequest(sample=sample, content=parts)


class EndpointError(RuntimeError):
    """The endpoint gave no usable response (after retries where they apply)."""


class EndpointBackend:
    """`Backend` over an OpenAI-compatible server (items carry a `ChatRequest` as their prompt)."""

    def __init__(self, cfg: EndpointConfig):
        self.cfg = cfg
        self.attempts = 0  # HTTP requests sent, retries included
        self.retried = 0  # of which retries

    def _body(self, request: ChatRequest, params: SamplingParams) -> dict[str, Any]:
        body = {"model": self.cfg.model, "messages": [{"role": "user", "content": request.content}],
                "temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens,
                **self.cfg.extra_body}
        if params.seed is not None:
            body["seed"] = params.seed + (request.seed_offset or 0)
        if params.stop:
            body["stop"] = list(params.stop)
        return body

    async def complete(self, client, request: ChatRequest, params: SamplingParams) -> Rollout:
        """One response, retried on transient failures; raises EndpointError."""
        import httpx

        headers = {"Content-Type": "application/json"}
        if os.environ.get(self.cfg.api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[self.cfg.api_key_env]}"
        body = self._body(request, params)
        last = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                self.retried += 1
                await asyncio.sleep(self.cfg.backoff_s * 2 ** (attempt - 1))
            self.attempts += 1
            try:
                reply = await client.post(self.cfg.chat_url, headers=headers, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if reply.status_code in RETRY_STATUS:
                last = f"HTTP {reply.status_code}: {reply.text[:200]}"
                continue
            if reply.status_code != 200:
                raise EndpointError(f"HTTP {reply.status_code} (not retried): {reply.text[:300]}")
            try:
                choice = reply.json()["choices"][0]
                text = choice["message"]["content"] or ""
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise EndpointError(f"reply has no choices[0].message.content: {reply.text[:300]}") from e
            finish = "length" if choice.get("finish_reason") == "length" else "stop"
            return Rollout(prompt_index=-1, token_ids=[], text=text, logprobs=None, finish_reason=finish)
        raise EndpointError(f"failed after {self.cfg.retries + 1} attempts; last: {last}")

    async def run(self, items: AsyncIterator[Item], params: SamplingParams) -> AsyncIterator[GenerationOutcome]:
        import httpx

        finished: asyncio.Queue = asyncio.Queue()
        gate = asyncio.Semaphore(self.cfg.concurrency)
        limits = httpx.Limits(max_connections=self.cfg.concurrency)
        async with httpx.AsyncClient(timeout=self.cfg.timeout_s, limits=limits) as client:
            async def one(item: Item) -> None:
                try:
                    outcome = GenerationOutcome(item, await self.complete(client, item.prompt, params), None)
                except Exception as e:  # noqa: BLE001 - a failed request fails its sample only
                    outcome = GenerationOutcome(item, None, f"endpoint failed: {type(e).__name__}: {e}")
                finally:
                    gate.release()
                await finished.put(outcome)

            async def feed() -> None:
                running: set[asyncio.Task] = set()  # only those in flight are held
                try:
                    async for item in items:
                        await gate.acquire()
                        task = asyncio.create_task(one(item))
                        running.add(task)
                        task.add_done_callback(running.discard)
                    await asyncio.gather(*running)
                finally:
                    await finished.put(None)

            feeder = asyncio.create_task(feed())
            while (outcome := await finished.get()) is not None:
                yield outcome
            await feeder  # re-raises what went wrong upstream

    def close(self) -> None:
        pass
