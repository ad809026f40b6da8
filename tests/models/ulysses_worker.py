"""One process of the sequence-parallel tests (tests/models/test_ulysses.py), under torchrun or
alone: log-probs of a packed mixed-modality batch (one response with a tool turn: a clip
mid-sequence, outside the loss), then 3 SGD steps on its token-mean loss.

    python ulysses_worker.py FAMILY MODEL_DIR OUT.pt SP_SIZE [DP_SIZE] [text]

FAMILY, MODEL_DIR and OUT.pt may be comma-separated lists of one length: the models run one after
the other in the same processes (a second family costs no launch of its own).
World = DP_SIZE x SP_SIZE (1 x 1: one process, no group, plain packed attention). The global
batch (4 sequences) is split over the data-parallel ranks as the trainer splits prompts; the
ranks of a sequence-parallel group hold the same sequences. Rank 0 writes the first pass's
log-probs / entropies of its sequences, the parameters after the steps, and what its attention
calls would ask of a CUDA kernel (attention_recorder.py), to OUT.pt.
`text`: text prompts only (the row's vision input is then the two masked dummies: fewer vision
units than ranks when SP_SIZE > 2, so some ranks encode an empty share).
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
from attention_recorder import AttentionRecorder  # noqa: E402
from model_media import make_image, make_sample, make_video  # noqa: E402

from easyvideor1 import distributed  # noqa: E402
from easyvideor1.algorithms.aggregation import loss_normalizer  # noqa: E402
from easyvideor1.models.collate import collate  # noqa: E402
from easyvideor1.models.families import get_family  # noqa: E402
from easyvideor1.models.inputs import append_response, build_inputs  # noqa: E402
from easyvideor1.models.loading import load_policy, load_processor  # noqa: E402
from easyvideor1.models.logprobs import sequence_logprobs  # noqa: E402
from easyvideor1.models.mrope import mrope_spec  # noqa: E402
from easyvideor1.models.packing import use_packed_attention  # noqa: E402
from easyvideor1.models.ulysses import SequenceParallel, use_ulysses_attention  # noqa: E402
from easyvideor1.rollout.tools.protocol import ToolOutput  # noqa: E402
from easyvideor1.rollout.tools.turns import encode_tool_turn, sequence_with_turns, tool_turn_text  # noqa: E402
from easyvideor1.training.fsdp import full_state_dict, init_distributed, run_root_once, shard  # noqa: E402
from easyvideor1.training.loader import rank_slice  # noqa: E402


def with_tool_turn(prompt, answer: str, processor, family, spec):
    """`prompt` + a multi-turn response as the tool loop builds it: a crop_video call, the tool
    turn (a 2-frame clip and its text, tokenised alone), then `answer`; the tool turn is attended
    to but outside the loss."""
    tok = processor.tokenizer
    call = tok('<tool_call>{"name": "crop_video", "arguments": {"start": 0, "end": 1}}</tool_call><|im_end|>')
    outputs = [ToolOutput("frames at t = 0.0, 0.5 s", [make_video(family, frames=2, seed=7)])]
    turn, media = encode_tool_turn(tool_turn_text(outputs, closed=True), outputs, processor, prompt.sample_id, spec)
    last = tok(answer + "<|im_end|>")["input_ids"]
    model_tokens = [True] * len(call["input_ids"]) + [False] * len(turn) + [True] * len(last)
    return sequence_with_turns(prompt, call["input_ids"] + turn.tolist() + last, model_tokens, media, family, spec)


def sequences(family, processor, spec, text_only: bool = False):
    video, image = make_video(family, frames=4), make_image(family)
    video2 = make_video(family, frames=2, rows=1, cols=2, seed=3)
    cases = {"video": [video], "text": [], "image": [image], "video+image": [video2, image]}
    if text_only:
        cases = {f"text{i}": [] for i in range(4)}
    tok = processor.tokenizer
    answers = ["It is red.", "45.", "Two squares moving left.", "A"]  # an odd row: a pad block under SP 2
    out = []
    for (name, frames), answer in zip(cases.items(), answers):
        prompt = build_inputs(make_sample(name, frames), frames, "What is shown?", processor, family, spec)
        if name == "text":  # its only video comes back from a tool, mid-sequence
            out.append(with_tool_turn(prompt, answer, processor, family, spec))
        else:
            out.append(append_response(prompt, tok(answer + "<|im_end|>")["input_ids"], spec))
    return out


def main():
    families, model_dirs, out_paths = (sys.argv[k].split(",") for k in (1, 2, 3))
    sp_size = int(sys.argv[4])
    dp_size = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    text_only = len(sys.argv) > 6 and sys.argv[6] == "text"
    rank, world, device = init_distributed()
    assert world == dp_size * sp_size, (world, dp_size, sp_size)
    assert len(families) == len(model_dirs) == len(out_paths), sys.argv[1:4]
    group = distributed.new_subgroups(sp_size) if sp_size > 1 else None
    for family_name, model_dir, out_path in zip(families, model_dirs, out_paths):
        run(family_name, model_dir, out_path, rank, world, device, group, sp_size, dp_size, text_only)
    distributed.close()


def run(family_name, model_dir, out_path, rank, world, device, group, sp_size, dp_size, text_only):
    torch.manual_seed(0)
    family = get_family(family_name)
    model = load_policy(model_dir, dtype="float32")
    processor = load_processor(model_dir)
    spec = mrope_spec(model.config)
    sp = None
    if sp_size > 1:
        sp = SequenceParallel(group, rank % sp_size, sp_size, processor.tokenizer.pad_token_id)
        use_ulysses_attention(model)
    else:
        use_packed_attention(model)
    shard(model, vision_unit=sp is not None)
    if world > 1:
        run_root_once(model, device)
    seqs = rank_slice(sequences(family, processor, spec, text_only), rank // sp_size, dp_size)
    batch = collate(seqs, family, spec, processor.tokenizer.pad_token_id, padding_free=True)
    # Plain SGD: a gradient off by a constant factor (Adam would hide it) moves the parameters otherwise.
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    first = None
    recorder = AttentionRecorder().__enter__()
    for _ in range(3):
        out = sequence_logprobs(model, batch, chunk_size=16, with_entropy=True, sp=sp)
        if first is None:
            first = {"logprobs": out.logprobs.detach(), "entropy": out.entropy.detach(), "mask": out.mask,
                     "spans": batch.seq_spans, "length": batch.input_ids.shape[1]}
        normalizer = loss_normalizer([out.mask], "token_mean", all_reduce=distributed.is_distributed())
        loss = -(out.logprobs * out.mask).sum() / normalizer + 0.1 * (out.entropy * out.mask).sum() / normalizer
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    recorder.__exit__(None, None, None)
    attention = {"problems": recorder.problems(batch.input_ids.shape[1]),
                 "gqa_calls": sum(c.q_heads != c.kv_heads for c in recorder.calls)}
    params = full_state_dict(model) if world > 1 else {k: v.detach().clone() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save({"first": first, "params": params, "attention": attention}, out_path)


if __name__ == "__main__":
    main()
