"""The training configuration: one dataclass tree, loaded from YAML plus dotted overrides.

    easyvideor1 train configs/demo_cpu.yaml training.steps=50 algorithm.policy_loss=gspo

Sections owned by other packages are embedded as they are (`vision` from
`vision.config`, `algorithm` from `algorithms.config`). Each value is defined here once;
nothing copies values between sections. `easyvideor1 train --help-config` lists every field.
"""

from __future__ import annotations

import logging
from importlib import resources
from dataclasses import dataclass, field, replace
from typing import Literal

from easyvideor1 import config_tree
from easyvideor1.algorithms.config import ALGORITHM_PRESETS, AlgorithmConfig
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rollout.tools.registry import get_tools
from easyvideor1.vision import budget
from easyvideor1.vision.config import VisionConfig

log = logging.getLogger(__name__)


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    """Training sample files (JSON, JSONL or Parquet)."""
    val_files: list[str] = field(default_factory=list)
    """Validation sample files, scored per problem_type during training."""
    data_root: str | None = None
    """Folder relative media paths resolve against (default: each file's folder)."""
    on_error: Literal["fail", "skip"] = "fail"
    """Bad records: stop with a report (`fail`) or skip them and report (`skip`)."""
    template_dir: str | None = None
    """Folder of Jinja prompt templates overriding the built-in ones."""
    cache_dir: str | None = None
    """Frame cache folder built by `easyvideor1 cache` (None: decode on the fly)."""
    cache_mode: Literal["prefer_cache", "cache_only", "realtime"] = "prefer_cache"
    """Read cached frames and fall back to decoding, require the cache, or always decode."""
    max_prompt_tokens: int = 28672
    """Longest prompt (text + vision tokens, never truncated); at load it must hold rollout.limit_videos videos + limit_images images at the vision section's largest + prompt_text_tokens; longer ones at run time are skipped and counted."""
    prompt_text_tokens: int = 512
    """Tokens the load-time prompt check keeps for text beside the largest vision input (template, question, options; tool schemas with rollout.tools)."""
    max_skip_fraction: float = 0.01
    """Most samples skipped at run time (unreadable media, prompts over max_prompt_tokens), as a fraction of those tried so far; past it the run stops naming the first (1: never stop)."""
    shuffle: bool = True
    """Shuffle training samples each epoch (seeded by training.seed)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_skip_fraction <= 1.0:
            raise ValueError(f"data.max_skip_fraction must be in [0, 1] (1: never stop), got {self.max_skip_fraction}")
        if self.prompt_text_tokens < 0 or self.max_prompt_tokens < 1:
            raise ValueError(f"data.max_prompt_tokens ({self.max_prompt_tokens}) must be >= 1 and "
                             f"data.prompt_text_tokens ({self.prompt_text_tokens}) >= 0")


@dataclass
class LoRAConfig:
    rank: int = 0
    """LoRA rank (0: full fine-tuning; > 0: the base model is frozen and only the adapters train)."""
    alpha: float = 0.0
    """LoRA scale numerator: adapters add (alpha / rank) * B @ A (0: alpha = 2 * rank)."""
    dropout: float = 0.0
    """Dropout on the adapters' input in train-mode passes (the HF engine decodes in eval mode; keep 0 for exact PPO ratios)."""
    target_modules: list[str] = field(default_factory=list)
    """Linear layers to adapt, by last name component (e.g. q_proj); empty: every linear layer of the language model but MoE gates."""
    vision: bool = False
    """Also adapt the vision tower's linear layers (default: the vision tower stays frozen)."""
    modules_to_save: list[str] = field(default_factory=list)
    """Modules trained in full beside the adapters and saved with them (e.g. lm_head)."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise ValueError(f"model.lora.rank must be >= 0 (0: full fine-tuning), got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout must be in [0, 1), got {self.dropout}")

    @property
    def scale_alpha(self) -> float:
        """The alpha given to peft (`alpha`, or 2 * rank when alpha is 0)."""
        return self.alpha or 2.0 * self.rank


@dataclass
class ModelConfig:
    path: str = ""
    """Local HF-format model folder (policy initialisation; also the reference model)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """Compute dtype (float32 master weights and AdamW states under it); also the reference's and export's."""
    attn_implementation: str = "sdpa"
    """Attention kernel: `sdpa`, `eager`, `flash_attention_2`."""
    freeze_vision: bool = False
    """Keep the vision tower frozen (no gradient, no optimizer state)."""
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute activations in backward to save memory; auto: on for rows over 4096 tokens (training.recompute)."""
    strict_kernels: bool = False
    """On CUDA, raise instead of warning once when an attention call would run SDPA's O(L^2) MATH kernel (models.kernel_check)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters (peft) instead of full fine-tuning; the reference is then the base model."""


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: `hf` (generate on the policy) or `vllm` (colocated vLLM)."""
    n: int = 8
    """Responses per prompt (group size)."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = -1
    """Top-k sampling (-1: off)."""
    max_tokens: int = 1024
    """Response length limit, tokens."""
    stop_tokens: list[str] = field(default_factory=list)
    """Single tokens that end a response besides end-of-turn (kept in it), e.g. `</answer>`."""
    val_temperature: float = 0.0
    """Sampling temperature for validation (0: greedy)."""
    max_batch_tokens: int = 32768
    """hf engine (also separate placement's validation): padded tokens per decoded batch, prompt + max_tokens per row (0: off); a longer prompt goes alone."""
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """vLLM's weight and compute dtype, apart from model.dtype (float32 only for exact CPU tests)."""
    tensor_parallel_size: int = 1
    """vLLM tensor-parallel size: GPUs (torchrun ranks, or rollout processes under `separate` placement) per engine; must divide their count."""
    gpu_memory_utilization: float = 0.6
    """Fraction of GPU memory vLLM may take (colocated with training)."""
    limit_videos: int = 1
    """Most videos per prompt for vLLM (it reserves encoder memory for them); samples over it are an error. With rollout.tools the engine takes max_turns - 1 more (one per tool turn; a call past them is an error turn)."""
    limit_images: int = 2
    """Most images per prompt for vLLM (as limit_videos). Both limits are the media the load-time prompt check counts (data.max_prompt_tokens); 0 for data without that medium."""
    enforce_eager: bool = False
    """Run vLLM without CUDA graphs / torch.compile (quicker start, slower decoding; set true on CPU)."""
    sleep: bool = True
    """Offload vLLM's weights to host memory and free its KV cache during each update (CUDA only)."""
    parity_check_every: int = 0
    """Every k steps log the engine-vs-trainer log-prob gap per modality (0: never)."""
    tools: list[str] = field(default_factory=list)
    """Video tools the model may call, multi-turn (`rollout.tools.registry.TOOLS`: crop_video, zoom_frame); empty: off. A record's `tools` field narrows them per sample (`[]`: none)."""
    max_turns: int = 3
    """Most model turns per response when tools are on (tool calls of the last one are not run)."""
    tool_call_visual_tokens: int = 256
    """Most visual tokens one tool call may return (crop_video's default frame count fills it)."""
    tool_response_visual_tokens: int = 1024
    """Most visual tokens all tool turns of one response may return together."""

    placement: Literal["colocated", "separate"] = "colocated"
    """`colocated`: the trainer generates; `separate`: rollout processes generate and score (`training.asynchronous`)."""
    processes: int = 1
    """Rollout processes under `separate` placement, each generating a share of every batch: under torchrun the last ranks, else started by `easyvideor1 train`."""
    partial: bool = False
    """Partial rollouts (separate placement, max_staleness >= 1, hf engine): a batch's unfinished responses continue with each newer weight sync, every token recording its weight version."""
    partial_tokens: int = 64
    """Partial rollouts: decode steps between a batch's weight switches (reproducible, resumes exactly); 0: switch as each sync arrives (never waits; timing places the switches)."""

    def __post_init__(self) -> None:
        get_tools(self.tools)  # unknown names list the valid ones
        if self.max_turns < 1:
            raise ValueError(f"rollout.max_turns must be >= 1, got {self.max_turns}")
        if self.max_batch_tokens < 0:
            raise ValueError(f"rollout.max_batch_tokens must be >= 0 (0: off), got {self.max_batch_tokens}")
        if self.partial_tokens < 0:
            raise ValueError(f"rollout.partial_tokens must be >= 0 (0: as each weight sync arrives), got "
                             f"{self.partial_tokens}")
        if min(self.tool_call_visual_tokens, self.tool_response_visual_tokens) < 1:
            raise ValueError("rollout.tool_call_visual_tokens and tool_response_visual_tokens must be >= 1")


@dataclass
class HybridConfig:
    enable: bool = False
    """Put the sample's offline trajectory in the last slot of its group (paper section 3.2.1)."""
    mode: Literal["always", "threshold"] = "always"
    """`always` replace, or only when the group's online accuracy is below `threshold`."""
    threshold: float = 0.5
    """Online accuracy below which the offline trajectory is used (threshold mode)."""


@dataclass
class TrainingConfig:
    steps: int = 100
    """Optimizer steps (one rollout batch each)."""
    rollout_batch_size: int = 32
    """Prompts per step."""
    mini_batch_size: int = 32
    """Prompts per optimizer update within a step (PPO mini-batch)."""
    balance_ranks: bool = True
    """Hand each step's samples to data-parallel ranks by estimated prompt tokens, not contiguously."""
    micro_batch_size: int = 4
    """Sequences per forward/backward (gradient accumulation unit), when micro_batch_tokens is 0."""
    micro_batch_tokens: int = 0
    """Token budget per forward/backward instead (0: micro_batch_size sequences); same count on every rank."""
    shared_prefix: bool = True
    """One prompt forward (vision tower included) per group in micro-batches; exact, else plain path."""
    padding_free: bool = True
    """Log-prob passes and update on packed rows (no pad token computed) where exact, else padded."""
    sequence_parallel_size: int = 1
    """Ulysses sequence parallelism: each packed row split over k ranks (k divides the processes and heads)."""
    logprob_chunk_size: int = 1024
    """Response tokens whose [tokens, vocab] logits are made at once (memory of the log-prob passes)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """adamw, or sgd (plain SGD, no state: updates linear in the gradient, as equality tests want)."""
    lr: float = 1e-6
    """Learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay (sgd: none)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, steps."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    lr_decay_start: float = 0.0
    """cosine: fraction of the steps after warm-up at the full rate before the decay (0.6: flat for 60%, then cosine to 0)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (steps with a non-finite norm are skipped)."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""
    val_every: int = 0
    """Validate every k steps (0: only before and after training)."""
    val_max_samples: int = 0
    """Validate on at most this many samples (0: all)."""
    max_minutes: float = 0.0
    """Stop after this many minutes of training (0: no limit)."""
    max_staleness: int = 0
    """Separate placement: batch s is generated with the weights after step s-1-k (0: on-policy)."""
    collective_timeout_minutes: float = 120.0
    """Limit of one collective of the trainer world and the weight groups (NCCL's default 10 min aborts long steps)."""


@dataclass
class LoggingConfig:
    out_dir: str = "runs/train"
    """Run folder: metrics.jsonl, checkpoints, report and plots."""
    tensorboard: bool = False
    """Also log to TensorBoard (needs `tensorboard`)."""
    wandb: bool = False
    """Also log to Weights & Biases (needs `wandb`)."""
    wandb_project: str = "easyvideor1"
    """W&B project name."""
    progress: bool = True
    """Show a progress bar with step time and ETA."""


@dataclass
class CheckpointConfig:
    every: int = 0
    """Save a checkpoint every k steps and after the last step (0: no checkpoints at all)."""
    keep: int = 2
    """Keep the newest K checkpoints."""
    resume: str = "auto"
    """`auto` (newest complete checkpoint in out_dir), `never`, or a checkpoint folder."""
    timeout_minutes: float = 60.0
    """How long ranks wait for each other's checkpoint writes (a CPU group of its own, not the NCCL timeout)."""
    export_hf: bool = True
    """Write `<out_dir>/hf_model` (from_pretrained / vLLM loadable) at the end, checkpoints or not."""


@dataclass
class ScoringConfig:
    workers: int = 0
    """Scorer processes (0: in the trainer process; code rewards sandbox themselves either way)."""
    timeout_s: float = 60.0
    """Per-response scoring limit when workers > 0 (a timeout scores 0 and is counted)."""


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    """Sample files, prompt templates and the frame cache."""
    vision: VisionConfig = field(default_factory=VisionConfig)
    """Frame sampling and pixel budgets."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy (and reference) model."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation engine and sampling."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator, policy loss, KL and aggregation."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward weights, format rule and per-family settings."""
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    """Where and how long rewards are computed."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Batch sizes, optimizer and schedule."""
    hybrid: HybridConfig = field(default_factory=HybridConfig)
    """Hybrid offline/online groups."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Where metrics and reports go."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint cadence and resume."""

    def __post_init__(self) -> None:
        t = self.training
        if t.steps < 1:
            raise ValueError(f"training.steps must be >= 1, got {t.steps}")
        if t.rollout_batch_size % t.mini_batch_size:
            raise ValueError(f"training.rollout_batch_size ({t.rollout_batch_size}) must be a multiple "
                             f"of training.mini_batch_size ({t.mini_batch_size})")
        if t.micro_batch_tokens < 0:
            raise ValueError(f"training.micro_batch_tokens must be >= 0 (0: micro_batch_size sequences), "
                             f"got {t.micro_batch_tokens}")
        if t.sequence_parallel_size < 1:
            raise ValueError(f"training.sequence_parallel_size must be >= 1 (1: off), got {t.sequence_parallel_size}")
        if not t.collective_timeout_minutes > 0:
            raise ValueError(f"training.collective_timeout_minutes must be > 0, got {t.collective_timeout_minutes}")
        if not 0.0 <= t.lr_decay_start < 1.0:
            raise ValueError(f"training.lr_decay_start must be in [0, 1) (a fraction of the steps), got {t.lr_decay_start}")
        if self.hybrid.enable and self.rollout.n < 2:
            raise ValueError("hybrid.enable needs rollout.n >= 2 (n-1 online responses + 1 offline)")


def prompt_budget_problem(cfg: Config) -> str | None:
    """Why `data.max_prompt_tokens` cannot hold the largest prompt the config admits (None: it can),
    naming the largest admissible settings. Counted by `vision.budget` as the sampler sizes frames:
    `rollout.limit_videos` videos and `rollout.limit_images` images per prompt (what vLLM admits;
    the hf engine takes more, and a prompt that then runs over is skipped and counted at run time)
    plus `data.prompt_text_tokens` of text (a run that admits no media is not checked). Needs only
    the config: `vision.family` is the model's (the train command and `training.setup` refuse a
    model of another family)."""
    d, v, r = cfg.data, cfg.vision, cfg.rollout
    room = d.max_prompt_tokens - d.prompt_text_tokens

    def fits(vision: VisionConfig) -> bool:
        return budget.prompt_vision_tokens(vision, r.limit_videos, r.limit_images) <= room

    if not (r.limit_videos or r.limit_images) or fits(v):  # a text-only run (no media admitted): nothing to check
        return None
    video, image = budget.largest_video(v), budget.image_tokens(v)
    need = budget.prompt_vision_tokens(v, r.limit_videos, r.limit_images) + d.prompt_text_tokens
    parts = []
    if r.limit_videos:
        parts.append(f"{r.limit_videos} video{'s' * (r.limit_videos > 1)} of up to {video.tokens:,} "
                     f"({video.frames} frames of up to {video.frame_pixels:,} px, {v.family})")
    if r.limit_images:
        parts.append(f"{r.limit_images} image{'s' * (r.limit_images > 1)} of up to {image:,}")
    fixes = [f"data.max_prompt_tokens >= {need}"]
    if r.limit_videos:
        for name, lo in (("max_frames", v.min_frames), ("video_total_pixels", v.video_min_pixels)):
            best = budget.largest_fitting(lo, getattr(v, name), lambda x: fits(replace(v, **{name: x})))
            if best is not None:
                fixes.append(f"vision.{name} <= {best}")
    if len(fixes) == 1 and r.limit_images:
        best = budget.largest_fitting(v.image_min_pixels, v.image_max_pixels,
                                      lambda x: fits(replace(v, image_max_pixels=x)))
        if best is not None:
            fixes.append(f"vision.image_max_pixels <= {best}")
    return (f"data.max_prompt_tokens={d.max_prompt_tokens} cannot hold the largest prompt this config admits, "
            f"{need:,} tokens: {' + '.join(parts)} (rollout.limit_videos / limit_images per prompt) + "
            f"{d.prompt_text_tokens} of text (data.prompt_text_tokens), so such samples would be skipped; "
            f"set {', or '.join(fixes)}")


def demo_config_path() -> str:
    """The packaged config of `easyvideor1 demo` (configs/demo_cpu.yaml inside the package)."""
    return str(resources.files("easyvideor1") / "configs" / "demo_cpu.yaml")


def load_config(path: str | None = None, overrides: list[str] | None = None, check_prompt: bool = True) -> Config:
    """Load and validate the tree from a YAML file (optional) plus `section.key=value` overrides.

    `algorithm.preset: dapo` (a key of `algorithms.config.ALGORITHM_PRESETS`) fills the algorithm
    section with that recipe. One rule of precedence: a field written explicitly wins over
    the preset, wherever either comes from (the YAML file or the command line). Each field
    that changes a preset's value is named in one warning at load.

    `check_prompt`: refuse a config whose largest prompt exceeds `data.max_prompt_tokens`
    (`prompt_budget_problem`); off only to read back what a past run recorded (its checkpoints'
    config, for export and eval settings), which may predate the check.
    """
    data = config_tree.read_yaml(path) if path else {}
    data = config_tree.apply_overrides(data, overrides or [])
    algo = data.get("algorithm") or {}
    if isinstance(algo, dict) and "preset" in algo:
        algo = dict(algo)
        name = algo.pop("preset")
        if name not in ALGORITHM_PRESETS:
            raise config_tree.ConfigError(f"algorithm.preset={name!r} is unknown; "
                                          f"valid: {', '.join(ALGORITHM_PRESETS)}")
        from_cli = config_tree.apply_overrides({}, overrides or []).get("algorithm") or {}
        clashes = [f"{k}={v} (from the {'command line' if k in from_cli else 'config file'}) overrides the "
                   f"preset's {ALGORITHM_PRESETS[name][k]}"
                   for k, v in algo.items()
                   if k in ALGORITHM_PRESETS[name] and _differs(v, ALGORITHM_PRESETS[name][k])]
        if clashes:
            log.warning("algorithm.preset=%s: %s", name, "; ".join(clashes))
        data["algorithm"] = {**ALGORITHM_PRESETS[name], **algo}
    cfg = config_tree.from_dict(Config, data)
    problem = prompt_budget_problem(cfg) if check_prompt else None
    if problem:
        raise config_tree.ConfigError(problem)
    return cfg


def _differs(value, preset_value) -> bool:
    """A YAML list against a preset's tuple, an int against a float: compared as values."""
    if isinstance(value, (list, tuple)) and isinstance(preset_value, (list, tuple)):
        return list(value) != list(preset_value)
    return value != preset_value
