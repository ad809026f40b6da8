"""The tool loop under torchrun (2 processes, FSDP2), tool use unequal across ranks: rank 0's
response calls crop_video (a model taught to), rank 1's engine runs no tool (`max_turns` 1). Both
take the same collectives: the ranks decode in lockstep while rank 0 alone has turns left, then
score their responses and take one update. Writes each rank's outcome. A test helper, run as a
script:

    tools_worker.py MODEL_DIR CLIP OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
from tool_helpers import tool_prompt, vision_of

from easyvideor1 import distributed
from easyvideor1.algorithms import AlgorithmConfig
from easyvideor1.models.families import family_of
from easyvideor1.models.loading import load_policy, load_processor
from easyvideor1.models.mrope import mrope_spec
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.rollout.tools.multiturn import ToolEngine, ToolLimits, tool_metrics
from easyvideor1.rollout.tools.registry import TOOLS
from easyvideor1.rollout.tools.video_tools import ClipSource
from easyvideor1.training.fsdp import init_distributed, shard
from easyvideor1.training.sequences import ForwardContext, all_logprobs, make_batch
from easyvideor1.training.update import policy_update


class _Loaded:
    def __init__(self, model_dir):
        self.model = load_policy(model_dir, "float32")
        self.processor = load_processor(model_dir)
        self.family, self.spec = family_of(self.model.config), mrope_spec(self.model.config)


def main(model_dir: str, clip: str, out: str) -> None:
    rank, world, _ = init_distributed()
    tiny = _Loaded(model_dir)
    shard(tiny.model)
    engine = HFEngine(tiny.model, tiny.processor, tiny.family, tiny.spec)
    limits = ToolLimits(max_turns=3 if rank == 0 else 1, call_visual_tokens=64, response_visual_tokens=256)
    tools = ToolEngine(engine, tiny.processor, tiny.family, tiny.spec, TOOLS, ClipSource(vision_of(tiny.family.name)),
                       limits)
    prompt = tool_prompt(tiny, Path(clip), tools=("crop_video",))
    groups = tools.generate([prompt], 1, SamplingParams(temperature=0, max_tokens=400))
    metrics = tool_metrics(groups)  # a collective: summed over both ranks
    batch = make_batch([prompt], groups)
    ctx = ForwardContext(tiny.family, tiny.spec, tiny.processor.tokenizer.pad_token_id, micro_batch_size=1,
                         temperature=1.0, banned_ids=tuple(engine.banned))
    trainer = all_logprobs(tiny.model, batch, ctx)
    mask = batch.response_mask
    gap = float((trainer[mask] - batch.behaviour_log_probs[mask]).abs().max())
    batch.advantages = mask.float()
    update = policy_update(tiny.model, torch.optim.SGD(tiny.model.parameters(), lr=0.1), batch,
                           AlgorithmConfig(disable_kl=True), ctx, ppo_epochs=1, n_mini=1, grad_clip=1e9, max_len=400,
                           kl_coef=0.0)
    (r,) = groups[0]
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({
        "calls": len(r.tool_calls), "turns": len(r.turn_texts), "finish": r.finish_reason, "gap": gap,
        "tool_tokens": len(r.token_ids) - int(mask.sum()), "metrics": metrics,
        "grad_norm": update["update/grad_norm"]}))
    distributed.close()  # every rank, after the last collective


if __name__ == "__main__":
    main(*sys.argv[1:4])
