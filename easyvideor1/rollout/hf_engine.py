"""The `hf` rollout engine: batched decoding on the policy itself (CPU and GPU, no vLLM).

Prompts are left-padded by `models/collate.collate` (any mix of video, image and text), run
once through the full model (prefill, KV cache), then decoded one token per step with the
model's own cache class (so Qwen3.5's linear-attention state works too).

Why our own decoding loop rather than `model.generate`:
- Positions. We always pass our M-RoPE ids (`models/mrope.py`, vLLM's numbering), so the
  model never calls its `get_rope_index` nor keeps `rope_deltas` state. Every prompt ends in
  text, whose id is the largest so far, so response token k gets id `last + 1 + k` on all
  three axes: exactly `extend_positions`, what vLLM does and what the trainer recomputes with.
  (`generate` in transformers 5.19, given no position ids, numbers them with the model's
  `get_rope_index`, which numbers text after a Qwen2.5-VL video differently from vLLM
  (ENVIRONMENT.md), and caches `rope_deltas` on the model between calls.)
- Seeds per sample (one generator per row, vLLM's per-request seed semantics), vLLM's
  stop-string and log-prob conventions (`rollout/base.py`, `rollout/sampling.py`).

Under FSDP (torch.distributed initialised, world > 1) every forward is a collective, so the
ranks decode in lockstep: each runs as many batches as the busiest rank (an idle rank decodes
a throw-away copy of its first prompt, or of an empty text prompt when it has none) and a batch
stops only when every rank's rows are done.

Departure: the vision tower runs once per sample, not once per prompt (n copies of a prompt
are n rows of the batch).

Partial rollouts (`rollout.partial`, separate placement): the rollout side stamps the engine with
its weights' version (`HFEngine.version`, recorded per token in `Rollout.versions`) and hands it
the batch's later versions (`WeightSwitches`): after every `rollout.partial_tokens` decode steps
of the batch's generation (or as each arrives) the engine loads the next one and continues the unfinished rows from a
new prefill of prompt + tokens so far (their KV cache recomputed with the new weights, as AReaL
does; PipelineRL keeps the stale cache instead), so each token is sampled from one version's
policy and its behaviour log-prob is that policy's.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from easyvideor1 import distributed
from easyvideor1.models.collate import collate
from easyvideor1.models.families import Family
from easyvideor1.models.inputs import append_response
from easyvideor1.models.mrope import MRopeSpec
from easyvideor1.models.packing import PACKED_ATTENTION, PaddedRows, language_attention
from easyvideor1.models.routing import ROUTE_FREE, moe_routers, recording
from easyvideor1.models.ulysses import ULYSSES_ATTENTION
from easyvideor1.records import Rollout
from easyvideor1.prompts import Prompt, empty_prompt
from easyvideor1.rollout.base import (
    SamplingParams,
    banned_token_ids,
    counts_per_prompt,
    sample_seeds,
)
from easyvideor1.rollout.sampling import next_tokens


def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("neither the model's generation_config nor the tokenizer defines an EOS token")
    return ids


@contextmanager
def _gathered(model):
    """Under FSDP2, keep every unit's parameters gathered for the whole decode (one all-gather per
    unit per call, not one per generated token), then shard them again."""
    units = [m for m in model.modules() if hasattr(m, "set_reshard_after_forward") and hasattr(m, "reshard")]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:  # back to FSDP2's defaults: every unit reshards after forward but the root
            unit.reshard()
            unit.set_reshard_after_forward(unit is not model, recurse=False)


def _prefill_kwargs(model, batch) -> dict:
    """The prefill's inputs. On packed attention (`models.packing`) the padding and the masked
    dummy vision tokens are a block of each row before its prompt, not a mask: transformers would
    otherwise build a [B, 1, L, L] mask (the dummies are padding even when the prompts are of one
    length). Text ids 0..L-1 then, so it builds none. Decoding steps keep the [B, L] mask (O(L))."""
    kwargs = batch.model_kwargs()
    if language_attention(model) in (PACKED_ATTENTION, ULYSSES_ATTENTION) and not bool(batch.attention_mask.all()):
        positions = batch.position_ids.clone()
        positions[0] = torch.arange(positions.shape[-1], device=positions.device)
        kwargs.update(attention_mask=None, position_ids=positions, packing=PaddedRows.left_padded(batch.attention_mask))
    return kwargs


@contextmanager
def _eval_mode(model):
    """Eval mode for decoding (training mode + gradient checkpointing disables the KV cache)."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@dataclass
class WeightSwitches:
    """Partial rollouts: `load(v)` brings the engine's model to the next of `versions` (oldest
    first) after every `every` decode steps (counted over all the `generate` calls of one batch:
    chunks, tool turns, dynamic-sampling rounds), or with `every` 0 at the first decode step at
    which `arrived(v)` says the trainer is sending it. Counted switches are fixed by the seeds (a
    run is reproducible, a resumed one exact); switches on arrival never make the rollout side wait
    but fall where the timing puts them."""

    every: int
    versions: list[int]
    load: Callable[[int], None]
    arrived: Callable[[int], bool] | None = None
    steps: int = 0

    def after_step(self) -> int | None:
        """Count one decode step; the version to switch to now, or None."""
        self.steps += 1
        if not self.versions:
            return None
        due = self.arrived(self.versions[0]) if self.every == 0 else self.steps % self.every == 0
        return self.versions.pop(0) if due else None


class HFEngine:
    """`RolloutEngine` on a transformers Qwen-VL model (the policy being trained, or a copy)."""

    def __init__(
        self,
        model: torch.nn.Module,
        processor,
        family: Family,
        spec: MRopeSpec,
        max_batch_size: int = 64,
        max_batch_tokens: int = 0,
    ):
        """`processor` is the family's processor or its tokenizer; `max_batch_size` bounds the
        sequences decoded together, `max_batch_tokens` (0: off) their padded tokens, prompt + the
        response limit per row (memory: prefill activations, the KV cache); a longer job goes alone."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_batch_tokens < 0:
            raise ValueError(f"max_batch_tokens must be >= 0 (0: off), got {max_batch_tokens}")
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.family = family
        self.spec = spec
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.eos_ids = _eos_ids(model, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else min(self.eos_ids)
        self.banned = banned_token_ids(self.tokenizer)
        self._empty: Prompt | None = None  # built when a rank first has nothing to decode
        self.version: int | None = None  # the weights' version, recorded per token (separate placement)
        self.switches: WeightSwitches | None = None  # partial rollouts: newer weights mid-generation
        self.record_routes = bool(moe_routers(model))  # MoE: each token's experts ride with the rollout

    # -- protocol -------------------------------------------------------------------------

    def generate(
        self, prompts: list[Prompt], n: list[int] | int, params: SamplingParams
    ) -> list[list[Rollout]]:
        """`n` responses per prompt (see `RolloutEngine.generate`)."""
        counts = counts_per_prompt(prompts, n)
        seeds = sample_seeds(counts, params.seed, [p.seed_offset for p in prompts])
        jobs = [(i, j, seeds[i][j]) for i, k in enumerate(counts) for j in range(k)]
        results: list[list[Rollout | None]] = [[None] * k for k in counts]
        chunks = self._chunks(jobs, [p.inputs.input_ids.shape[-1] + params.max_tokens for p in prompts])
        for k in range(distributed.max_int(len(chunks))):
            if k >= len(chunks):  # this rank is done; keep the collectives of the others going
                idle = prompts[0] if prompts else self._empty_prompt()
                self._generate_batch([idle], [params.seed], params)
                continue
            chunk = chunks[k]
            outs = self._generate_batch([prompts[i] for i, _, _ in chunk], [s for *_, s in chunk], params)
            for (i, j, _), rollout in zip(chunk, outs):
                rollout.prompt_index = i
                results[i][j] = rollout
        return results  # type: ignore[return-value]

    def _chunks(self, jobs: list[tuple], tokens: list[int]) -> list[list[tuple]]:
        """`jobs` (prompt index first) in order, cut into batches of at most `max_batch_size` rows
        whose padded size (rows x the longest prompt's `tokens`) stays within `max_batch_tokens`."""
        chunks: list[list[tuple]] = []
        longest = 0  # of the last chunk's rows
        for job in jobs:
            need = tokens[job[0]]
            if chunks and len(chunks[-1]) < self.max_batch_size and not \
                    0 < self.max_batch_tokens < (len(chunks[-1]) + 1) * max(longest, need):
                chunks[-1].append(job)
                longest = max(longest, need)
            else:
                chunks.append([job])
                longest = need
        return chunks

    def update_weights(self, model: torch.nn.Module) -> None:
        """Copy `model`'s weights in (a no-op when the engine decodes with `model` itself)."""
        if model is self.model:
            return
        self.model.load_state_dict(model.state_dict())

    def sleep(self) -> None:
        """Nothing to release: the engine holds no memory besides the policy."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        """No-op."""

    def close(self) -> None:
        """Drop the reference to the model."""
        self.model = None

    # -- decoding -------------------------------------------------------------------------

    def _empty_prompt(self) -> Prompt:
        if self._empty is None:
            self._empty = empty_prompt(self.processor, self.family, self.spec, "<idle rank>")
        return self._empty

    def _generate_batch(
        self, prompts: list[Prompt], seeds: list[int | None], params: SamplingParams
    ) -> list[Rollout]:
        model = self.model
        device = next(model.parameters()).device
        generators = [None if s is None else torch.Generator(device=device).manual_seed(s) for s in seeds]
        banned = torch.tensor(self.banned, dtype=torch.long, device=device)
        stop_ids = self.eos_ids | set(params.stop_token_ids)
        b = len(prompts)
        tokens: list[list[int]] = [[] for _ in range(b)]
        logprobs: list[list[float]] = [[] for _ in range(b)]
        versions: list[list[int]] = [[] for _ in range(b)]
        finish: list[str | None] = [None] * b
        texts = [_TextStream(self.tokenizer, p.inputs.input_ids.tolist()) for p in prompts]
        routes: list[list[torch.Tensor]] = [[] for _ in range(b)]  # MoE, per row: [n, layers, k] pieces

        with torch.no_grad(), _eval_mode(model), _gathered(model), \
                (recording(model) if self.record_routes else nullcontext()) as recorder:
            out, attention, positions = self._prefill([p.inputs for p in prompts], recorder, routes)
            for step in range(params.max_tokens):
                new, new_lp = next_tokens(out.logits[:, -1], params, banned, generators)
                new_ids, new_lps = new.tolist(), new_lp.tolist()  # one device sync per step
                for r in range(b):
                    if finish[r] is None:
                        tok = new_ids[r]
                        tokens[r].append(tok)
                        logprobs[r].append(new_lps[r])
                        versions[r].append(self.version)
                        finish[r] = texts[r].add(tok, tok in stop_ids, params)
                        if finish[r] is None and step + 1 == params.max_tokens:
                            finish[r] = "length"
                if distributed.all_true(all(f is not None for f in finish)):
                    break
                switch = None if self.switches is None else self.switches.after_step()
                if switch is not None:  # partial rollouts: newer weights, the rows' KV cache recomputed
                    self.switches.load(switch)
                    self.version = switch
                    out, attention, positions = self._prefill(
                        [append_response(p.inputs, t, self.spec) for p, t in zip(prompts, tokens)], recorder, routes)
                    continue
                fed = torch.tensor(
                    [t[-1] if f is None else self.pad_token_id for t, f in zip(tokens, finish)], device=device
                )
                attention = torch.cat([attention, attention.new_ones(b, 1)], dim=1)
                positions = positions + 1
                out = model(
                    input_ids=fed[:, None],
                    attention_mask=attention,
                    position_ids=positions,
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
                if recorder is not None:  # the step's route of each row's fed token (finished rows fed padding)
                    step_routes = recorder.take((b, 1))
                    for r in range(b):
                        if finish[r] is None:
                            routes[r].append(step_routes[r])
        return [
            Rollout(
                prompt_index=-1,
                token_ids=tokens[r],
                text=texts[r].text,
                logprobs=logprobs[r],
                finish_reason=finish[r],
                versions=None if self.version is None else versions[r],
                routes=_rollout_routes(routes[r], len(prompts[r].inputs.input_ids) + len(tokens[r])),
            )
            for r in range(b)
        ]

    def _prefill(self, inputs: list, recorder=None, routes: list[list[torch.Tensor]] | None = None) -> tuple:
        """`inputs` (prompts; after a partial rollout's weight switch, prompt + tokens so far) through
        the model, left-padded so every row ends in its last token (every prompt ends in text): the
        output (the next token's logits, the KV cache), the attention mask and each row's last
        position ids [4, B, 1]. With a `recorder` (MoE) each row's routes start again from this
        prefill's (`routes[row]`: a new KV cache, so the routes later tokens saw)."""
        model = self.model
        param = next(model.parameters())
        batch = collate(inputs, self.family, self.spec, self.pad_token_id, padding_side="left").to(
            param.device, dtype=param.dtype)
        out = model(**_prefill_kwargs(model, batch), use_cache=True, logits_to_keep=1)
        if recorder is not None:
            prefill_routes = recorder.take(tuple(batch.input_ids.shape))  # [B, L, layers, k]
            for row, start, end in batch.seq_spans:
                routes[row][:] = [prefill_routes[row, start:end]]
        return out, batch.attention_mask, batch.position_ids[:, :, -1:]


def _rollout_routes(pieces: list[torch.Tensor], tokens: int) -> torch.Tensor | None:
    """A rollout's routes [tokens, layers, k] from its prefill and decode pieces; the last sampled
    token, never fed back, gets `ROUTE_FREE` (no log-prob depends on its route)."""
    if not pieces:
        return None
    routes = torch.cat(pieces)[:tokens]
    if routes.shape[0] < tokens:
        missing = torch.full((tokens - routes.shape[0], *routes.shape[1:]), ROUTE_FREE, dtype=routes.dtype)
        routes = torch.cat([routes, missing])
    return routes


class _TextStream:
    """Response text built token by token as vLLM's detokenizer builds it (tokenizers'
    `DecodeStream` primed with the prompt; special tokens skipped; incomplete UTF-8 held back;
    a final stop token's text left out; cut at the first stop string)."""

    def __init__(self, tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "_tokenizer", None)  # the Rust tokenizer, when fast
        self.ids: list[int] = []
        self.text = ""
        self.stream = None
        if self.backend is not None:
            from tokenizers.decoders import DecodeStream

            self.stream = DecodeStream(ids=prompt_ids, skip_special_tokens=True)

    def _piece(self, token_id: int) -> str:
        if self.stream is None:  # slow tokenizer: decode the whole response again
            before = self.text
            return self.tokenizer.decode(self.ids, skip_special_tokens=True)[len(before) :]
        try:
            return self.stream.step(self.backend, token_id) or ""
        except Exception:  # vLLM resets the stream on invalid-prefix errors, so do we
            from tokenizers.decoders import DecodeStream

            self.stream = DecodeStream(skip_special_tokens=True)
            return self.stream.step(self.backend, token_id) or ""

    def add(self, token_id: int, is_stop_token: bool, params: SamplingParams) -> str | None:
        """Append one generated token; "stop" when it ends the response, else None."""
        self.ids.append(token_id)
        if is_stop_token:
            if params.include_stop_str_in_output:
                self.text += self._piece(token_id)
            return "stop"
        before = len(self.text)
        self.text += self._piece(token_id)
        if not params.stop:
            return None
        longest = max(len(s) for s in params.stop)
        start = max(0, before - longest + 1)
        hits = [(i, s) for s in params.stop if s and (i := self.text.find(s, start)) >= 0]
        if not hits:
            return None
        index, s = min(hits)
        self.text = self.text[: index + len(s) if params.include_stop_str_in_output else index]
        return "stop"
