"""Count the collectives of log-prob passes under FSDP2 (torchrun, 2 CPU processes, gloo): the
policy's grad pass (forward + backward), a no-grad pass, and a grad pass with the exact KL to a
sharded reference, each once with one head chunk and once with many. Also records the dtype of
every all-gather of a weight sync (`models.lora.merged_state_items`) in the rollout dtype, and
each rank's balanced slots of the samples in SAMPLES_JSONL when the ranks read the media
differently: sample 0's video is unreadable on rank 1 only (a transient read error, or another
decoder on another node). Writes `<out>/counts-rank<r>.json`. A test helper, run as a script:

    collectives_worker.py MODEL_DIR SAMPLES_JSONL OUT_DIR
"""

import json
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from easyvideor1 import distributed
from easyvideor1.models.families import family_of
from easyvideor1.models.inputs import build_inputs
from easyvideor1.models.loading import load_policy, load_processor, load_reference
from easyvideor1.models.lora import merged_state_items
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.prompts import Prompt
from easyvideor1.records import Rollout, Sample
from easyvideor1.training.fsdp import init_distributed, run_root_once, shard
from easyvideor1.training.rank_balance import rank_slots
from easyvideor1.training.sequences import ForwardContext, forward_logprobs, make_batch
from easyvideor1.vision.config import VisionConfig

QUESTIONS = ["What is two plus two, written as a word?", "Name a colour."]
RESPONSE_TOKENS = 24  # per response: 48 scored tokens, 12 chunks of 4
VISION = VisionConfig(family="qwen2_5_vl", max_frames=8, video_min_pixels=3136, video_max_pixels=12544)
BROKEN = {1: 0}  # rank -> the sample whose video that rank cannot read


def _kind(op) -> str | None:
    name = str(op)
    if "allgather" in name or "all_gather" in name:
        return "all_gather"
    if "reduce_scatter" in name:
        return "reduce_scatter"
    if "allreduce" in name or "all_reduce" in name:
        return "all_reduce"
    return None


class Collectives(TorchDispatchMode):
    """Counts the collective ops dispatched inside the block, by kind, and the dtypes each
    all-gather receives (FSDP2's and DTensor's collectives all pass the dispatcher)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()
        self.gather_dtypes: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = _kind(func)
        if kind is not None:
            self.counts[kind] += 1
            if kind == "all_gather":
                flat = [a for a in args if torch.is_tensor(a)] + [t for a in args if isinstance(a, (list, tuple))
                                                                   for t in a if torch.is_tensor(t)]
                self.gather_dtypes |= {str(t.dtype) for t in flat}
        return func(*args, **(kwargs or {}))


def counted(fn) -> dict[str, int]:
    """Collectives `fn()` issues, by kind."""
    with Collectives() as mode:
        fn()
    return dict(mode.counts)


def balanced_slots_of(samples_path: str, rank: int, world: int, out: str) -> list[int]:
    rows = [json.loads(line) for line in Path(samples_path).read_text().splitlines()]
    samples = [Sample(problem=r["problem"], answer=r["answer"], problem_type=r["problem_type"],
                      videos=list(r.get("videos", [])), problem_id=r["problem_id"]) for r in rows]
    if rank in BROKEN:
        samples[BROKEN[rank]].videos = [str(Path(out) / "missing.mp4")]
    return rank_slots(samples, rank, world, VISION)


def main(model_dir: str, samples_path: str, out: str) -> None:
    rank, world, device = init_distributed()
    slots = balanced_slots_of(samples_path, rank, world, out)
    model = load_policy(model_dir, "float32")
    reference = load_reference(model_dir, "bfloat16")
    processor = load_processor(model_dir)
    family, spec = family_of(model.config), mrope_spec(model.config)
    shard(model, param_dtype=torch.bfloat16)
    shard(reference)
    for m in (model, reference):
        run_root_once(m, device)
    special = set(processor.tokenizer.all_special_ids)
    vocab = [i for i in range(len(processor.tokenizer)) if i not in special]
    prompts, groups = [], []
    for g, q in enumerate(QUESTIONS):
        sample = Sample(q, "a", "free-form", "text", problem_id=f"q{g}")
        prompts.append(Prompt(sample, [], build_inputs(sample, [], q, processor, family, spec)))
        gen = torch.Generator().manual_seed(g)
        groups.append([Rollout(g, [vocab[int(j)] for j in torch.randint(0, len(vocab), (RESPONSE_TOKENS,),
                                                                         generator=gen)], "")])
    batch = make_batch(prompts, groups)
    idx = list(range(batch.size))
    counts = {}
    for chunks, size in (("warm-up", 4096), ("one", 4096), ("many", 4)):  # the first backward gathers 2 more
        ctx = ForwardContext(family, spec, processor.tokenizer.pad_token_id, micro_batch_size=4, temperature=1.0,
                             chunk_size=size)

        def grad_pass(ref=None):
            logp, _, kl = forward_logprobs(model, batch, idx, ctx, reference=ref)
            (logp.sum() + (kl.sum() if kl is not None else 0.0)).backward()

        def no_grad_pass():
            with torch.no_grad():
                forward_logprobs(model, batch, idx, ctx)

        counts[chunks] = {"grad": counted(grad_pass), "no_grad": counted(no_grad_pass),
                          "grad_full_kl": counted(lambda: grad_pass(reference))}
    counts.pop("warm-up")
    model.zero_grad(set_to_none=True)
    with Collectives() as sync:
        items = {name: t.dtype for name, t in merged_state_items(model, dtype=torch.bfloat16)}
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"counts-rank{rank}.json").write_text(json.dumps(
        {"counts": counts, "sync_gather_dtypes": sorted(sync.gather_dtypes),
         "sync_item_dtypes": sorted({str(d) for d in items.values()}), "slots": slots}))
    distributed.waiting_group(1)  # a second group for close to leave
    joined = len(distributed._JOINED)
    distributed.close()  # every rank, after the last collective
    (Path(out) / f"close-rank{rank}.json").write_text(json.dumps(
        {"joined": joined, "kept": [[work.is_completed(), done.device.type] for work, done in distributed._KEPT]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
