"""Trainer pieces that need no engine: loader, checkpoints, hybrid groups, metrics and report."""


import pytest
import torch

from easyvideor1.config import Config, HybridConfig, TrainingConfig
from easyvideor1.models.tokenizer import build_tokenizer, chat_template
from easyvideor1.records import RewardResult, Rollout, Sample
from easyvideor1.training.hybrid import HybridCounters, fill_groups, online_count
from easyvideor1.training.loader import PromptLoader, rank_slice
from easyvideor1.training.metrics import MetricsSink, console_line, read_metrics
from easyvideor1.training.report import write_training_report
from easyvideor1.training.sequences import make_batch, to_response_space
from easyvideor1.training.setup import make_scheduler
from easyvideor1.training.state import checkpoint as ckpt


def _samples(n, offline=True):
    return [Sample(problem=f"q{i}", answer="A", problem_type="multiple choice", problem_id=f"s{i}",
                   has_offline_trajectory=offline, offline_output="<think>red</think><answer>A</answer>" if offline else None)
            for i in range(n)]


def test_loader_epochs_and_exact_resume():
    loader = PromptLoader(_samples(5), batch_size=3, seed=1)
    first = [s.problem_id for s in loader.next_batch()]
    state = loader.state_dict()
    rest = [[s.problem_id for s in loader.next_batch()] for _ in range(3)]
    again = PromptLoader(_samples(5), batch_size=3, seed=1)
    again.load_state_dict(state)
    assert [[s.problem_id for s in again.next_batch()] for _ in range(3)] == rest
    seen = first + rest[0][:2]  # the first epoch covers all 5 samples exactly once
    assert sorted(seen) == [f"s{i}" for i in range(5)]
    assert rank_slice(list(range(8)), 1, 2) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        rank_slice(list(range(5)), 0, 2)


def test_checkpoint_roundtrip_keep_and_partial_cleanup(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    for step in (1, 2, 3):
        model(torch.randn(3, 4)).sum().backward()
        opt.step(), sched.step(), opt.zero_grad()
        ckpt.save_checkpoint(tmp_path, step, model, opt, sched, {"loader": {"epoch": 0, "index": step}}, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]
    (tmp_path / "step-000004.tmp-123").mkdir()  # a write killed before its rename
    ckpt.clean_partial(tmp_path)
    assert not (tmp_path / "step-000004.tmp-123").exists()
    expected_next = torch.rand(1)
    model2 = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (s + 1))
    state = ckpt.load_checkpoint(ckpt.resolve_resume(tmp_path, "auto"), model2, opt2, sched2)
    assert state["loader"]["index"] == 3
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    assert sched2.last_epoch == sched.last_epoch and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert torch.equal(torch.rand(1), expected_next)  # RNG restored to the saved state
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        ckpt.resolve_resume(tmp_path, str(tmp_path / "nope"))
    assert ckpt.resolve_resume(tmp_path, "never") is None


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(chat_template(None))


def _online(k, prompt_index):
    return [Rollout(prompt_index, [5, 6], "x", [-1.0, -1.0]) for _ in range(k)]


def test_hybrid_always_generates_n_minus_1_and_appends_offline(tokenizer):
    cfg = HybridConfig(enable=True, mode="always")
    samples = _samples(2) + _samples(1, offline=False)
    counts = [online_count(s, 4, cfg) for s in samples]
    assert counts == [3, 3, 4]
    counters = HybridCounters()
    groups = fill_groups(samples, [_online(c, i) for i, c in enumerate(counts)], None, cfg, tokenizer,
                         "<|im_end|>", 64, counters)
    assert [len(g) for g in groups] == [4, 4, 4]
    last = groups[0][-1]
    assert last.offline and last.finish_reason == "offline" and last.logprobs is None
    assert last.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(last.token_ids[:-1]) == "<think>red</think><answer>A</answer>"
    assert not any(r.offline for r in groups[2])
    assert (counters.groups_evaluated, counters.groups_replaced) == (2, 2)


def test_hybrid_threshold_mode_and_truncation(tokenizer):
    cfg = HybridConfig(enable=True, mode="threshold", threshold=0.5)
    samples = _samples(2)
    assert online_count(samples[0], 4, cfg) == 4
    counters = HybridCounters()
    groups = fill_groups(samples, [_online(4, 0), _online(4, 1)], [[1, 1, 0, 0], [0, 0, 0, 1]], cfg, tokenizer,
                         "<|im_end|>", 3, counters)
    assert [r.offline for r in groups[0]] == [False] * 4  # accuracy 0.5 is not below 0.5
    assert [r.offline for r in groups[1]] == [False, False, False, True]
    assert groups[1][-1].truncated and len(groups[1][-1].token_ids) == 3
    assert counters.offline_truncated == 1 and counters.groups_replaced == 1


def test_response_space_roundtrip():
    groups = [[Rollout(0, [1, 2, 3], "a", [-.1, -.2, -.3])], [Rollout(1, [4], "b", None, offline=True)]]
    batch = make_batch([None, None], groups)
    assert batch.response_mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.offline.tolist() == [False, True] and batch.group_ids.tolist() == [0, 1]
    # a padded [B, L] layout: prompt of 2 then response, right padding
    values = torch.tensor([[9., 9., 1., 2., 3.], [9., 9., 4., 0., 0.]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 1, 0, 0]], dtype=torch.bool)
    out = to_response_space(values, mask, batch.response_mask)
    assert out.tolist() == [[1., 2., 3.], [4., 0., 0.]]


def test_response_space_skips_tool_turn_tokens():
    """A multi-turn response's tool-turn tokens are outside the response mask, and the scored
    (loss-masked) values land on the model's tokens around them."""
    tool_turn = Rollout(0, [1, 7, 7, 2], "a", [-.1, 0., 0., -.2], model_mask=[True, False, False, True])
    batch = make_batch([None], [[tool_turn]])
    assert batch.response_mask.tolist() == [[True, False, False, True]]
    values = torch.tensor([[9., 1., 8., 8., 2.]])  # prompt of 1, then the response
    mask = torch.tensor([[0, 1, 0, 0, 1]], dtype=torch.bool)  # the collated batch's loss mask
    assert to_response_space(values, mask, batch.response_mask).tolist() == [[1., 0., 0., 2.]]
    failed = make_batch([None], [[tool_turn]], [RewardResult(0.0, 0.0, 0.0, error="scorer failed")])
    assert not failed.response_mask.any()  # its reward failed: no token of it counts, tool turns or not


def test_metrics_sink_and_report(tmp_path):
    sink = MetricsSink(tmp_path)
    for step in range(1, 6):
        sink.log(step, {"reward/all": step / 5, "accuracy/multiple_choice": step / 10, "val/accuracy/all": 0.5})
    sink.log(5, {"reward/all": 0.9})  # a resumed run logs step 5 again: the last one wins
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["reward/all"] == 0.9
    made = write_training_report(tmp_path, extra_markdown="| a | b |")
    assert made["reward"].stat().st_size > 1000 and made["accuracy"].exists()
    assert "| a | b |" in made["markdown"].read_text()


def test_console_line_names_sections_and_skips_missing_keys():
    metrics = {"reward/all": 0.5, "accuracy/all": 0.25, "accuracy/boolean": 1.0, "time/step": 0.3141}
    line = console_line(metrics, ("reward/all", "accuracy/all", "accuracy/boolean", "time/step", "kl/all"))
    assert line == "reward=0.5  accuracy=0.25  boolean=1  step=0.314"


def test_cosine_schedule_warmup_flat_part_and_decay():
    """training.lr_decay_start keeps the full rate for that fraction of the steps after warm-up,
    then decays by cosine to 0 at the last step; 0 is the plain cosine."""
    def factors(**training):
        cfg = Config(training=TrainingConfig(steps=110, lr_schedule="cosine", **training))
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = make_scheduler(opt, cfg)
        return [sched.lr_lambdas[0](s) for s in range(111)]

    plain, wsd = factors(warmup_steps=10), factors(warmup_steps=10, lr_decay_start=0.6)
    assert plain[:10] == wsd[:10] == [(s + 1) / 10 for s in range(10)]
    assert plain[10] == 1.0 and plain[60] == pytest.approx(0.5) and plain[110] == pytest.approx(0.0)
    assert wsd[10:71] == [1.0] * 61  # 60% of the 100 steps after warm-up at the full rate
    assert wsd[90] == pytest.approx(0.5) and wsd[110] == pytest.approx(0.0)
    assert all(a >= b for a, b in zip(wsd[70:], wsd[71:]))
    with pytest.raises(ValueError, match="lr_decay_start must be in"):
        factors(lr_decay_start=1.0)
