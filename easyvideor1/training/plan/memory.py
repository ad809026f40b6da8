"""Per-GPU memory of a training run, from its config and its model's shape (`easyvideor1 plan`).

State (exact counts from `plan.shapes`, FSDP2-sharded over every process):
- parameters: float32 master weights, 4 bytes x parameters / gpus (LoRA: the frozen base in the
  compute dtype, the adapters in float32);
- gradients: float32 (FSDP2's reduce dtype), 4 bytes x trainable / gpus;
- optimizer: AdamW's two float32 moments, 8 bytes x trainable / gpus (sgd: none);
- FSDP buffers: the unit being computed and the prefetched next one, all-gathered in the compute
  dtype, plus that unit's unsharded gradient: 3 x largest unit x compute bytes. A decoder layer is
  one unit, so in a mixture-of-experts model the largest unit is a sparse layer with all its E
  experts (E x 3HI parameters, whatever top-k a token uses): its experts are the row "expert unit
  gathered" (3 x E x 3HI x compute bytes), the rest of it stays in "FSDP buffers";
- reference (with a KL term, full fine-tuning): the compute dtype, sharded.

Activations of one micro-batch's forward and backward, per token of its packed row (a row is the
micro-batch's prompts once each under shared prefix, plus its responses), divided by the sequence
parallel degree. What a Qwen decoder layer saves for backward, per token, with `c` the compute
dtype's bytes (2 for bf16, 4 for float32), H hidden, I intermediate, d head dim, h / g query /
key-value heads (found by recording autograd's saved tensors of the real transformers layers):
- each of the two RMSNorms (input, post-attention): its float32 input (4H), the float32
  1/rms (4), the normalised value before the weight (cH) and its output, the next linears' input
  (cH);
- attention: q, k, v after RoPE (c(h + 2g)d), the attention output, which is also o_proj's
  input (c h d), and the kernel's float32 log-sum-exp (4h); Qwen3's per-head q/k norms add their
  float32 input, 1/rms and output ((4 + c)(h + g)d + 4(h + g));
- MLP: gate's output (SiLU's input), SiLU's output, up's output, and their product, down's input (4cI).
So `layer = 2(4H + 4 + 2cH) + c(2h + 2g)d + 4h + 4cI` (+ the q/k norms). A sparse MoE layer
(`moe_bytes`) runs I = top-k x the expert width (+ the shared expert) per token and adds, per routed
(token, expert), the gathered input and the weighted output (2cH), the routing weight and the index
(c + 16), and per token the router's float32 probabilities and top-k (4E + 12k + 4); Qwen3.5-MoE's
shared-expert gate adds its output and sigmoid (cH + 2c). Once per row: RoPE's cos
and sin (2cd), the final norm (4H + 4 + cH), the token ids (8). With gradient checkpointing only
each layer's input is kept (cH per layer). "Saved" is what forward keeps until backward; "layer
backward" is what backward adds while it does one layer: that layer recomputed (checkpointing
only) and the gradients of its MLP's intermediates (`BACKWARD_MLP` x cI; a MoE layer's also
`BACKWARD_ROUTES` x k x cH, measured on CPU with and without checkpointing).

The vision tower is counted the same way per patch (merge^2 patches per LLM vision token): norms
(2(4W + 4 + 2cW)), qkv (3cW), q and k after RoPE (2cW), attention output and proj input (2cW), MLP
(4cI gated, 2cI fc1/fc2); with checkpointing each block's input (cW). Once per patch: its pixels
(the patch embedding's input), RoPE's cos and sin, the merger's norm and MLP (`patch_bytes`).

The log-prob head makes one chunk of `training.logprob_chunk_size` rows of [chunk, V] logits at
a time, checkpointed: its backward holds the float32 log-softmax, its gradient and the logits'
float32 gradient (12V per row), plus in half precision that gradient cast back (cV); entropy adds
8V. It runs before any layer's backward, so the peak counts the larger of it and "layer backward".

vLLM (colocated): `rollout.gpu_memory_utilization` of the GPU while it generates (its weights: all
experts of an MoE model, split over `rollout.tensor_parallel_size`); during the
update, with `rollout.sleep`, its weights sit in host memory and its KV cache is freed
(`VLLM_ASLEEP_GIB` stays: CUDA graphs, its context), else it keeps its whole share.

Validated against CPU measurements by `benchmarks/plan_check.py` (tests/training/test_memory_plan.py).
Qwen3.5's linear-attention layers are counted as full-attention layers (an approximation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from easyvideor1.models.families import get_family
from easyvideor1.training.plan.shapes import ModelShape
from easyvideor1.training.state.checkpoint import checkpoint_size, free_disk
from easyvideor1.vision.budget import largest_video
from easyvideor1.training.recompute import gradient_checkpointing

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
BACKWARD_MLP = 2  # transient [tokens, I] tensors of the backward pass (gradients of gate/up outputs)
BACKWARD_ROUTES = 3  # a MoE layer's [tokens x top-k, H] ones: gradients of weighted output, down output, gathered input
RUNTIME_GIB = 2.0  # CUDA context, NCCL buffers and allocator slack per GPU
VLLM_ASLEEP_GIB = 1.0  # what a sleeping colocated vLLM keeps (CUDA graphs, context)
VLLM_PROFILE_TOKENS = 8192  # vLLM's profile forward: its default chunked-prefill batch (max_num_batched_tokens)
VLLM_PROFILE_SEQS = 256  # and its sampler over max_num_seqs rows of float32 logits
HOST_PROCESS_GIB = 3.0  # host memory of one training process besides what the rows count (torch, CUDA, Python)


@dataclass(frozen=True)
class Workload:
    """The settings of a run that decide its memory (what `from_config` reads of a `Config`)."""

    gpus: int
    """Processes, one per GPU."""
    gpu_gib: float
    """Memory of one GPU, GiB."""
    compute_bytes: int
    """Bytes of the compute dtype (`model.dtype`)."""
    prompt_tokens: int
    """Tokens of a prompt (`data.max_prompt_tokens`: the longest prompt a run admits)."""
    vision_tokens: int
    """LLM tokens of a prompt that come from its video / images (the vision tower runs on merge^2 x as many patches)."""
    response_tokens: int
    """Tokens of a response (`rollout.max_tokens`)."""
    n: int
    """Responses per prompt."""
    micro_batch_size: int
    """Responses per micro-batch (when `micro_batch_tokens` is 0)."""
    micro_batch_tokens: int
    """Token budget of a micro-batch (0: `micro_batch_size`)."""
    shared_prefix: bool
    """A group's prompt runs once per micro-batch."""
    sequence_parallel: int
    """Ulysses degree: each row's tokens split over that many GPUs."""
    checkpointing: bool
    """Gradient checkpointing."""
    chunk: int
    """`training.logprob_chunk_size`."""
    entropy: bool
    """The update computes entropies (entropy_coef > 0)."""
    adam: bool
    """AdamW (two float32 moments) rather than plain SGD."""
    reference: bool
    """A separate reference model is resident (KL on, full fine-tuning)."""
    lora_rank: int
    """LoRA rank (0: full fine-tuning)."""
    lora_targets: tuple[str, ...]
    """LoRA target module names (empty: every language-model linear)."""
    freeze_vision: bool
    """The vision tower trains no parameters."""
    vllm: bool
    """Colocated vLLM generates (`rollout.engine: vllm`)."""
    vllm_share: float
    """`rollout.gpu_memory_utilization`."""
    vllm_sleep: bool
    """vLLM sleeps during the update."""
    rollout_bytes: int = 2
    """Bytes of the rollout engine's dtype (`rollout.dtype` for vLLM, else the compute dtype)."""
    tensor_parallel: int = 1
    """vLLM tensor-parallel size (its weights and KV cache split over that many GPUs)."""
    max_batch_tokens: int = 32768
    """HF engine: padded tokens decoded together (`rollout.max_batch_tokens`), its KV cache."""
    rollout_processes: int = 0
    """GPUs of rollout processes under separate placement (0: colocated); the others train."""
    gpus_per_node: int = 8
    """GPUs (processes) of one node, for the host RAM rows."""
    prompts_per_step: int = 0
    """Prompts of one step (`training.rollout_batch_size`), whose frames the processes hold."""
    video_bytes: int = 0
    """Bytes of the largest video's frames as the loader holds them (uint8 RGB)."""
    checkpoint_keep: int = 0
    """Checkpoints kept on disk (`checkpoint.keep`; 0: no checkpoints)."""

    @property
    def trainers(self) -> int:
        """GPUs that train (all but the rollout processes' under separate placement)."""
        return self.gpus - self.rollout_processes


@dataclass(frozen=True)
class Plan:
    """Bytes per GPU of each part, the two phases' totals and the verdict."""

    rows: tuple[tuple[str, float], ...]
    """(what, bytes) in display order."""
    activations: dict[bool, float]
    """Activations saved + layer backward, with (True) and without (False) gradient checkpointing."""
    update: float
    """Peak bytes of the update phase (state + activations + logits + sleeping vLLM + runtime)."""
    rollout: float
    """Peak bytes of the rollout phase (params + optimizer + reference + vLLM's share + runtime)."""
    tokens: int
    """Tokens of one micro-batch row per GPU."""
    capacity: float
    """Bytes of one GPU."""
    step: float = 0.0
    """Peak bytes of the optimizer step (state, gradients, AdamW's temporaries, runtime)."""
    vllm_needs: float = 0.0
    """The least share of a GPU vLLM starts with: its weights, its profile forward and one max_model_len of KV cache."""
    rollout_share: float = 0.0
    """Bytes of vLLM's share (`rollout.gpu_memory_utilization` of a GPU)."""
    rollout_gpu: float = 0.0
    """Peak bytes of a rollout process's GPU under separate placement (0: colocated)."""
    host: tuple[tuple[str, float], ...] = ()
    """(what, bytes) of host RAM per node."""
    checkpoint: float = 0.0
    """Bytes of one checkpoint on disk (all ranks' shards together)."""

    @property
    def vllm_short(self) -> bool:
        """vLLM's share of the GPU is below what it needs to start."""
        return self.vllm_needs > 0 and self.vllm_needs > self.rollout_share

    @property
    def fits(self) -> bool:
        return max(self.update, self.rollout, self.step, self.rollout_gpu) <= self.capacity and not self.vllm_short


def layer_bytes(s: ModelShape, c: int) -> float:
    """Bytes a decoder layer saves for backward per token (module docstring)."""
    h, g, d, H = s.heads, s.kv_heads, s.head_dim, s.hidden
    norms = 2 * (4 * H + 4 + 2 * c * H)
    attention = c * (2 * h + 2 * g) * d + 4 * h
    qk_norm = ((4 + c) * (h + g) * d + 4 * (h + g)) if s.qk_norm else 0
    return norms + attention + qk_norm + 4 * c * s.intermediate + moe_bytes(s, c)


def moe_bytes(s: ModelShape, c: int) -> float:
    """Bytes a sparse MoE layer saves per token besides its experts' MLPs (module docstring; 0: dense)."""
    if not s.experts:
        return 0
    k, H = s.top_k, s.hidden
    shared_gate = c * H + 2 * c if s.shared_intermediate else 0
    return k * (2 * c * H + c + 16) + 4 * s.experts + 12 * k + 4 + shared_gate


def row_bytes(s: ModelShape, c: int) -> float:
    """Bytes saved once per token of the row, outside the layers: cos/sin, final norm, ids."""
    return 2 * c * s.head_dim + 4 * s.hidden + 4 + c * s.hidden + 8


def vision_block_bytes(s: ModelShape, c: int) -> float:
    """Bytes a vision block saves per patch (module docstring)."""
    W, I = s.vision_hidden, s.vision_intermediate
    return 2 * (4 * W + 4) + c * 11 * W + c * (4 if s.vision_gated else 2) * I


def patch_bytes(s: ModelShape, c: int) -> float:
    """Bytes saved once per patch outside the blocks: the pixels (patch embedding's input), RoPE's
    cos and sin, the merger's norm (4W + 4 + cW) and MLP (3cW per patch)."""
    W = s.vision_hidden
    return c * s.patch_values + 2 * c * W // s.vision_heads + 4 * W + 4 + 4 * c * W


def text_activations(s: ModelShape, c: int, tokens: int, checkpointing: bool) -> tuple[float, float]:
    """(saved, working) bytes of the language model over a row of `tokens`: what forward keeps
    until backward, and what backward adds while one layer is done (recomputed with checkpointing)."""
    layer = layer_bytes(s, c)
    saved = s.layers * (c * s.hidden if checkpointing else layer) + row_bytes(s, c)
    working = ((layer if checkpointing else 0) + BACKWARD_MLP * c * s.intermediate
               + BACKWARD_ROUTES * s.top_k * c * s.hidden)
    return tokens * saved, tokens * working


def logits_bytes(s: ModelShape, c: int, rows: int, entropy: bool) -> float:
    """Peak bytes of one chunk of the log-prob head in backward (module docstring)."""
    return rows * s.vocab * (12 + (c if c < 4 else 0) + (8 if entropy else 0))


def vision_activations(s: ModelShape, c: int, patches: int, checkpointing: bool) -> tuple[float, float]:
    """(saved, working) bytes of the vision tower over `patches` (as `text_activations`)."""
    block = vision_block_bytes(s, c)
    return (patches * (s.vision_layers * (c * s.vision_hidden if checkpointing else block) + patch_bytes(s, c)),
            patches * block if checkpointing else 0.0)


def row_shape(w: Workload) -> tuple[int, int, int]:
    """(tokens, prompts, response tokens) of one micro-batch row, before sequence parallelism."""
    p, r = w.prompt_tokens, w.response_tokens
    if w.micro_batch_tokens:
        unit = (p + w.n * r) if w.shared_prefix else (p + r)
        responses = w.n if w.shared_prefix else 1
        per = max(1, w.micro_batch_tokens // unit)
        return max(w.micro_batch_tokens, unit), per, per * responses * r
    m = w.micro_batch_size
    if not w.shared_prefix:
        return m * (p + r), m, m * r
    prompts = -(-m // w.n) + (0 if (w.n % m == 0 or m % w.n == 0) else 1)  # a cut group adds a prompt
    return min(prompts, m) * p + m * r, min(prompts, m), m * r


def trainable(s: ModelShape, w: Workload) -> tuple[float, float]:
    """(trainable parameters, frozen parameters)."""
    if w.lora_rank:
        adapters = sum(w.lora_rank * (i + o) for name, i, o in s.lora_candidates
                       if ".language_model." in f".{name}" and (not w.lora_targets or name.split(".")[-1] in w.lora_targets))
        return adapters, s.parameters
    frozen = s.vision_parameters if w.freeze_vision else 0
    return s.parameters - frozen, frozen


def plan_memory(s: ModelShape, w: Workload) -> Plan:
    """The memory plan of `w` on `s` (module docstring)."""
    c, gpus, k = w.compute_bytes, w.trainers, w.sequence_parallel
    train, frozen = trainable(s, w)
    if w.lora_rank:
        params = (c * frozen + 4 * train) / gpus
    else:
        params = (4 * (train + frozen)) / gpus
    grads, optim = 4 * train / gpus, (8 * train / gpus if w.adam else 0.0)
    gathered = gpus > 1 or c != 4
    gather = 3 * (s.largest_unit - s.unit_experts) * c if gathered else 0.0
    experts = 3 * s.unit_experts * c if gathered else 0.0
    reference = c * s.parameters / gpus if w.reference and not w.lora_rank else 0.0
    tokens, prompts, responses = row_shape(w)
    per_gpu = -(-tokens // k)
    patches = -(-prompts * w.vision_tokens * s.merge**2 // k)
    act = {}  # checkpointing -> (saved, working)
    for ck in (True, False):
        (text, text_work), (vision, vision_work) = (text_activations(s, c, per_gpu, ck),
                                                    vision_activations(s, c, patches, ck))
        act[ck] = (text + vision, max(text_work, vision_work))
    logits = logits_bytes(s, c, min(w.chunk, max(1, responses // k)), w.entropy)
    runtime = RUNTIME_GIB * GIB
    capacity = w.gpu_gib * GIB
    separate = w.rollout_processes > 0
    vllm_here = w.vllm and not separate  # colocated vLLM shares the trainer's GPU
    vllm_update = 0.0 if not vllm_here else (VLLM_ASLEEP_GIB * GIB if w.vllm_sleep else w.vllm_share * capacity)
    vllm_rollout = w.vllm_share * capacity if vllm_here else 0.0
    # FSDP2 never reshards the root unit (embedding, merger, norms) between forward and backward
    root = c * s.root_unit if gpus > 1 or c != 4 else 0.0
    # a colocated HF engine decodes on the policy with every unit gathered, beside its KV cache
    hf_engine = 0.0 if w.vllm or separate else c * s.parameters + kv_bytes(s, w.compute_bytes, w.max_batch_tokens)
    temporaries = 4 * train / gpus if w.adam else 0.0  # AdamW's sqrt(v) / bias correction, one float32 copy
    saved, working = act[w.checkpointing]
    rows = (("parameters", params), ("gradients", grads), ("optimizer states", optim), ("FSDP buffers", gather),
            *((("expert unit gathered", experts),) if s.experts else ()), ("root unit", root),
            ("reference model", reference), ("activations", saved),
            ("layer backward", working), ("logits chunk", logits), ("AdamW step temporaries", temporaries),
            ("vLLM during update", vllm_update), ("vLLM during rollout", vllm_rollout),
            ("HF engine (gathered)", hf_engine), ("runtime", runtime))
    # a layer's backward and the head's chunk never run at once: the larger of the two counts
    update = (params + grads + optim + gather + experts + root + reference + saved + max(working, logits)
              + vllm_update + runtime)
    step = params + grads + optim + temporaries + vllm_update + runtime  # activations freed before the step
    rollout = params + optim + reference + vllm_rollout + hf_engine + runtime  # gradients freed after the step
    needs = vllm_minimum(s, w) if w.vllm else 0.0
    rollout_gpu = 0.0
    if separate:  # a rollout process's GPU: its copy of the policy and its engine
        rollout_gpu = (w.vllm_share * capacity if w.vllm
                       else w.rollout_bytes * s.parameters + kv_bytes(s, w.rollout_bytes, w.max_batch_tokens)) + runtime
    return Plan(rows, {ck: sum(v) for ck, v in act.items()}, update, rollout, per_gpu, capacity, step=step,
                vllm_needs=needs, rollout_gpu=rollout_gpu, host=host_rows(s, w), checkpoint=checkpoint_bytes(s, w),
                rollout_share=w.vllm_share * capacity)


def kv_bytes(s: ModelShape, dtype_bytes: int, tokens: int) -> float:
    """KV cache of `tokens` tokens: keys and values of every layer's key-value heads."""
    return 2 * s.layers * s.kv_heads * s.head_dim * dtype_bytes * tokens


def vllm_minimum(s: ModelShape, w: Workload) -> float:
    """What vLLM needs of one GPU to start, per tensor-parallel rank: its weights in the rollout
    dtype, the peak of its profile forward (a layer's transient tensors over its chunked-prefill
    batch and the sampler's float32 logits), one `max_model_len` sequence of KV cache (else it
    refuses), and what it keeps asleep (CUDA graphs, context). `advice` never offers less."""
    b, t = w.rollout_bytes, w.tensor_parallel
    weights = b * s.parameters / t
    profile = VLLM_PROFILE_TOKENS * b * (2 * s.intermediate + 4 * s.hidden) / t + VLLM_PROFILE_SEQS * s.vocab * 4
    kv = kv_bytes(s, b, w.prompt_tokens + w.response_tokens) / t
    return weights + profile + kv + VLLM_ASLEEP_GIB * GIB


def host_rows(s: ModelShape, w: Workload) -> tuple[tuple[str, float], ...]:
    """Host RAM of one node: a sleeping vLLM's weights in pinned memory (level 1 moves them to the
    host, each GPU its share), the frames each process holds for a step (uint8, the largest video
    per prompt), and each process's own (`HOST_PROCESS_GIB`)."""
    node = min(w.gpus, w.gpus_per_node)
    asleep = w.vllm and w.vllm_sleep and not w.rollout_processes  # a separate engine never sleeps
    pinned = node * w.rollout_bytes * s.parameters / w.tensor_parallel if asleep else 0.0
    frames = node * -(-w.prompts_per_step // max(1, w.trainers)) * w.video_bytes
    processes = node * HOST_PROCESS_GIB * GIB
    return (("vLLM asleep (pinned)", pinned), ("frames of a step", frames), ("processes", processes),
            ("node total", pinned + frames + processes))


def checkpoint_bytes(s: ModelShape, w: Workload) -> float:
    """One checkpoint on disk: the float32 master weights of what trains (all of the model in full
    fine-tuning; LoRA saves its adapters) and AdamW's two float32 moments of it."""
    train, _ = trainable(s, w)
    return checkpoint_size(train, s.parameters, bool(w.lora_rank), w.adam)


def _sp_choices(s: ModelShape, w: Workload) -> list[int]:
    return [k for k in range(w.sequence_parallel + 1, w.gpus + 1)
            if w.gpus % k == 0 and s.heads % k == 0]


def advice(s: ModelShape, w: Workload) -> list[str]:
    """Settings to change, in the order to try them: each one that alone makes the plan fit."""
    out = []
    if not plan_memory(s, w).fits:
        fits = lambda **changes: plan_memory(s, replace(w, **changes)).fits  # noqa: E731
        if not w.checkpointing and fits(checkpointing=True):
            out.append("model.gradient_checkpointing=true")
        if not w.micro_batch_tokens:
            for m in range(w.micro_batch_size - 1, 0, -1):
                if fits(micro_batch_size=m):
                    out.append(f"training.micro_batch_size={m}")
                    break
        for k in _sp_choices(s, w):
            if fits(sequence_parallel=k):
                out.append(f"training.sequence_parallel_size={k}")
                break
        if w.vllm and not w.vllm_sleep and fits(vllm_sleep=True):
            out.append("rollout.sleep=true")
        if w.vllm:
            least = vllm_minimum(s, w) / (w.gpu_gib * GIB)
            shares = (range(int(w.vllm_share * 20) + 1, 20) if plan_memory(s, w).vllm_short
                      else range(int(w.vllm_share * 20) - 1, 1, -1))
            for share in (x / 20 for x in shares):
                if share >= least and fits(vllm_share=share):
                    out.append(f"rollout.gpu_memory_utilization={share:.2f}")
                    break
        if w.vllm and not w.rollout_processes:
            out += _tensor_parallel(s, w)
        if w.chunk > 128 and fits(chunk=w.chunk // 4):
            out.append(f"training.logprob_chunk_size={w.chunk // 4}")
        if not w.freeze_vision and not w.lora_rank and fits(freeze_vision=True):
            out.append("model.freeze_vision=true")
        if not out:  # no single change is enough: the same ones together, in this order, until it fits
            out.append(_together(s, w))
    return out


def _tensor_parallel(s: ModelShape, w: Workload) -> list[str]:
    """The least `rollout.tensor_parallel_size` that, with the share nearest the current one that holds
    vLLM's slice of the weights, makes the plan fit (an MoE model's experts are most of vLLM's need)."""
    for t in (t for t in range(w.tensor_parallel + 1, w.gpus + 1) if w.gpus % t == 0 and s.heads % t == 0):
        least = vllm_minimum(s, replace(w, tensor_parallel=t)) / (w.gpu_gib * GIB)
        for share in sorted((x / 20 for x in range(1, 20) if x / 20 >= least), key=lambda x: abs(x - w.vllm_share)):
            if plan_memory(s, replace(w, tensor_parallel=t, vllm_share=share)).fits:
                return [f"rollout.tensor_parallel_size={t} rollout.gpu_memory_utilization={share:.2f}"]
    return []


def _together(s: ModelShape, w: Workload) -> str:
    """The settings of `advice`, applied one after the other until the plan fits."""
    sp = max([w.sequence_parallel, *_sp_choices(s, w)])
    steps = [("model.gradient_checkpointing=true", {"checkpointing": True}, not w.checkpointing),
             ("training.micro_batch_size=1", {"micro_batch_size": 1}, not w.micro_batch_tokens and w.micro_batch_size > 1),
             (f"training.sequence_parallel_size={sp}", {"sequence_parallel": sp}, sp > w.sequence_parallel),
             ("rollout.sleep=true", {"vllm_sleep": True}, w.vllm and not w.vllm_sleep),
             ("rollout.gpu_memory_utilization=0.30", {"vllm_share": 0.3},
              w.vllm and w.vllm_share > 0.3 and vllm_minimum(s, w) <= 0.3 * w.gpu_gib * GIB),
             ("model.freeze_vision=true", {"freeze_vision": True}, not w.freeze_vision and not w.lora_rank)]
    names = []
    for name, change, useful in steps:
        if useful:
            w = replace(w, **change)
            names.append(name)
            if plan_memory(s, w).fits:
                return "together: " + " ".join(names)
    return "none of these settings is enough: more GPUs, LoRA (model.lora.rank) or a smaller model"


def from_config(cfg, shape: ModelShape, gpus: int, gpu_gib: float, vision_tokens: int | None = None,
                gpus_per_node: int = 8) -> Workload:
    """The `Workload` of a training `Config` on `gpus` GPUs of `gpu_gib` GiB each."""
    t, r = cfg.training, cfg.rollout
    return Workload(
        gpus=gpus, gpu_gib=gpu_gib, compute_bytes=DTYPE_BYTES[cfg.model.dtype],
        prompt_tokens=cfg.data.max_prompt_tokens,
        vision_tokens=min(cfg.data.max_prompt_tokens,
                          video_tokens(cfg.vision, shape) if vision_tokens is None else vision_tokens),
        response_tokens=r.max_tokens, n=r.n, micro_batch_size=t.micro_batch_size,
        micro_batch_tokens=t.micro_batch_tokens, shared_prefix=t.shared_prefix,
        sequence_parallel=t.sequence_parallel_size, checkpointing=gradient_checkpointing(cfg)[0],
        chunk=t.logprob_chunk_size, entropy=cfg.algorithm.entropy_coef > 0, adam=t.optimizer == "adamw",
        reference=cfg.algorithm.needs_reference, lora_rank=cfg.model.lora.rank,
        lora_targets=tuple(cfg.model.lora.target_modules), freeze_vision=cfg.model.freeze_vision,
        vllm=r.engine == "vllm", vllm_share=r.gpu_memory_utilization, vllm_sleep=r.sleep,
        rollout_bytes=DTYPE_BYTES[r.dtype if r.engine == "vllm" else cfg.model.dtype],
        tensor_parallel=r.tensor_parallel_size, max_batch_tokens=r.max_batch_tokens,
        rollout_processes=r.processes if r.placement == "separate" else 0, gpus_per_node=min(gpus, gpus_per_node),
        prompts_per_step=t.rollout_batch_size, video_bytes=video_frame_bytes(cfg.vision, shape),
        checkpoint_keep=cfg.checkpoint.keep if cfg.checkpoint.every else 0)


def video_frame_bytes(vision, shape: ModelShape) -> int:
    """Bytes of the largest video's sampled frames as uint8 RGB: each LLM token of it is a
    temporal patch of frames of one merged patch's pixels (`video_tokens`)."""
    family = get_family(vision.family)
    return 3 * video_tokens(vision, shape) * family.temporal_patch_size * family.grid_factor**2


def video_tokens(vision, shape: ModelShape) -> int:
    """LLM vision tokens of the longest video the vision section admits, counted as the sampler
    sizes frames (`vision.budget.largest_video`: every frame count it can pick, the temporal patch,
    the per-family total-pixel rule)."""
    return largest_video(vision).vision_tokens


def render_plan(s: ModelShape, w: Workload, p: Plan, fixes: list[str]) -> str:
    """The table `easyvideor1 plan` prints, then the verdict."""
    gib = lambda b: f"{b / GIB:8.2f}"  # noqa: E731
    tokens, prompts, responses = row_shape(w)
    lines = [f"model: {s.source}: {s.parameters / 1e9:.2f}B parameters ({s.vision_parameters / 1e9:.2f}B vision), "
             f"{s.layers} layers, hidden {s.hidden}, {s.heads}/{s.kv_heads} heads, vocab {s.vocab}"
             + (f"; {s.sparse_layers} MoE layers of {s.experts} experts of width {s.expert_intermediate}, top-{s.top_k}"
                f"{f' + a shared expert of {s.shared_intermediate}' if s.shared_intermediate else ''}: "
                f"{s.expert_parameters / 1e9:.2f}B in experts, {s.active_parameters / 1e9:.2f}B language-model "
                f"parameters active per token" if s.experts else ""),
             f"micro-batch row: {tokens} tokens ({prompts} prompt(s) of {w.prompt_tokens}, {w.vision_tokens} of them "
             f"vision, + {responses} response tokens), {p.tokens} per GPU at sequence parallel {w.sequence_parallel}",
             f"per GPU, {w.gpus} GPUs of {w.gpu_gib:g} GiB:", f"  {'what':<22}{'GiB':>8}"]
    for name, value in p.rows:
        if name == "activations":
            lines.append(f"  {name:<22}{gib(value)}   (saved for backward; with the layer backward below, gradient "
                         f"checkpointing on {p.activations[True] / GIB:.2f}, off {p.activations[False] / GIB:.2f})")
        elif name == "expert unit gathered":
            lines.append(f"  {name:<22}{gib(value)}   (a MoE layer's {s.experts} experts, {s.unit_experts / 1e6:.0f}M "
                         f"parameters: {value / 3 / GIB:.2f} GiB each for the layer computed, the next one prefetched "
                         f"and the gradient)")
        elif name == "logits chunk":
            lines.append(f"  {name:<22}{gib(value)}   (runs apart from a layer's backward: the larger counts)")
        else:
            lines.append(f"  {name:<22}{gib(value)}")
    lines += [f"  {'update peak':<22}{gib(p.update)}", f"  {'optimizer step peak':<22}{gib(p.step)}",
              f"  {'rollout peak':<22}{gib(p.rollout)}"]
    phases = {"update": p.update, "optimizer step": p.step, "rollout": p.rollout}
    if w.rollout_processes:
        lines.insert(2, f"separate placement: {w.trainers} GPU(s) train (the state shards over them), "
                        f"{w.rollout_processes} generate")
        lines.append(f"  {'rollout GPU peak':<22}{gib(p.rollout_gpu)}   (a rollout process: its copy of the policy in "
                     f"the rollout dtype and its engine)")
        phases["rollout GPU"] = p.rollout_gpu
    if p.vllm_needs:
        lines.append(f"vLLM: its share {p.rollout_share / GIB:.1f} GiB (rollout.gpu_memory_utilization="
                     f"{w.vllm_share:g}) against the {p.vllm_needs / GIB:.1f} GiB it needs to start (weights "
                     f"{w.rollout_bytes * s.parameters / w.tensor_parallel / GIB:.1f}, profile forward, one "
                     f"max_model_len of KV cache, context): " + ("short" if p.vllm_short else "enough"))
    lines.append(f"host RAM per node ({w.gpus_per_node} GPUs): "
                 + ", ".join(f"{name} {value / GIB:.1f} GiB" for name, value in p.host))
    head = max(phases.values())
    if p.fits:
        lines.append(f"verdict: fits ({head / GIB:.1f} of {w.gpu_gib:g} GiB, {(p.capacity - head) / GIB:.1f} GiB spare)")
    else:
        phase = max(phases, key=phases.get)
        need = (f"vLLM needs {p.vllm_needs / GIB:.1f} GiB to start, its share is {p.rollout_share / GIB:.1f}"
                if p.vllm_short and head <= p.capacity else f"the {phase} needs {head / GIB:.1f} GiB of {w.gpu_gib:g}")
        lines.append(f"verdict: does not fit: {need}; change first: "
                     + (fixes[0] + (f" (or else, in this order: {', '.join(fixes[1:])})" if fixes[1:] else "")
                        if fixes else "nothing found"))
    return "\n".join(lines)


def render_disk(p: Plan, w: Workload, out_dir: str) -> str:
    """The checkpoint line of `easyvideor1 plan`: bytes per checkpoint, for `checkpoint.keep` + 1
    (the one being written), against the free space of `out_dir`'s disk."""
    if not w.checkpoint_keep:
        return f"checkpoints: off (checkpoint.every=0); one would take {p.checkpoint / GIB:.1f} GiB"
    need = (w.checkpoint_keep + 1) * p.checkpoint
    free = free_disk(out_dir)[1]
    verdict = "enough" if need <= free else "NOT enough: the run refuses to start"
    return (f"checkpoints: {p.checkpoint / GIB:.1f} GiB each, {need / GIB:.1f} GiB for checkpoint.keep="
            f"{w.checkpoint_keep} + the one being written, {free / GIB:.1f} GiB free on {out_dir}'s disk: {verdict}")
