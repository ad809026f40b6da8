"""Rollout split over a sequence-parallel group (`training.sequence_parallel.split_rollouts`),
under torchrun with 2 processes (SP = 2, gloo) and the HF engine on a tiny model: each rank
generates its share, counted by a wrapper around the real engine, and the gathered groups are
compared with one engine call over every prompt. A test helper, run as a script:

    split_rollout_worker.py MODEL_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

from easyvideor1 import distributed
from easyvideor1.models.families import family_of
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.models.ulysses import SequenceParallel
from easyvideor1.prompts import Prompt
from easyvideor1.records import Sample
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.training.fsdp import init_distributed
from easyvideor1.training.sequence_parallel import split_rollouts

QUESTIONS = ["What is two plus two?", "Name a colour.", "Count to three."]
N = 4  # responses per prompt: 12 in all, 6 per rank, prompt 1's split between the ranks


def main(model_dir: str, out: str) -> None:
    rank, world, _ = init_distributed()
    model = load_policy(model_dir, "float32").eval()
    processor = load_processor(model_dir)
    family, spec = family_of(model.config), mrope_spec(model.config)
    engine = HFEngine(model, processor, family, spec)
    prompts = []
    for g, q in enumerate(QUESTIONS):
        sample = Sample(q, "a", "free-form", "text", problem_id=f"p{g}")
        prompts.append(Prompt(sample, [], build_inputs(sample, [], q, processor, family, spec), seed_offset=g * N))
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=1234)
    sp = SequenceParallel(distributed.new_subgroups(world), rank, world, processor.tokenizer.pad_token_id)
    generated = []

    def counting(ps, counts, p):
        generated.append(sum(counts))
        return engine.generate(ps, counts, p)

    split = split_rollouts(sp, prompts, [N] * len(prompts), params, counting)
    whole = engine.generate(prompts, N, params)  # every rank, lockstep: the one-process answer

    def rows(groups):
        return [[(r.prompt_index, r.token_ids) for r in grp] for grp in groups]

    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(
        {"generated": generated, "split": rows(split), "whole": rows(whole)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
