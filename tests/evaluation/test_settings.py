"""Presets (the published Qwen values, written out by hand) and the settings hashes."""

from __future__ import annotations

import dataclasses

import pytest

from easyvideor1.errors import UserError
from easyvideor1.evaluation import presets
from easyvideor1.evaluation.settings import (
    DecodingSettings,
    EvalSettings,
    differences,
    template_digest,
)


def test_qwen3_vl_preset_is_qwen_vl_utils_in_32px_tokens():
    p = presets.get_preset("qwen3_vl")
    v, s = p.vision, p.sampling
    assert (v.family, v.fps, v.min_frames, v.max_frames) == ("qwen3_vl", 2.0, 4, 768)
    assert (v.video_min_pixels, v.video_max_pixels) == (131072, 786432)  # 128 and 768 tokens of 32x32
    assert v.video_total_pixels == 117964800  # 128000 * 1024 * 0.9
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty, s.presence_penalty) == (0.7, 0.8, 20, 1.0, 1.5)


def test_qwen2_5_vl_preset_is_qwen_vl_utils_in_28px_tokens():
    p = presets.get_preset("qwen2_5_vl")
    v, s = p.vision, p.sampling
    assert (v.video_min_pixels, v.video_max_pixels, v.video_total_pixels) == (100352, 602112, 90316800)
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty) == (0.1, 0.001, 1, 1.05)
    assert presets.get_preset("qwen2_5_vl_greedy").sampling.greedy


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ValueError, match="unknown evaluation preset 'qwen4'; choose one of qwen2_5_vl"):
        presets.get_preset("qwen4")


def test_hash_is_stable_and_moves_with_every_score_changing_setting():
    base = presets.settings("qwen3_vl", "models/a")
    assert base.hash == presets.settings("qwen3_vl", "models/a").hash
    changed = [
        dataclasses.replace(base, model_path="models/b"),
        dataclasses.replace(base, engine="hf"),
        dataclasses.replace(base, prompt_digest="abc"),
        dataclasses.replace(base, judge="qwen3-8b@http://127.0.0.1:8000/v1"),
        dataclasses.replace(base, vision=dataclasses.replace(base.vision, max_frames=256)),
        dataclasses.replace(base, vision=dataclasses.replace(base.vision, video_total_pixels=10**7)),
        dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, max_new_tokens=512)),
    ]
    assert len({base.hash, *(c.hash for c in changed)}) == len(changed) + 1
    assert changed[0].protocol_hash == base.protocol_hash  # the model is not part of the protocol
    assert all(c.protocol_hash != base.protocol_hash for c in changed[1:])
    # the decoder choice does not change pixels, so not the hash either
    same = dataclasses.replace(base, vision=dataclasses.replace(base.vision, backend="pyav", decode_threads=4))
    assert same.hash == base.hash


def test_differences_lists_each_key_once():
    assert differences({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == ["b: 2 != 3", "c: '<absent>' != 4"]


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="engine='trt'"):
        EvalSettings(model_path="m", engine="trt")
    with pytest.raises(ValueError, match="top_p"):
        DecodingSettings(top_p=0)


def test_template_digest_follows_file_contents(tmp_path):
    (tmp_path / "multiple_choice.jinja").write_text("Question: {{ problem }}")
    first = template_digest(tmp_path)
    (tmp_path / "multiple_choice.jinja").write_text("Q: {{ problem }}")
    assert template_digest(tmp_path) != first
    assert len(template_digest()) == 16  # the built-in templates


def test_template_digest_of_one_template_file(tmp_path):
    """`--template-dir FILE` (one template for every sample, as the demo trains with) is hashed, and a
    missing path is a user error naming it, not a traceback."""
    one = tmp_path / "terse.jinja"
    one.write_text("{{ problem }}")
    first = template_digest(one)
    one.write_text("Q: {{ problem }}")
    assert template_digest(one) != first and len(first) == 16
    with pytest.raises(UserError, match="--template-dir .*nope: no such folder or file"):
        template_digest(tmp_path / "nope")


def test_overrides_land_in_the_settings_and_their_hash():
    base = presets.settings("qwen2_5_vl_greedy", "m")
    o = presets.Overrides(max_new_tokens=64, fps=1.0, max_frames=16, video_max_pixels=56 * 56,
                          image_max_pixels=28 * 28 * 8)
    got = presets.settings("qwen2_5_vl_greedy", "m", overrides=o)
    flat = got.flat()
    assert (flat["sampling.max_new_tokens"], flat["vision.fps"], flat["vision.max_frames"]) == (64, 1.0, 16)
    assert (flat["vision.video_max_pixels"], flat["vision.image_max_pixels"]) == (3136, 6272)
    # a maximum below the preset's minimum (128 and 4 tokens of 28x28) lowers the minimum with it
    assert (flat["vision.video_min_pixels"], flat["vision.image_min_pixels"]) == (3136, 3136)
    assert flat["vision.min_frames"] == 4 and flat["vision.video_total_pixels"] == base.vision.video_total_pixels
    # each override alone changes the hash
    singles = [presets.Overrides(**{k: v}) for k, v in o.given().items()]
    hashes = {presets.settings("qwen2_5_vl_greedy", "m", overrides=s).hash for s in singles}
    assert len(hashes | {base.hash}) == len(singles) + 1
    assert presets.settings("qwen2_5_vl_greedy", "m", overrides=presets.Overrides()).hash == base.hash
    assert o.flags() == {"--max-new-tokens": 64, "--fps": 1.0, "--video-max-frames": 16, "--video-max-pixels": 3136,
                         "--image-max-pixels": 6272}  # the flags `cache` names them by


def test_flags_over_a_models_settings_keep_the_budget_consistent():
    """`eval` lays the flags over the settings a model carries (`carried.start`): a maximum below
    the carried minimum lowers it, unless the flags give the minimum too; the rest is carried."""
    carried = presets.Overrides(max_new_tokens=40, fps=2.0, min_frames=4, max_frames=8, video_min_pixels=3136,
                                video_max_pixels=12544, video_total_pixels=200704, image_min_pixels=3136,
                                image_max_pixels=12544)
    got = presets.Overrides(video_max_pixels=1568, max_frames=2).over(carried)
    assert (got.video_max_pixels, got.video_min_pixels, got.max_frames, got.min_frames) == (1568, 1568, 2, 2)
    assert (got.fps, got.max_new_tokens, got.image_min_pixels, got.video_total_pixels) == (2.0, 40, 3136, 200704)
    assert presets.Overrides(video_max_pixels=1568, video_min_pixels=784).over(carried).video_min_pixels == 784
    flat = presets.settings("qwen2_5_vl_greedy", "m", overrides=got).flat()
    assert (flat["vision.video_min_pixels"], flat["vision.video_max_pixels"], flat["vision.min_frames"]) == (1568, 1568, 2)


def test_impossible_override_names_the_flag():
    from easyvideor1.errors import UserError

    with pytest.raises(UserError, match=r"--max-new-tokens 0 does not fit preset 'qwen3_vl'.*max_new_tokens"):
        presets.settings("qwen3_vl", "m", overrides=presets.Overrides(max_new_tokens=0))
    with pytest.raises(UserError, match=r"--fps -1.0 .*vision.fps must be > 0"):
        presets.settings("qwen3_vl", "m", overrides=presets.Overrides(fps=-1.0))


def test_default_max_model_len_follows_the_budget_and_the_model_cap():
    from types import SimpleNamespace

    s = presets.settings("qwen2_5_vl_greedy", "m")
    # 90316800 / 784 video tokens + 2 images of 16384 tokens + 2048 text + 4096 response
    assert presets.default_max_model_len(s) == 115200 + 2 * 16384 + 2048 + 4096
    capped = SimpleNamespace(text_config=SimpleNamespace(max_position_embeddings=128000))
    assert presets.default_max_model_len(s, capped) == 128000
    small = presets.settings("qwen3_vl", "m", overrides=presets.Overrides(max_new_tokens=100))
    assert presets.default_max_model_len(small) == 117964800 // 1024 + 2 * 16384 + 2048 + 100


def test_engine_flags_reach_the_vllm_arguments():
    from types import SimpleNamespace

    from easyvideor1 import cli
    from easyvideor1.evaluation.evaluator import options_from, vllm_engine_args

    args = cli.build_parser().parse_args(
        ["eval", "--model", "m", "--benchmarks", "b", "--max-model-len", "4096", "--tensor-parallel-size", "2",
         "--no-enforce-eager", "--gpu-memory-utilization", "0.5", "--chunked-prefill"])
    o = options_from(**{k: v for k, v in vars(args).items()})
    got = vllm_engine_args(o, presets.settings("qwen2_5_vl_greedy", "m"), SimpleNamespace())
    assert got == {"max_model_len": 4096, "tensor_parallel_size": 2, "gpu_memory_utilization": 0.5,
                   "enforce_eager": False, "enable_chunked_prefill": True}
    args = cli.build_parser().parse_args(["eval", "--model", "m", "--benchmarks", "b"])
    o = options_from(**{k: v for k, v in vars(args).items()})
    got = vllm_engine_args(o, presets.settings("qwen2_5_vl_greedy", "m"), SimpleNamespace(max_position_embeddings=2048))
    assert got["max_model_len"] == 2048 and "enable_chunked_prefill" not in got  # vLLM's own default


def test_qwen2_vl_and_qwen3_5_presets():
    v = presets.get_preset("qwen2_vl").vision
    assert (v.family, v.fps, v.max_frames, v.video_total_pixels) == ("qwen2_vl", 2.0, 768, 24576 * 784)
    s = presets.get_preset("qwen2_vl").sampling
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty) == (0.01, 0.001, 1, 1.05)
    q = presets.get_preset("qwen3_5")
    assert q.vision.family == "qwen3_5" and q.vision.video_total_pixels == 117964800  # the Qwen3-VL budget
    assert (q.sampling.temperature, q.sampling.top_p, q.sampling.top_k, q.sampling.presence_penalty) == (0.7, 0.8, 20, 1.5)
    t = presets.get_preset("qwen3_5_thinking").sampling
    assert (t.temperature, t.top_p, t.top_k, t.presence_penalty) == (1.0, 0.95, 20, 1.5)
    assert presets.get_preset("qwen3_5_greedy").sampling.greedy and presets.get_preset("qwen2_vl_greedy").sampling.greedy
