"""`model.gradient_checkpointing: auto` (the default): on when the longest row a rank forwards is over
`AUTO_TOKENS`, off below; true and false as written."""

import pytest

from easyvideor1.config import demo_config_path, load_config
from easyvideor1.training.recompute import AUTO_TOKENS, gradient_checkpointing


# Text-only prompt caps: prompts that hold no media need no room for the default vision section
# (checked at load, config.prompt_budget_problem)
TEXT = ["rollout.limit_videos=0", "rollout.limit_images=0"]


@pytest.mark.parametrize("overrides, on", [
    ([], True),  # the defaults: 28,672-token prompt cap + 1024-token responses
    (["data.max_prompt_tokens=3000", "rollout.max_tokens=1096"], False),  # 4096: not over
    (["data.max_prompt_tokens=3000", "rollout.max_tokens=1097"], True),
    (["data.max_prompt_tokens=16384", "training.sequence_parallel_size=8"], False),  # 2176 tokens per rank
    (["data.max_prompt_tokens=1000", "model.gradient_checkpointing=true"], True),
    (["model.gradient_checkpointing=false"], False),
])
def test_default_decision(overrides, on):
    state, why = gradient_checkpointing(load_config(None, overrides + TEXT))
    assert state is on
    assert ("auto" in why) == (not any(o.startswith("model.") for o in overrides))
    assert AUTO_TOKENS == 4096


def test_shipped_configs():
    assert gradient_checkpointing(load_config(demo_config_path()))[0] is False  # short rows: no recompute
    assert load_config(None).model.gradient_checkpointing == "auto"
