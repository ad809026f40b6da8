"""Peak memory of `easyvideor1 train` does not grow with the square of the prompt (issue 26).

One step (HF-engine rollout, old log-probs, update; defaults otherwise) of the tiny Qwen2.5-VL
(GQA) on one text prompt of 16,000 tokens, 4 responses of at most 16 tokens, must peak at most
0.5 GiB above the same command on a 500-token prompt. A 16k x 16k float mask is 0.95 GiB (a
bool one 0.24 GiB): a float attention mask of [L, L], in the rollout's prefill or in training,
shows. Measured on 456b7de: 7.17 GiB at 24k against 0.58 GiB at 500 tokens (about 3 GiB more at
16k); on 2c9886d: 0.60 GiB at 16k against 0.53 GiB (24k took 2 minutes of the suite, 16k 45 s).

The peak is the maximum resident set of the command's process tree (getrusage of a wrapper's
children), so the pytest process's own memory does not count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from transformers import AutoTokenizer

from easyvideor1.models.tiny import build_tiny_model

WORDS = "red green blue square moves left right up down frame the a of and".split()
PEAK = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")  # KiB on Linux


def _data(root, tokenizer, tokens: int):
    ids = tokenizer(" ".join(WORDS[(i * 7) % len(WORDS)] for i in range(tokens)))["input_ids"][:tokens]
    record = {"problem_id": f"long{tokens}", "problem": tokenizer.decode(ids), "answer": "4",
              "problem_type": "numerical", "data_type": "text"}
    path = root / f"data{tokens}.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def _peak_gib(root, model, tokens: int, tokenizer) -> float:
    data = _data(root, tokenizer, tokens)
    cmd = [sys.executable, "-m", "easyvideor1.cli", "train", f"model.path={model}", f"data.train_files={data}",
           f"logging.out_dir={root / f'out{tokens}'}", "data.max_prompt_tokens=30000", "rollout.n=4",
           "rollout.max_tokens=16", "training.micro_batch_size=4", "training.steps=1",
           "training.rollout_batch_size=1", "training.mini_batch_size=1", "checkpoint.every=0",
           "logging.progress=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return int(proc.stdout.strip().splitlines()[-1]) / 2**20


def test_a_16k_token_prompt_costs_no_square_memory(tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    short = _peak_gib(tmp_path, model, 500, tokenizer)
    long = _peak_gib(tmp_path, model, 16_000, tokenizer)
    assert long <= short + 0.5, f"peak {long:.2f} GiB at 16,000 tokens vs {short:.2f} GiB at 500"
