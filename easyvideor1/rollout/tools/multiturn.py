"""`ToolEngine`: the multi-turn tool loop, token in / token out, around a rollout engine.

    turn 1: engine.generate(prompts, n)        -> each response's first turn
    then, while any response (on any rank) is live:
        its `<tool_call>`s run (registry.run_call) -> a tool turn: tokens + media (turns.py)
        engine.generate(prompt + turns so far, 1) -> its next turn

A response's `token_ids` hold its model turns and tool turns in order (`model_mask` tells which
are which; tool tokens have log-prob 0 and are never scored), `media` its tool turns' processor
outputs, `tool_calls` every call (errors included), `text` its last turn (the answer). It ends
at a turn without a call ("stop"), at `rollout.max_tokens` over all its tokens ("length"), or
when its last allowed turn (`rollout.max_turns`) still calls a tool ("max_turns": no answer,
text ""). Each continuation is a new prompt to the engine (its prefill is recomputed, its
tokens are the ones sampled before: nothing is re-tokenised), so any engine that accepts
`Prompt`s with mid-sequence media runs the loop: the HF engine reads `Prompt.inputs` (expanded
ids, media, M-RoPE ids), vLLM `Prompt.placeholder_ids` (the same ids with each medium one
placeholder token: the prompt's text tokenised once, the model turns' sampled ids as they are,
each tool turn's text tokenised alone) and `Prompt.frames` (every medium in order), which it
expands itself (its expansion is checked against `inputs.input_ids` token for token, and its
M-RoPE ids come from the same ids and grids); a call whose media would pass the engine's
per-prompt media limit is an error turn. Each prompt may call the tools its sample is offered
(`Sample.offered_tools`; a call to another is an error turn); a sample offered none is one turn,
its text never read for calls. Under FSDP every rank takes the same number of rounds
(a rank with nothing live joins with no prompt, as the HF engine allows).
Departure: turn k > 1 samples with seed `seed + k * TURN_SEED_STRIDE` (+ the response's offset).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field, replace

from easyvideor1 import distributed
from easyvideor1.models.families import Family
from easyvideor1.models.mrope import MRopeSpec
from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout, ToolCall
from easyvideor1.rollout.base import SamplingParams, counts_per_prompt, sample_seeds
from easyvideor1.rollout.tools.protocol import Tool, ToolContext, ToolOutput
from easyvideor1.rollout.tools.registry import TOOLS, parse_tool_calls, run_call
from easyvideor1.rollout.tools.turns import TurnMedia, encode_tool_turn, sequence_with_turns, tool_turn_text

log = logging.getLogger(__name__)

TURN_SEED_STRIDE = 7_919_003
END_OF_TURN = "<|im_end|>"


@dataclass
class ToolLimits:
    """The loop's limits (`rollout.max_turns`, `tool_call_visual_tokens`, `tool_response_visual_tokens`)."""

    max_turns: int = 3
    call_visual_tokens: int = 256
    response_visual_tokens: int = 1024

    def media_limits(self, limits: dict[str, int]) -> dict[str, int]:
        """An engine's media per prompt (`limits`: what the data needs) with room for one tool
        medium of each kind per tool turn (vLLM's `limit_mm_per_prompt`)."""
        return {k: v + self.max_turns - 1 for k, v in limits.items()}


@dataclass
class _Trajectory:
    prompt: Prompt
    seed_offset: int
    visual_left: int
    tools: dict[str, Tool]  # the tools its sample is offered
    tokens: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] | None = field(default_factory=list)  # per token (tool turns: -1); None: unknown
    texts: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    media: TurnMedia | None = None
    placeholder_ids: list[int] = field(default_factory=list)  # `tokens`, each tool medium one placeholder
    tool_frames: list = field(default_factory=list)  # the tool turns' media (Frames), in order
    tool_turns: int = 0
    unanswered: bool = False  # its last turn called tools that never answered
    finish: str | None = None


class ToolEngine:
    """A `RolloutEngine` whose responses may call tools (module docstring)."""

    def __init__(self, engine, processor, family: Family, spec: MRopeSpec, tools: dict[str, Tool], clips,
                 limits: ToolLimits):
        """`engine`: the token engine (HF or vLLM); `clips`: a `video_tools.ClipSource`."""
        self.engine, self.processor, self.family, self.spec = engine, processor, family, spec
        self.tools, self.clips, self.limits = tools, clips, limits
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.end_id = self.tokenizer.convert_tokens_to_ids(END_OF_TURN)
        self.prompt_ids: dict[int, list[int]] | None = None  # {id(prompt): its text's ids}, per generate
        self.media_limits: dict[str, int] | None = getattr(engine, "limits", None)  # vLLM's per-prompt media

    def generate(self, prompts: list[Prompt], n: list[int] | int, params: SamplingParams) -> list[list[Rollout]]:
        """`n` multi-turn responses per prompt (see `RolloutEngine.generate`)."""
        counts = counts_per_prompt(prompts, n)
        self.prompt_ids = None
        offsets = sample_seeds(counts, 0, [p.seed_offset for p in prompts])
        states = [[self._trajectory(p, offsets[i][j]) for j in range(k)]
                  for i, (p, k) in enumerate(zip(prompts, counts))]
        first = self.engine.generate(prompts, counts, params) if prompts or distributed.is_distributed() else []
        for row, group in zip(states, first):
            for state, rollout in zip(row, group):
                self._after_turn(state, rollout, params.max_tokens)
        turn = 1
        while distributed.any_true(any(s.finish is None for row in states for s in row)):
            turn += 1
            live = [s for row in states for s in row if s.finish is None]
            left = distributed.max_int(max([params.max_tokens - len(s.tokens) for s in live], default=1))
            seed = None if params.seed is None else params.seed + turn * TURN_SEED_STRIDE
            turn_params = replace(params, max_tokens=max(1, left), seed=seed)
            outs = self.engine.generate([self._continuation(s) for s in live], 1, turn_params)
            for state, group in zip(live, outs):
                self._after_turn(state, group[0], params.max_tokens)
        return [[self._rollout(i, s) for s in row] for i, row in enumerate(states)]

    def _trajectory(self, prompt: Prompt, seed_offset: int) -> _Trajectory:
        offered = {name: self.tools[name] for name in prompt.sample.offered_tools(self.tools)}
        return _Trajectory(prompt, seed_offset, self.limits.response_visual_tokens, offered)

    def _continuation(self, s: _Trajectory) -> Prompt:
        inputs = sequence_with_turns(s.prompt.inputs, s.tokens, None, s.media, self.family, self.spec, as_prompt=True)
        if self.prompt_ids is None:  # one tokenisation of the chat template's text per prompt
            self.prompt_ids = {}
        key = id(s.prompt)
        if key not in self.prompt_ids:
            self.prompt_ids[key] = self.tokenizer.encode(s.prompt.inputs.prompt_text, add_special_tokens=False)
        return Prompt(sample=s.prompt.sample, frames=s.prompt.frames + s.tool_frames, inputs=inputs,
                      seed_offset=s.seed_offset, placeholder_ids=self.prompt_ids[key] + s.placeholder_ids)

    def _after_turn(self, s: _Trajectory, r: Rollout, max_tokens: int) -> None:
        room = max_tokens - len(s.tokens)
        ids, logprobs, finish = r.token_ids, r.logprobs or [0.0] * len(r.token_ids), r.finish_reason
        if len(ids) > room:  # the round's budget is the largest left over all ranks' responses
            ids, logprobs, finish = ids[:room], logprobs[:room], "length"
        s.tokens += ids
        s.placeholder_ids += ids
        s.mask += [True] * len(ids)
        s.logprobs += logprobs
        s.versions = None if s.versions is None or r.versions is None else s.versions + r.versions[:len(ids)]
        s.texts.append(r.text)
        calls = parse_tool_calls(r.text) if finish == "stop" and s.tools else []
        s.unanswered = bool(calls)
        if not calls:
            s.finish = finish
            return
        if len(s.texts) >= self.limits.max_turns:
            s.finish = "max_turns"
            return
        outputs = []
        for call in calls:
            ctx = ToolContext(s.prompt.sample, s.prompt.frames, self.clips, self.family,
                              min(self.limits.call_visual_tokens, s.visual_left))
            output, record = run_call(call, s.tools, ctx)
            over = self._over_media_limit(s, outputs + [output])
            if over:
                output, record = ToolOutput(f"Error: {over}"), replace(record, error=over, visual_tokens=0)
            s.visual_left -= record.visual_tokens
            s.calls.append(record)
            outputs.append(output)
        text = tool_turn_text(outputs, closed=bool(ids) and ids[-1] == self.end_id)
        turn_ids, media = encode_tool_turn(text, outputs, self.processor, s.prompt.sample.problem_id, self.spec)
        if len(s.tokens) + len(turn_ids) >= max_tokens:  # no room for the tool turn and an answer
            s.finish = "length"
            return
        s.tokens += turn_ids.tolist()
        s.placeholder_ids += self.tokenizer.encode(text, add_special_tokens=False)
        s.tool_frames += [m for out in outputs for m in out.media]
        s.mask += [False] * len(turn_ids)
        s.logprobs += [0.0] * len(turn_ids)
        s.versions = None if s.versions is None else s.versions + [-1] * len(turn_ids)
        s.media = media if s.media is None else s.media.then(media)
        s.tool_turns += 1

    def _over_media_limit(self, s: _Trajectory, outputs: list[ToolOutput]) -> str | None:
        """Why the media of the prompt, earlier tool turns and `outputs` would pass the engine's
        per-prompt limit (vLLM: `rollout.limit_videos` / `limit_images` + `max_turns` - 1), or None."""
        if self.media_limits is None:
            return None
        media = s.prompt.frames + s.tool_frames + [m for out in outputs for m in out.media]
        for kind, is_video in (("video", True), ("image", False)):
            count = sum((m.metadata is not None) == is_video for m in media)
            if count > self.media_limits.get(kind, 0):
                return f"over the media limit: the engine takes at most {self.media_limits.get(kind, 0)} {kind}s"
        return None

    def _rollout(self, index: int, s: _Trajectory) -> Rollout:
        return Rollout(prompt_index=index, token_ids=s.tokens, text="" if s.unanswered else s.texts[-1],
                       logprobs=s.logprobs, versions=s.versions, finish_reason=s.finish,
                       model_mask=s.mask if s.tool_turns else None, media=s.media, tool_calls=s.calls, turn_texts=s.texts)

    def replay(self, prompt: Prompt, offline: Rollout, max_tokens: int) -> Rollout:
        """An offline trajectory whose text calls tools, as a multi-turn response: its text is cut
        after each `</tool_call>` into model turns (end-of-turn appended, as `training.hybrid`
        tokenises it), and every call is run again on the sample's video, never read from the
        file. Limits as for generated responses; a text without calls, or of a sample offered no
        tool, is returned unchanged."""
        text = prompt.sample.offline_output or offline.text
        s = self._trajectory(prompt, 0)
        if "<tool_call>" not in text or not s.tools:  # a sample offered no tool: its text is just text
            return offline
        tokenizer = self.tokenizer
        for segment in (p for p in re.split(r"(?<=</tool_call>)", text) if p):
            if s.finish is not None:
                break
            ids = tokenizer.encode(segment + END_OF_TURN, add_special_tokens=False)
            self._after_turn(s, Rollout(-1, ids, segment), max_tokens)
        if s.finish is None:  # the text ends with a call: nothing answers it
            s.finish = "max_turns"
        withheld = sorted({c.name for c in s.calls if c.name in TOOLS and c.name not in s.tools})
        if withheld:
            log.warning("sample %s: its offline trajectory calls %s, which the sample is not offered (its tools: "
                        "%s); each such call is an error turn", prompt.sample.problem_id, ", ".join(withheld),
                        ", ".join(s.tools))
        out = self._rollout(offline.prompt_index, s)
        return replace(out, logprobs=None, versions=None, finish_reason="offline", offline=True,
                       truncated=s.finish == "length")

    def update_weights(self, model) -> None:
        """The token engine's."""
        self.engine.update_weights(model)

    def sleep(self) -> None:
        """The token engine's."""
        self.engine.sleep()

    def wake_up(self) -> None:
        """The token engine's."""
        self.engine.wake_up()

    def close(self) -> None:
        """The token engine's."""
        self.engine.close()


def tool_metrics(groups: list[list[Rollout]], group=None) -> dict[str, float]:
    """`tools/calls_per_response`, `tools/errors` (failed calls), `tools/visual_tokens` (per
    response) and `tools/calls/<name>`, over the online responses of every rank in `group`."""
    counts: dict[str, float] = defaultdict(float)
    for r in (r for grp in groups for r in grp if not r.offline and r.finish_reason != "padding"):
        counts["responses"] += 1
        counts["calls"] += len(r.tool_calls)
        counts["errors"] += sum(c.error is not None for c in r.tool_calls)
        counts["visual_tokens"] += sum(c.visual_tokens for c in r.tool_calls)
        for c in r.tool_calls:
            counts[f"calls/{c.name if c.name in TOOLS else 'unknown'}"] += 1
    seen = distributed.all_gather_objects(sorted(counts), group=group)  # every rank's keys
    keys = sorted({k for ks in seen for k in ks} | {"responses", "calls", "errors", "visual_tokens"})
    total = dict(zip(keys, distributed.all_reduce_floats([counts.get(k, 0.0) for k in keys], group=group)))
    per = max(total["responses"], 1.0)
    out = {"tools/calls_per_response": total["calls"] / per, "tools/errors": total["errors"],
           "tools/visual_tokens": total["visual_tokens"] / per}
    out.update({f"tools/{k}": v for k, v in total.items() if k.startswith("calls/")})
    return out
