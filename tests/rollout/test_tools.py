"""The video tools and the multi-turn loop on tiny real models and a real clip: calls parsed
and run (bad ones become error turns), clips from the prompt's frames or decoded once, tool
turns rendered as the chat template renders them, and the trainer's log-probs of a multi-turn
response (a clip mid-sequence) equal to the engine's, with every tool token outside the loss, in
padded and padding-free rows alike (the same loss and gradients)."""

from __future__ import annotations

import copy

import pytest
import torch
from rollout_helpers import load_tiny
from step_gradients import one_step_gradients, record_step_gradients
from tool_helpers import CALL, taught, tool_prompt, vision_of, write_clip

from easyvideor1.algorithms.config import AlgorithmConfig
from easyvideor1.models.families import get_family
from easyvideor1.models.packing import use_packed_attention
from easyvideor1.records import Rollout
from easyvideor1.rollout.base import SamplingParams
from easyvideor1.rollout.hf_engine import HFEngine
from easyvideor1.rollout.tools.multiturn import ToolEngine, ToolLimits, tool_metrics
from easyvideor1.rollout.tools.protocol import ToolContext, ToolOutput
from easyvideor1.rollout.tools.registry import TOOLS, parse_tool_calls, run_call
from easyvideor1.rollout.tools.turns import tool_turn_text
from easyvideor1.rollout.tools.video_tools import ClipSource
from easyvideor1.training.sequences import ForwardContext, all_logprobs, collate_responses, make_batch
from easyvideor1.training.update import policy_update
from easyvideor1.vision.cache import FrameSource
import forkserver  # noqa: E402  (the subprocesses start with torch & co. imported)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return write_clip(tmp_path_factory.mktemp("tools") / "clip.mp4")


@pytest.fixture(scope="module")
def callers(hf_tiny_dirs, clip):
    """family -> (tiny, its crop_video prompt, a copy taught to answer it with CALL), made once."""
    made = {}

    def get(family):
        if family not in made:
            tiny = load_tiny(family, hf_tiny_dirs[family])
            prompt = tool_prompt(tiny, clip, tools=("crop_video",))
            made[family] = tiny, prompt, taught(tiny, prompt, CALL)
        return made[family]

    return get


def test_parse_tool_calls():
    calls = parse_tool_calls(f'look {CALL} and <tool_call>{{"name": "zoom_frame", "arguments": "{{\\"time\\": 1}}"}}'
                             '</tool_call> <tool_call>{"name": 3}</tool_call><tool_call>{bad</tool_call><tool_call>{')
    assert [(c.name, c.arguments) for c in calls[:2]] == [("crop_video", {"start": 1.0, "end": 2.5}),
                                                           ("zoom_frame", {"time": 1})]
    assert [c.error.split(" (")[0].split(":")[0] for c in calls[2:]] == ["malformed tool call"] * 3
    assert "without </tool_call>" in calls[-1].error
    assert parse_tool_calls("<answer>A</answer>") == []


def _context(clip, family="qwen2_5_vl", budget=64):
    vision = vision_of(family)
    frames = FrameSource(vision, mode="realtime").video(str(clip))
    from easyvideor1.records import Sample
    sample = Sample("q", "a", "free-form", "video", videos=[str(clip)], problem_id="clip")
    return ToolContext(sample, [frames], ClipSource(vision), get_family(family), budget)


@pytest.mark.parametrize("text, error", [
    ('{"name": "crop", "arguments": {}}', "unknown tool 'crop'; available: crop_video, zoom_frame"),
    ('{"name": "crop_video", "arguments": {"start": 1}}', "crop_video needs end"),
    ('{"name": "crop_video", "arguments": {"start": 1, "end": 2, "speed": 3}}', "crop_video has no argument speed"),
    ('{"name": "crop_video", "arguments": {"start": "1", "end": 2}}', "start must be a number"),
    ('{"name": "crop_video", "arguments": {"start": 1, "end": 9}}', "end=9 is outside the video (0 to 4 s)"),
    ('{"name": "crop_video", "arguments": {"start": 2, "end": 1}}', "start (2) must be before end (1)"),
    ('{"name": "zoom_frame", "arguments": {"time": 1, "box": [0.5, 0, 0.2, 1]}}', "box must be [x1, y1, x2, y2]"),
    ('{"name": "zoom_frame", "arguments": {"time": 1, "box": [0, 0, 1]}}', "box must have 4 items"),
    ('{"name": "crop_video", "arguments": [1, 2]}', "malformed tool call: arguments must be a JSON object"),
    ("{not json}", "malformed tool call (not JSON"),
])
def test_bad_calls_become_error_turns(clip, text, error):
    (call,) = parse_tool_calls(f"<tool_call>{text}</tool_call>")
    output, record = run_call(call, TOOLS, _context(clip))
    assert record.error.startswith(error) and output.text == f"Error: {record.error}"
    assert output.media == [] and record.visual_tokens == 0


def test_over_budget_is_an_error(clip):
    (call,) = parse_tool_calls(CALL)
    output, record = run_call(call, TOOLS, _context(clip, budget=3))  # a clip patch takes 4 tokens
    assert record.error == "over budget: a clip needs at least 4 visual tokens, 3 are left"


def test_crop_video_decodes_once_and_reads_the_prompt_frames(clip):
    ctx = _context(clip)
    (call,) = parse_tool_calls(CALL)
    out, record = run_call(call, TOOLS, ctx)
    (frames,) = out.media
    times = [i / frames.metadata.fps for i in frames.metadata.frames_indices]
    assert len(times) == 12 and 1.0 <= times[0] < times[-1] <= 2.5  # 13 source frames, whole patches
    assert record.visual_tokens == 24 and f"t = {times[0]:.2f}" in out.text  # 6 patches x 2 x 2 cells
    assert tuple(frames.pixels.shape[2:]) == tuple(ctx.frames[0].pixels.shape[2:])
    run_call(call, TOOLS, ctx)
    assert (ctx.clips.decoded, ctx.clips.reused) == (1, 1)  # the group's second call reuses the clip
    # the prompt's frames (t = 0, 1.25, 2.625, 3.875 s) already hold 2 frames of [0, 3] s: no decode
    (slow,) = parse_tool_calls('<tool_call>{"name": "crop_video", "arguments": {"start": 0, "end": 3, "fps": 0.5}}'
                               '</tool_call>')
    out, _ = run_call(slow, TOOLS, ctx)
    assert ctx.clips.decoded == 1 and ctx.clips.from_prompt == 1
    assert torch.equal(out.media[0].pixels, ctx.frames[0].pixels[[0, 2]])


def test_zoom_frame_returns_the_region_at_more_pixels(clip):
    ctx = _context(clip, budget=16)
    (call,) = parse_tool_calls('<tool_call>{"name": "zoom_frame", "arguments": {"time": 1.0, "box": '
                               '[0.25, 0.25, 0.5, 0.5]}}</tool_call>')
    out, record = run_call(call, TOOLS, ctx)
    (image,) = out.media
    assert image.metadata is None and record.visual_tokens == 16  # 4 x 4 cells from a 16 x 16 px region
    assert image.pixels[0, 2].float().mean() > 150  # the blue square fills the region


def test_tool_turn_is_what_the_chat_template_writes(hf_tiny_dirs):
    tiny = load_tiny("qwen2_5_vl", hf_tiny_dirs["qwen2_5_vl"])
    from easyvideor1.records import Frames, VideoMetadata
    clip = Frames(torch.zeros(2, 3, 56, 56, dtype=torch.uint8), VideoMetadata(2.0, 4, [0, 1], 56, 56, 2.0))
    outputs = [ToolOutput("two frames", [clip]), ToolOutput("Error: bad")]
    user = {"role": "user", "content": [{"type": "text", "text": "q"}]}
    head = tiny.processor.apply_chat_template([user, {"role": "assistant", "content": CALL}], tokenize=False)
    full = tiny.processor.apply_chat_template(
        [user, {"role": "assistant", "content": CALL}, {"role": "tool", "content": [{"type": "video"},
         {"type": "text", "text": "two frames"}]}, {"role": "tool", "content": "Error: bad"}],
        tokenize=False, add_generation_prompt=True)
    cut = head.rindex("<|im_end|>") + len("<|im_end|>")
    assert full == head[:cut] + tool_turn_text(outputs, closed=True)
    assert tool_turn_text(outputs, closed=False).startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_multiturn_logprobs_match_the_trainer(callers, clip, family):
    """A model taught to call crop_video: its first turn calls it, a clip comes back mid-sequence,
    and it goes on (up to 3 turns; later, malformed calls get error turns), batched with a
    plain response. The trainer's log-probs of the
    model's tokens equal the engine's; no tool token (text or video) is in the loss mask. Each
    model token records the engine's weight version (separate placement), each tool token -1."""
    tiny, prompt, model = callers(family)
    engine = HFEngine(model, tiny.processor, tiny.family, tiny.spec)
    tools = ToolEngine(engine, tiny.processor, tiny.family, tiny.spec, TOOLS, ClipSource(vision_of(family)),
                       ToolLimits(max_turns=3, call_visual_tokens=64, response_visual_tokens=256))
    params = SamplingParams(temperature=0, max_tokens=400)
    engine.version = 3  # separate placement's weights version: each model token records it, tool tokens -1
    (group,) = tools.generate([prompt], 1, params)
    (multi,) = group
    assert multi.versions == [3 if m else -1 for m in multi.model_mask]
    assert len(multi.turn_texts) >= 2 and multi.tool_calls[0].error is None and multi.media is not None
    assert multi.turn_texts[0] == CALL and multi.tool_calls[0].visual_tokens > 0
    text_prompt = tool_prompt(tiny, clip, "plain", tools=())  # no tools listed: it answers in one turn
    plain = engine.generate([text_prompt], 1, SamplingParams(temperature=0, max_tokens=12))[0]
    batch = make_batch([prompt, text_prompt], [group, plain])
    ctx = ForwardContext(tiny.family, tiny.spec, tiny.processor.tokenizer.pad_token_id, micro_batch_size=2,
                         temperature=1.0, shared_prefix=True, banned_ids=tuple(engine.banned))
    trainer = all_logprobs(model, batch, ctx)
    behaviour = batch.behaviour_log_probs
    mask = batch.response_mask
    assert int(mask[0].sum()) == sum(multi.model_mask) < len(multi.token_ids)
    assert torch.allclose(trainer[mask], behaviour[mask], atol=2e-4), (trainer[mask] - behaviour[mask]).abs().max()
    # the loss mask of the collated batch: the model's tokens only
    mb = collate_responses(batch, [0, 1], ctx)
    start, end = mb.seq_spans[0][1], mb.seq_spans[0][2]
    ids, loss = mb.input_ids[0, start:end], mb.loss_mask[0, start:end]
    response = torch.tensor(multi.token_ids)
    assert torch.equal(ids[prompt.inputs.prompt_len:], response)
    assert torch.equal(loss[prompt.inputs.prompt_len:], torch.tensor(multi.model_mask))
    assert not loss[(ids == tiny.spec.video_token_id)].any() and int((ids == tiny.spec.video_token_id).sum()) > 0
    metrics = tool_metrics([group, plain])
    assert metrics["tools/calls_per_response"] == len(multi.tool_calls) / 2
    assert metrics["tools/errors"] == sum(c.error is not None for c in multi.tool_calls)
    assert metrics["tools/visual_tokens"] == multi.tool_calls[0].visual_tokens / 2


def test_each_prompt_lists_the_tools_its_sample_is_offered(hf_tiny_dirs, clip):
    """Record field `tools` in a run with crop_video and zoom_frame: `[]` gives the prompt of a run
    without tools, token for token; no field lists both (as before); `["zoom_frame", "magnify"]`
    lists zoom_frame alone (a name the run does not turn on is ignored)."""
    tiny = load_tiny("qwen2_5_vl", hf_tiny_dirs["qwen2_5_vl"])
    run = ("crop_video", "zoom_frame")
    plain, none = tool_prompt(tiny, clip, tools=()), tool_prompt(tiny, clip, tools=run, sample_tools=[])
    assert torch.equal(none.inputs.input_ids, plain.inputs.input_ids) and "<tools>" not in none.inputs.prompt_text
    every = tool_prompt(tiny, clip, tools=run).inputs.prompt_text
    assert '"name": "crop_video"' in every and '"name": "zoom_frame"' in every
    zoom = tool_prompt(tiny, clip, tools=run, sample_tools=["zoom_frame", "magnify"])
    assert torch.equal(zoom.inputs.input_ids, tool_prompt(tiny, clip, tools=("zoom_frame",)).inputs.input_ids)
    assert '"name": "zoom_frame"' in zoom.inputs.prompt_text and "crop_video" not in zoom.inputs.prompt_text


def test_each_prompt_calls_only_the_tools_its_sample_is_offered(hf_tiny_dirs, clip):
    """One batch, a model taught to call crop_video on both prompts: the sample offered no tool
    ends after its one turn (its call is text: no tool turn, nothing counted); the sample offered
    zoom_frame alone gets an error turn for its crop_video call, counted in tools/errors."""
    tiny = load_tiny("qwen2_5_vl", hf_tiny_dirs["qwen2_5_vl"])
    none = tool_prompt(tiny, clip, "none", sample_tools=[])
    zoom = tool_prompt(tiny, clip, "zoom", sample_tools=["zoom_frame"])
    model = taught(tiny, [none, zoom], CALL)
    tools = ToolEngine(HFEngine(model, tiny.processor, tiny.family, tiny.spec), tiny.processor, tiny.family,
                       tiny.spec, TOOLS, ClipSource(vision_of("qwen2_5_vl")), ToolLimits(max_turns=2))
    (plain,), (refused,) = tools.generate([none, zoom], 1, SamplingParams(temperature=0, max_tokens=200))
    assert plain.text == plain.turn_texts[0] == CALL and plain.finish_reason == "stop"
    assert plain.tool_calls == [] and plain.model_mask is None and plain.media is None
    assert refused.turn_texts[0] == CALL and len(refused.turn_texts) == 2
    assert refused.media.pixel_values_videos is None  # no clip came back
    assert refused.tool_calls[0].error == "tool 'crop_video' is not offered to this sample; available: zoom_frame"
    metrics = tool_metrics([[plain], [refused]])
    assert metrics["tools/errors"] == sum(c.error is not None for c in refused.tool_calls) >= 1
    assert metrics["tools/calls_per_response"] == len(refused.tool_calls) / 2


def test_replay_follows_what_the_sample_is_offered(hf_tiny_dirs, clip, caplog):
    """Hybrid groups: a sample offered no tool keeps its offline trajectory as one-turn text; a
    trajectory that calls a tool its sample is not offered gets an error turn, as any bad call,
    and a warning naming the sample."""
    tiny = load_tiny("qwen2_5_vl", hf_tiny_dirs["qwen2_5_vl"])
    tools = ToolEngine(HFEngine(tiny.model, tiny.processor, tiny.family, tiny.spec), tiny.processor, tiny.family,
                       tiny.spec, TOOLS, ClipSource(vision_of("qwen2_5_vl")), ToolLimits(call_visual_tokens=64))
    text = f"{CALL}<answer>blue</answer>"
    offline = Rollout(0, [1, 2], text, finish_reason="offline", offline=True)
    none = tool_prompt(tiny, clip, "none", sample_tools=[])
    assert tools.replay(none, offline, 300) is offline
    zoom = tool_prompt(tiny, clip, "zoom", sample_tools=["zoom_frame"])
    with caplog.at_level("WARNING"):
        replayed = tools.replay(zoom, offline, 300)
    assert replayed.turn_texts == [CALL, "<answer>blue</answer>"] and replayed.text == "<answer>blue</answer>"
    assert replayed.tool_calls[0].error.startswith("tool 'crop_video' is not offered")
    assert replayed.media.pixel_values_videos is None  # no clip came back
    assert "sample zoom: its offline trajectory calls crop_video, which the sample is not offered" in caplog.text


def test_samples_listing_tools_the_run_does_not_turn_on_are_counted():
    """Said once at the start of a run (a control run without tools reads the same data)."""
    from easyvideor1.records import Sample
    from easyvideor1.rollout.tools.registry import tools_not_on

    samples = [Sample("q", "a", "free-form", tools=t) for t in (None, [], ["crop_video"], ["zoom_frame", "magnify"])]
    assert tools_not_on(samples, ["crop_video"]) == (1, ["magnify", "zoom_frame"])
    assert tools_not_on(samples, []) == (2, ["crop_video", "magnify", "zoom_frame"])


def test_fsdp_ranks_with_unequal_tool_use(callers, clip, tmp_path):
    """torchrun, 2 processes, FSDP2: rank 0's response calls a tool (3 turns), rank 1's makes one
    turn; no hang, the metrics sum over both ranks, and rank 0's trainer log-probs (sharded model)
    equal its engine's."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    tiny, _, model = callers("qwen2_5_vl")
    model.save_pretrained(tmp_path / "model")
    tiny.processor.save_pretrained(tmp_path / "model")
    here = Path(__file__).parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(here.parent), os.environ.get("PYTHONPATH", "")])}
    proc = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(here / "tools_worker.py"), str(tmp_path / "model"), str(clip), str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["calls"] >= 1 and ranks[0]["turns"] >= 2 and ranks[0]["tool_tokens"] > 0
    assert ranks[1]["calls"] == 0 and ranks[1]["tool_tokens"] == 0
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    assert ranks[0]["metrics"]["tools/calls_per_response"] == ranks[0]["calls"] / 2
    assert ranks[0]["gap"] < 2e-4 and ranks[1]["gap"] < 2e-4
    assert ranks[0]["grad_norm"] == ranks[1]["grad_norm"] > 0


def test_offline_trajectory_with_a_call_is_replayed_on_the_video(hf_tiny_dirs, clip):
    """Hybrid groups: an offline trajectory that calls crop_video becomes a multi-turn response
    whose tool turn is computed from the video (not read from the file), trainable like a
    generated one (tool tokens outside the loss)."""
    from easyvideor1.config import HybridConfig, RolloutConfig
    from easyvideor1.records import RewardResult
    from easyvideor1.training.groups import RolloutStage

    tiny = load_tiny("qwen2_5_vl", hf_tiny_dirs["qwen2_5_vl"])
    prompt = tool_prompt(tiny, clip, tools=("crop_video",))
    prompt.sample.offline_output = f"<think>look again</think>{CALL}<answer>blue</answer>"
    prompt.sample.has_offline_trajectory = True
    engine = HFEngine(tiny.model, tiny.processor, tiny.family, tiny.spec)
    tools = ToolEngine(engine, tiny.processor, tiny.family, tiny.spec, TOOLS, ClipSource(vision_of("qwen2_5_vl")),
                       ToolLimits(call_visual_tokens=64))
    stage = RolloutStage(tools, lambda texts, samples: [RewardResult(1.0, 1.0, 1.0) for _ in texts],
                         tiny.processor.tokenizer, "<|im_end|>", RolloutConfig(n=2), HybridConfig(enable=True),
                         AlgorithmConfig(), seed=0, replay=tools.replay)
    scored = stage.groups([prompt], SamplingParams(temperature=0, max_tokens=300))
    online, offline = scored.groups[0]
    assert not online.offline and offline.offline and offline.logprobs is None
    assert offline.turn_texts == [f"<think>look again</think>{CALL}", "<answer>blue</answer>"]
    assert offline.text == "<answer>blue</answer>" and offline.tool_calls[0].visual_tokens == 24
    assert offline.tool_calls[0].error is None and offline.media.video_grid_thw.tolist() == [[6, 4, 4]]  # patches
    batch = make_batch(scored.prompts, scored.groups, scored.results[0])
    assert int(batch.response_mask[1].sum()) == sum(offline.model_mask) < len(offline.token_ids)
    ctx = ForwardContext(tiny.family, tiny.spec, tiny.processor.tokenizer.pad_token_id, micro_batch_size=2,
                         temperature=1.0, banned_ids=tuple(engine.banned))
    logp = all_logprobs(tiny.model, batch, ctx)
    assert torch.isfinite(logp).all() and (logp[batch.response_mask] < 0).all()


def test_a_call_past_the_engines_media_limit_is_an_error_turn(callers, clip):
    """An engine with per-prompt media limits (vLLM's `limits`): a clip that would pass them comes
    back as an error the model reads, counted like any bad call, and the loop goes on."""
    tiny, prompt, model = callers("qwen2_5_vl")
    tools = ToolEngine(HFEngine(model, tiny.processor, tiny.family, tiny.spec), tiny.processor, tiny.family,
                       tiny.spec, TOOLS, ClipSource(vision_of("qwen2_5_vl")), ToolLimits(max_turns=2))
    tools.media_limits = {"video": 1, "image": 2}  # the prompt's video fills it
    ((r,),) = tools.generate([prompt], 1, SamplingParams(temperature=0, max_tokens=200))
    assert r.turn_texts[0] == CALL and r.media.pixel_values_videos is None  # no clip came back
    assert r.tool_calls[0].error == "over the media limit: the engine takes at most 1 videos"
    assert r.tool_calls[0].visual_tokens == 0 and tool_metrics([[r]])["tools/errors"] >= 1


def test_packed_and_padded_rows_train_alike_on_tool_turns(callers, clip):
    """Responses of different turn counts and media in one batch: the taught model's multi-turn
    response (a clip mid-sequence), a replayed trajectory of 3 model turns (a longer clip, then a
    zoomed frame) and two one-turn answers of another prompt. Padding-free rows and padded rows
    (`training.padding_free` on / off, as the trainer sets them up): the same M-RoPE positions and
    loss mask per sequence, the mask holding the model's own tokens only (no tool-turn token, text
    or media); the same log-probs (the engine's, on the generated response); one `policy_update`
    each with the same loss and gradients."""
    tiny, prompt, taught_model = callers("qwen2_5_vl")
    model = copy.deepcopy(taught_model)
    use_packed_attention(model)  # as build_run does when either layout packs (plain rows still get SDPA)
    engine = HFEngine(model, tiny.processor, tiny.family, tiny.spec)
    tools = ToolEngine(engine, tiny.processor, tiny.family, tiny.spec, TOOLS, ClipSource(vision_of("qwen2_5_vl")),
                       ToolLimits(max_turns=3, call_visual_tokens=64, response_visual_tokens=256))
    ((multi,),) = tools.generate([prompt], 1, SamplingParams(temperature=0, max_tokens=400))
    three = ('<tool_call>{"name": "crop_video", "arguments": {"start": 0, "end": 3.5}}</tool_call>'
             '<tool_call>{"name": "zoom_frame", "arguments": {"time": 2, "box": [0, 0, 0.5, 0.5]}}</tool_call>'
             "<answer>blue</answer>")
    replayed = tools.replay(prompt, Rollout(0, [], three), 600)
    assert len(multi.turn_texts) >= 2 and multi.media.pixel_values_videos is not None
    assert len(replayed.turn_texts) == 3 and [c.error for c in replayed.tool_calls] == [None, None]
    assert replayed.media.pixel_values is not None  # the zoomed frame
    assert replayed.media.video_grid_thw.tolist() != multi.media.video_grid_thw.tolist()  # other clip sizes
    text_prompt = tool_prompt(tiny, clip, "plain", tools=())
    plain = engine.generate([text_prompt], 2, SamplingParams(temperature=1.0, max_tokens=12, seed=0))[0]
    batch = make_batch([prompt, text_prompt], [[multi, replayed], plain])
    mask = batch.response_mask
    assert int(mask[:2].sum()) == sum(multi.model_mask) + sum(replayed.model_mask)
    ctxs = {packed: ForwardContext(tiny.family, tiny.spec, tiny.processor.tokenizer.pad_token_id, micro_batch_size=3,
                                   temperature=1.0, shared_prefix=True, padding_free=packed,
                                   banned_ids=tuple(engine.banned)) for packed in (True, False)}
    rows = {}
    for packed, ctx in ctxs.items():
        mb = collate_responses(batch, list(range(batch.size)), ctx)
        assert (mb.input_ids.shape[0] == 1) is packed
        rows[packed] = []
        for i, (row, start, end) in enumerate(mb.seq_spans):
            ids, loss = mb.input_ids[row, start:end], mb.loss_mask[row, start:end]
            n = len(batch.rollouts[i].token_ids)
            layout = "packed" if packed else "padded"
            assert torch.equal(loss[-n:], mask[i, :n]) and not loss[:-n].any(), \
                f"{layout} sequence {i}: the loss mask is not the model's own tokens"
            media = (ids == tiny.spec.video_token_id) | (ids == tiny.spec.image_token_id)
            assert not loss[media].any(), f"{layout} sequence {i}: media tokens in the loss"
            rows[packed].append((ids, loss, mb.position_ids[1:, row, start:end]))
    for (ids_a, loss_a, pos_a), (ids_b, loss_b, pos_b) in zip(rows[True], rows[False]):
        assert torch.equal(ids_a, ids_b) and torch.equal(loss_a, loss_b), "packed and padded sequences differ"
        assert torch.equal(pos_a, pos_b), "M-RoPE positions differ between packed and padded rows"
    logp = {packed: all_logprobs(model, batch, ctx) for packed, ctx in ctxs.items()}
    # float summation order at most (one row vs a padded batch): measured equal here, gradients 3e-8 apart
    torch.testing.assert_close(logp[True][mask], logp[False][mask], rtol=0, atol=1e-5)
    gen = mask[0]
    assert torch.allclose(logp[True][0][gen], batch.behaviour_log_probs[0][gen], atol=2e-4)
    g = torch.Generator().manual_seed(0)
    batch.old_log_probs = (logp[False] + 0.3 * torch.randn(logp[False].shape, generator=g)) * mask
    batch.advantages = torch.randn(batch.size, 1, generator=g).expand_as(mask) * mask
    losses, grads = {}, {}
    for packed, ctx in ctxs.items():
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        seen = record_step_gradients(model, optimizer)
        metrics = policy_update(model, optimizer, batch, AlgorithmConfig(disable_kl=True), ctx, ppo_epochs=1,
                                n_mini=1, grad_clip=1e9, max_len=600, kl_coef=0.0)
        losses[packed], grads[packed] = metrics["actor/pg_loss"], one_step_gradients(seen)
    assert losses[True] == pytest.approx(losses[False], rel=1e-5) and losses[True] != 0
    assert set(grads[True]) == set(grads[False]) and any("visual" in n for n in grads[True])
    assert max(float(v.abs().max()) for v in grads[False].values()) > 1e-4
    for name, padded in grads[False].items():
        torch.testing.assert_close(grads[True][name], padded, rtol=1e-4, atol=1e-7, msg=lambda m: f"{name}: {m}")
