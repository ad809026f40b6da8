"""Tiny models: offline loading, token ids wired to the config, determinism, the CLI."""

from __future__ import annotations

import argparse

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from easyvideor1.models import commands
from easyvideor1.models.families import MODEL_FAMILIES, family_of, get_family
from easyvideor1.models.tiny import SIZES, build_tiny_model
from easyvideor1.models.tokenizer import SPECIAL_TOKENS


@pytest.mark.parametrize("name", list(MODEL_FAMILIES))
def test_loads_offline_with_matching_ids(name, tiny_dirs):
    path = tiny_dirs[name]
    family = get_family(name)
    model = AutoModelForImageTextToText.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    tok = processor.tokenizer
    cfg = model.config

    assert type(model).__name__ == family.architecture
    assert type(processor).__name__ == family.processor_class
    assert type(processor.video_processor).__name__ == family.video_processor_class
    assert family_of(cfg) is family
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert cfg.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    assert len(tok) <= cfg.text_config.vocab_size
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # vLLM normalises videos with the image processor's numbers: they must be the same.
    assert list(processor.image_processor.image_mean) == list(processor.video_processor.image_mean)
    assert list(processor.image_processor.image_std) == list(processor.video_processor.image_std)
    assert processor.image_processor.patch_size == family.patch_size
    # vLLM's CPU attention supports head sizes >= 32 only.
    text = cfg.text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert head_dim >= 32, head_dim


@pytest.mark.parametrize("name", list(MODEL_FAMILIES))
def test_special_tokens_are_single_tokens_and_template_renders(name, tiny_dirs):
    processor = AutoProcessor.from_pretrained(tiny_dirs[name])
    tok = processor.tokenizer
    for s in SPECIAL_TOKENS + ["<think>", "</think>"]:
        assert len(tok(s)["input_ids"]) == 1, s
    text = "How many red squares move left? 12.5 seconds <answer>B</answer>"
    assert tok.decode(tok(text)["input_ids"]) == text
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Hi"}]}]
    rendered = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    system = get_family(name).default_system_prompt
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    assert rendered == (
        head + "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Hi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_same_seed_same_bytes_other_seed_differs(tmp_path, tiny_dirs):
    a = build_tiny_model("qwen2_5_vl", tmp_path / "a", seed=0)
    b = build_tiny_model("qwen2_5_vl", tmp_path / "b", seed=1)
    same = (a / "model.safetensors").read_bytes()
    assert same == (tiny_dirs["qwen2_5_vl"] / "model.safetensors").read_bytes()
    assert same != (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_seed_does_not_touch_global_rng(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model("qwen2_vl", tmp_path / "m", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_family_and_size_list_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5"):
        build_tiny_model("llava", tmp_path)
    with pytest.raises(ValueError, match="tiny, medium, small"):
        build_tiny_model("qwen2_vl", tmp_path, size="huge")


def test_small_size_is_larger_and_loads(tmp_path):
    path = build_tiny_model("qwen3_vl", tmp_path / "small", size="small")
    model = AutoModelForImageTextToText.from_pretrained(path)
    assert model.config.text_config.hidden_size == SIZES["small"].text_hidden
    assert model.config.vision_config.depth == SIZES["small"].vision_depth


def test_cli_tiny_model_writes_a_loadable_model(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tiny-model", "--family", "qwen3_5", "--out", str(tmp_path / "m"), "--seed", "3"])
    assert args.func(args) == 0
    assert "qwen3_5" in capsys.readouterr().out
    assert AutoModelForImageTextToText.from_pretrained(tmp_path / "m").config.model_type == "qwen3_5"
    with pytest.raises(SystemExit):
        parser.parse_args(["tiny-model", "--family", "llava", "--out", str(tmp_path)])


@pytest.mark.parametrize("name", list(MODEL_FAMILIES))
def test_video_processor_config_as_real_checkpoints(name, tiny_dirs):
    """`do_sample_frames` is the class default, as in the released checkpoints (Qwen2/2.5-VL ship
    no video config, so theirs loads as False; Qwen3-VL's video config leaves it at True).
    test_model_inputs checks that our own frames still match the processor's own sampling."""
    import json

    import transformers

    family = get_family(name)
    saved = json.loads((tiny_dirs[name] / "processor_config.json").read_text())["video_processor"]
    default = getattr(transformers, family.video_processor_class)().do_sample_frames
    assert saved.get("do_sample_frames", default) == default
    if name in ("qwen2_vl", "qwen2_5_vl"):
        assert saved.get("do_sample_frames") is False
    processor = AutoProcessor.from_pretrained(tiny_dirs[name])
    assert processor.video_processor.do_sample_frames == default


@pytest.mark.parametrize("name", [n for n, f in MODEL_FAMILIES.items() if f.moe])
def test_moe_routers_are_drawn_and_route_tokens_apart(name, tiny_dirs):
    """transformers makes each router's weight zeros in `__init__` (a tie: every token the same
    experts); `_init_weights` must draw it, or routing replay has nothing to replay. Each layer's
    router, as loaded, spreads random hidden states over every expert, each token to top-k of them."""
    from easyvideor1.models.tiny import TINY_EXPERTS, TINY_TOP_K

    model = AutoModelForImageTextToText.from_pretrained(tiny_dirs[name], dtype=torch.float32)
    layers = model.model.language_model.layers
    hidden = torch.randn(64, model.config.get_text_config().hidden_size, generator=torch.Generator().manual_seed(0))
    for layer in layers:
        router = layer.mlp.gate
        assert router.weight.shape == (TINY_EXPERTS, hidden.shape[1]) and router.weight.std() > 0.01
        _, scores, chosen = router(hidden)  # [tokens, top_k] each
        assert chosen.shape == (64, TINY_TOP_K) and torch.allclose(scores.sum(-1), torch.ones(64))
        assert set(chosen.flatten().tolist()) == set(range(TINY_EXPERTS))
        assert len({tuple(sorted(r)) for r in chosen.tolist()}) > 1
