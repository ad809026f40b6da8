"""`easyvideor1 plan`'s memory model against what the CPU measures, for 3 configurations.

    python benchmarks/plan_check.py

Each configuration runs in a fresh subprocess: a Qwen2.5-VL-shaped model built from its config
(random weights), one warm-up step (gradients and AdamW's states allocated), then one
forward + backward of the trainer's shape: the vision tower over each prompt's video and the
backbone over one packed row of the micro-batch's tokens (`plan.memory.row_shape`: prompts once
under shared prefix, plus the responses), the response positions scored by the chunked log-prob
head (`models.logprobs.token_logprobs`), the loss backpropagated. `bfloat16` keeps float32 masters, gradients and AdamW states and computes on a
bf16 copy (as FSDP2's mixed precision does).

- State: exact bytes of the parameters, gradients and optimizer states (sums of tensor sizes).
- Activations: the process's peak resident memory during that forward + backward above its
  resident memory before it (`VmHWM` reset through /proc/self/clear_refs). glibc is told to
  serve every allocation over 64 KiB by mmap (`MALLOC_MMAP_THRESHOLD_`), so a freed tensor leaves
  the resident set at once and the peak is that of the live tensors, whatever the machine's load.

The plan is `training.plan.memory.plan_memory` for the same workload on 1 GPU, read from the model's
config.json (`training.plan.shapes.read_shape`). A row passes when the plan is within
`TOLERANCE` of the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

TOLERANCE = 0.25


@dataclass(frozen=True)
class Check:
    """One configuration: a model's widths and a micro-batch's lengths."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    prompt: int
    response: int
    n: int
    micro_batch_size: int
    shared_prefix: bool
    checkpointing: bool
    dtype: str
    vision_tokens: int = 0
    """LLM tokens of the video in each prompt (its merge^2 x as many patches go through the vision tower)."""
    vision_width: int = 32
    vision_depth: int = 1


CHECKS = [
    Check("A: hidden 256 x 4 layers, 2 rows of 1536+512 packed, 512 video tokens each (vision 256 x 4 blocks), "
          "float32, no checkpointing", 256, 4, 4, 2, 8192, 1536, 512, 2, 2, False, False, "float32", 512, 256, 4),
    Check("B: hidden 384 x 3 layers, 1 row of 3072+1024, 1024 video tokens (vision 256 x 4 blocks), float32, "
          "gradient checkpointing", 384, 3, 6, 2, 8192, 3072, 1024, 1, 1, False, True, "float32", 1024, 256, 4),
    # bf16 at a small shape: on a CPU without AVX-512 bf16 matmuls run ~57x slower than fp32 (hidden 512 x 3
    # layers with 6,144 tokens took 980 s there); memory, what this checks, does not depend on speed.
    Check("C: hidden 256 x 2 layers, shared prompt 768 (256 video tokens, vision 128 x 2 blocks) + 4 x 192, "
          "bf16 compute, no checkpointing", 256, 2, 4, 2, 4096, 768, 192, 4, 4, True, False, "bfloat16", 256, 128, 2),
]


def model_config(check: Check):
    from easyvideor1.models.tiny import TINY_CONFIGS, TinySize
    from easyvideor1.models.tokenizer import SPECIAL_TOKENS

    size = TinySize(check.hidden, check.layers, check.heads, check.kv_heads, check.vision_width, check.vision_depth,
                    check.vision_width // 64 or 2, check.vocab)
    return TINY_CONFIGS["qwen2_5_vl"](size, {t: i for i, t in enumerate(SPECIAL_TOKENS)})


def workload(check: Check):
    from easyvideor1.training.plan.memory import DTYPE_BYTES, Workload

    return Workload(gpus=1, gpu_gib=1e6, compute_bytes=DTYPE_BYTES[check.dtype], prompt_tokens=check.prompt,
                    vision_tokens=check.vision_tokens, response_tokens=check.response, n=check.n,
                    micro_batch_size=check.micro_batch_size, micro_batch_tokens=0, shared_prefix=check.shared_prefix,
                    sequence_parallel=1, checkpointing=check.checkpointing, chunk=1024, entropy=False, adam=True,
                    reference=False, lora_rank=0, lora_targets=(), freeze_vision=False, vllm=False, vllm_share=0.0,
                    vllm_sleep=False)


def _status(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024


def measure(check: Check) -> dict[str, float]:
    """In this process: exact state bytes and the activation peak of one step (module docstring)."""
    import copy
    import gc

    import torch
    from transformers import AutoModelForImageTextToText

    from easyvideor1.models.logprobs import token_logprobs
    from easyvideor1.training.plan.memory import row_shape

    torch.manual_seed(0)
    master = AutoModelForImageTextToText.from_config(model_config(check), dtype=torch.float32)
    compute = master if check.dtype == "float32" else copy.deepcopy(master).to(getattr(torch, check.dtype))
    if check.checkpointing:
        compute.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    compute.train()
    optimizer = torch.optim.AdamW(master.parameters(), lr=1e-4)
    tokens, prompts, responses = row_shape(workload(check))
    config = master.config

    def step(length: int, scored: int, videos: int = 0) -> None:
        ids = torch.randint(100, check.vocab, (1, length))
        media = {}
        if videos:  # each video: 2 temporal patches of 32 x (vision_tokens / 32) merged tokens
            grid = torch.tensor([[2, 32, 4 * check.vision_tokens // 64]] * videos)
            for v in range(videos):  # [vision_start, video_pad x vision_tokens, vision_end] inside prompt v
                at = 1 + v * (length // max(1, videos))
                ids[0, at] = config.vision_start_token_id
                ids[0, at + 1:at + 1 + check.vision_tokens] = config.video_token_id
                ids[0, at + 1 + check.vision_tokens] = config.vision_end_token_id
            patch = config.vision_config.patch_size
            media = dict(pixel_values_videos=torch.randn(int(grid.prod(-1).sum()), 3 * 2 * patch * patch,
                                                         dtype=compute.dtype), video_grid_thw=grid)
        hidden = compute.model(input_ids=ids, use_cache=False, **media).last_hidden_state  # [1, T, H]
        rows = hidden[0, length - scored - 1:length - 1]  # the positions that predict the scored tokens
        logp, _ = token_logprobs(rows, compute.lm_head, ids[0, length - scored:], chunk_size=1024)
        (-logp.mean()).backward()

    step(64 + (prompts * (check.vision_tokens + 2) if check.vision_tokens else 0), 16,
         prompts if check.vision_tokens else 0)  # warm-up: gradients and optimizer states exist from here on
    if compute is not master:
        for p, q in zip(master.parameters(), compute.parameters()):
            p.grad = None if q.grad is None else q.grad.float()
    for p in master.parameters():  # what the forward did not reach (the vision tower of a text-only row)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    state = {"parameters": sum(p.numel() * p.element_size() for p in master.parameters()),
             "gradients": sum(p.grad.numel() * p.grad.element_size() for p in master.parameters()),
             "optimizer states": sum(t.numel() * t.element_size() for s in optimizer.state.values()
                                     for t in s.values() if torch.is_tensor(t))}
    compute.zero_grad(set_to_none=False)  # the compute copy's gradients stay allocated too
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    before = _status("VmRSS")
    step(tokens, responses, prompts if check.vision_tokens else 0)
    return {**state, "activations": _status("VmHWM") - before}


def planned(check: Check) -> dict[str, float]:
    """The plan's figures for `check`, read from the model's config.json."""
    from easyvideor1.training.plan.shapes import read_shape

    with tempfile.TemporaryDirectory() as folder:
        model_config(check).save_pretrained(folder)
        shape = read_shape(folder)
    return plan_figures(shape, check)


def plan_figures(shape, check: Check) -> dict[str, float]:
    """The plan's state rows and its activation peak (saved + the larger of layer backward and logits chunk)."""
    from easyvideor1.training.plan.memory import plan_memory

    rows = dict(plan_memory(shape, workload(check)).rows)
    return {"parameters": rows["parameters"], "gradients": rows["gradients"],
            "optimizer states": rows["optimizer states"],
            "activations": rows["activations"] + max(rows["layer backward"], rows["logits chunk"])}


def measured(check: Check) -> dict[str, float]:
    """`measure(check)` in a fresh subprocess (every allocation over 64 KiB served by mmap)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, "--measure", json.dumps(asdict(check))], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"measuring {check.name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(plan: dict[str, float], measure: dict[str, float]) -> dict[str, tuple[float, float, float]]:
    """(planned MiB, measured MiB, planned / measured) of the state (params + grads + optimizer)
    and of the activations."""
    state = ("parameters", "gradients", "optimizer states")
    pairs = {"state": (sum(plan[k] for k in state), sum(measure[k] for k in state)),
             "activations": (plan["activations"], measure["activations"])}
    return {k: (p / 2**20, m / 2**20, p / m) for k, (p, m) in pairs.items()}


def measure_all(checks: list[Check]) -> list[dict[str, float]]:
    """`measured` of each check, two subprocesses at a time (each peaks near 2 GiB; memory does not
    depend on speed, so a busy machine changes nothing but the time)."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(measured, checks))


def run_checks(checks: list[Check]) -> list[tuple[Check, dict]]:
    """Each check planned and measured."""
    measurements = measure_all(checks)
    return [(c, compare(planned(c), m)) for c, m in zip(checks, measurements)]


def table(results: list[tuple[Check, dict]]) -> str:
    lines = [f"{'configuration':<4} {'what':<12} {'plan MiB':>9} {'measured':>9} {'ratio':>6}"]
    for check, rows in results:
        for what, (p, m, r) in rows.items():
            lines.append(f"{check.name[0]:<4} {what:<12} {p:9.1f} {m:9.1f} {r:6.2f}"
                         + ("" if abs(r - 1) <= TOLERANCE else "  OUTSIDE"))
    return "\n".join(lines + [check.name for check, _ in results])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Check(**json.loads(args.measure)))))
        return 0
    results = run_checks(CHECKS)
    print(table(results))
    return 0 if all(abs(r - 1) <= TOLERANCE for _, rows in results for *_, r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
