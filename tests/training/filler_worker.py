"""One `policy_update` over 4 fixed text responses, split unevenly over the ranks: under torchrun
(2 processes, FSDP2) rank 0 holds 3, rank 1 holds 1; in one process, all 4. Writes the updated
parameters before and after (rank 0) and each rank's micro-batch plan. A test helper, run as a script:

    filler_worker.py MODEL_DIR OUT_DIR MICRO_BATCH_TOKENS
"""

import json
import sys
from pathlib import Path

import torch

from easyvideor1 import distributed
from easyvideor1.algorithms import AlgorithmConfig
from easyvideor1.models.families import family_of
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout, Sample
from easyvideor1.training.fsdp import full_state_dict, init_distributed, shard
from easyvideor1.training.sequences import ForwardContext, make_batch, pass_micro_batches
from easyvideor1.training.update import policy_update

QUESTIONS = ["What is two plus two, written as a word?", "Name a colour.", "Count to three.", "Say yes."]
SHARES = {1: [[0, 1, 2, 3]], 2: [[0, 1, 2], [3]]}  # response k's global index, per rank


def main(model_dir: str, out: str, tokens: int) -> None:
    rank, world, _ = init_distributed()
    model = load_policy(model_dir, "float32")
    processor = load_processor(model_dir)
    family, spec = family_of(model.config), mrope_spec(model.config)
    shard(model)
    mine = SHARES[world][rank]
    prompts, groups = [], []
    special = set(processor.tokenizer.all_special_ids)
    vocab = [i for i in range(len(processor.tokenizer)) if i not in special]
    for g, k in enumerate(mine):
        sample = Sample(QUESTIONS[k], "a", "free-form", "text", problem_id=f"q{k}")
        prompts.append(Prompt(sample, [], build_inputs(sample, [], QUESTIONS[k], processor, family, spec)))
        gen = torch.Generator().manual_seed(k)  # response k is the same whichever rank holds it
        ids = [vocab[int(j)] for j in torch.randint(0, len(vocab), (4 + 3 * k,), generator=gen)]
        groups.append([Rollout(g, ids, "")])
    batch = make_batch(prompts, groups)
    batch.advantages = torch.tensor([[1.0], [-0.5], [0.8], [-1.2]])[mine].expand(batch.response_mask.shape).clone()
    batch.advantages *= batch.response_mask
    ctx = ForwardContext(family, spec, processor.tokenizer.pad_token_id, micro_batch_size=4, temperature=1.0,
                         micro_batch_tokens=tokens)
    plan = pass_micro_batches(batch, list(range(batch.size)), ctx)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"plan-rank{rank}.json").write_text(json.dumps(
        {"micro_batches": len(plan), "fillers": sum(m.filler for m in plan)}))
    initial = {k: v.clone() for k, v in full_state_dict(model).items()}  # a collective: every rank
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    metrics = policy_update(model, optimizer, batch, AlgorithmConfig(disable_kl=True), ctx, ppo_epochs=1, n_mini=1,
                            grad_clip=1e9, max_len=16, kl_coef=0.0)
    state = full_state_dict(model)  # a collective: every rank
    if rank == 0:
        torch.save(state, Path(out) / "params.pt")
        torch.save(initial, Path(out) / "initial.pt")
        (Path(out) / "metrics.json").write_text(json.dumps(metrics))
    distributed.close()  # every rank, after the last collective (else an abort at exit, now and then)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
