"""A small Qwen-style tokenizer trained locally, for tiny models (no model hub needed).

Byte-level BPE trained with `tokenizers` on a generated English corpus (the words of the
built-in synthetic tasks, digits, answer tags), wrapped as transformers' `Qwen2Tokenizer`
with the Qwen special tokens. Any text still encodes (byte fallback of byte-level BPE); the
corpus only decides which words get single tokens. Deterministic: same corpus, same merges.
"""

from __future__ import annotations

import itertools
import json

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

# Qwen's special tokens, in Qwen's order. They take ids 0..13 here (Qwen puts them at 151643+;
# only their names matter to processors and vLLM, and the config reads the ids back).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Added (non-special) tokens as in Qwen3: kept whole, but decoded with the text. The answer
# tags are whole tokens too (our tokenizer, our choice): a tiny model's responses stay short.
ADDED_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]

# Same split rule as Qwen2's tokenizer.json, so the trained merges fit its pre-tokenizer.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_WORDS = ["the", "a", "an", "of", "in", "on", "at", "to", "is", "are", "was", "were", "be", "this", "that", "what", "which", "who", "where", "when", "how", "many", "much", "color", "colour", "colours", "red", "green", "blue", "yellow", "white", "black", "orange", "purple", "pink", "brown", "gray", "grey", "cyan", "magenta", "square", "circle", "triangle", "ball", "box", "object", "objects", "shape", "shapes", "moving", "moves", "move", "moved", "left", "right", "up", "down", "top", "bottom", "middle", "center", "centre", "corner", "first", "second", "third", "last", "before", "after", "during", "between", "start", "end", "frame", "frames", "video", "image", "picture", "clip", "scene", "second", "seconds", "time", "count", "number", "answer", "question", "options", "option", "choose", "select", "correct", "true", "false", "yes", "no", "not", "and", "or", "with", "from", "by", "for", "it", "its", "there", "here", "appear", "appears", "appeared", "disappear", "think", "reasoning", "step", "final", "please", "output", "format", "describe", "caption", "short", "long", "small", "large", "big", "fast", "slow", "direction", "position", "region", "where", "when", "which", "person", "people", "man", "woman", "car", "dog", "cat", "you", "are", "helpful", "assistant", "system", "user", "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def training_corpus() -> list[str]:
    """The generated text the BPE merges are learned from (deterministic)."""
    lines = [" ".join(_WORDS)]
    for a, b in itertools.product(_WORDS[:60], _WORDS[60:120]):
        lines.append(f"{a} {b} {a.capitalize()} {b}.")
    lines += [f"{n} {n + 1} {n * 7} {n / 4:.2f} ({chr(65 + n % 26)})" for n in range(200)]
    lines += [
        "<think> Let me think step by step. </think> <answer> A </answer>",
        '{"answer": "B", "time": [1.5, 3.0], "box": [10, 20, 30, 40]}',
        "Answer with the option letter. Options: (A) red (B) green (C) blue (D) yellow",
        "Output the final answer in <answer> </answer> tags.",
    ] * 20
    return lines


def train_bpe(vocab_size: int = 1000) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of a byte-level BPE trained on `training_corpus()`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=_regex(), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + ADDED_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    # Read the merges back from the serialised model, as tuples (Qwen2Tokenizer wants tuples).
    merges = [tuple(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return dict(sorted(tok.get_vocab().items(), key=lambda kv: kv[1])), merges


def _regex() -> Regex:
    return Regex(PRETOKENIZE_REGEX)


def build_tokenizer(chat_template: str, vocab_size: int = 1000):
    """A `Qwen2Tokenizer` with the Qwen special tokens, `<|im_end|>` as eos and `chat_template`.

    Its length is at most `vocab_size` (the small corpus may stop BPE earlier); the model's
    embedding table must be at least `len(tokenizer)`.
    """
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = train_bpe(vocab_size)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        errors="replace",
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    tok.chat_template = chat_template
    return tok


# Qwen2.5's tool format: with `tools=`, the system turn lists them and asks for
# `<tool_call>{json}</tool_call>`; an assistant turn's `tool_calls` are written that way; `tool`
# messages become one user turn of `<tool_response>` blocks (media inside them rendered as in any
# turn). Without tools and tool messages the output is the plain Qwen-VL template's.
_CHAT_TEMPLATE = (
    "{% macro render(content) %}{% if content is string %}{{ content }}"
    "{% else %}{% for item in content %}"
    "{% if item['type'] == 'image' or 'image' in item %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' or 'video' in item %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in item %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endmacro %}"
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ render(messages[0]['content']) }}{% else %}{{ default_system }}{% endif %}"
    "{{ '\\n\\n' }}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ render(message['content']) }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "{% if loop.first and message['role'] != 'system' and default_system and not tools %}"
    "<|im_start|>system\n{{ default_system }}<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ render(message['content']) }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set call = call['function'] if 'function' in call else call %}"
    "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ call['name'] }}\", \"arguments\": {{ call['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_template(default_system_prompt: str | None) -> str:
    """A Qwen-VL chat template (the official structure), with or without a default system turn."""
    return "{% set default_system = " + json.dumps(default_system_prompt or "") + " %}" + _CHAT_TEMPLATE
