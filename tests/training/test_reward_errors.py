"""A response whose reward function raised is not trained on as a reward 0: it keeps its place
with no tokens (out of the loss and its normaliser), its group's statistics ignore it, it is
counted in `reward/errors` and left out of the reward means; the scorer logs the sample id."""

import logging

import torch

from easyvideor1.algorithms import ADVANTAGES
from easyvideor1.prompts import Prompt
from easyvideor1.records import RewardResult, Rollout, Sample
from easyvideor1.rewards.batch import score_batch
from easyvideor1.training.groups import ScoredGroups, reward_metrics
from easyvideor1.training.sequences import make_batch


def _prompt(i):
    sample = Sample(problem=f"q{i}", answer="A", problem_type="multiple choice", problem_id=f"s{i}")
    return Prompt(sample=sample, frames=[], inputs=None)


def _groups(rewards, errors=()):
    prompts, groups, results = [], [], []
    for g, rs in enumerate(rewards):
        prompts.append(_prompt(g))
        groups.append([Rollout(g, [5 + k, 6, 7][: 1 + k % 3], "x", [-1.0] * (1 + k % 3)) for k in range(len(rs))])
        results.append([RewardResult(overall=r, accuracy=r, format=1.0,
                                     error="ValueError: boom" if (g, k) in errors else None)
                        for k, r in enumerate(rs)])
    return prompts, groups, results


def _advantages(prompts, groups, results, estimator):
    batch = make_batch(prompts, groups, [x for res in results for x in res])
    rewards = torch.tensor([x.overall for x in batch.results])
    adv = ADVANTAGES[estimator](rewards=rewards, group_ids=batch.statistics_group_ids(),
                                response_mask=batch.response_mask.float(), eps=1e-6)
    return batch, adv


def test_an_errored_response_is_masked_and_left_out_of_its_group():
    rewards = [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]]
    errored = (0, 2)
    prompts, groups, results = _groups(rewards, errors={errored})
    for estimator in ("grpo", "rloo", "dr_grpo", "reinforce_plus_plus"):
        batch, adv = _advantages(prompts, groups, results, estimator)
        assert batch.response_mask[2].sum() == 0 and batch.rollouts[2].finish_reason == "reward_error"
        assert torch.all(adv[2] == 0)
        # The same batch with the errored response removed altogether: the others' advantages agree.
        p2, g2, r2 = _groups(rewards)
        del g2[0][2], r2[0][2]
        _, expected = _advantages(p2, g2, r2, estimator)
        keep = [0, 1, 3, 4, 5, 6, 7]
        width = expected.shape[1]
        # float32 results of the same float64 statistics: equal up to rounding of the last bit
        torch.testing.assert_close(adv[keep][:, :width], expected, rtol=1e-6, atol=1e-7)
    # No error: the batch is exactly what it was (group ids, tokens, masks).
    p3, g3, r3 = _groups(rewards)
    plain = make_batch(p3, g3, [x for res in r3 for x in res])
    assert plain.reward_error is None and plain.statistics_group_ids() is plain.group_ids
    assert [r.token_ids for r in plain.rollouts] == [r.token_ids for grp in g3 for r in grp]


def test_errors_are_counted_not_averaged_in():
    prompts, groups, results = _groups([[1.0, 0.0, 1.0, 1.0]], errors={(0, 1)})
    m = reward_metrics(ScoredGroups(prompts, groups, results))
    assert m["reward/errors"] == 1.0 and m["reward/all"] == 1.0


def test_a_raising_scorer_is_reported_with_the_sample_id(caplog):
    samples = [Sample(problem="q", answer="A", problem_type="multiple choice", problem_id="ok-1"),
               Sample(problem="q", answer="[[bad", problem_type="spatial grounding", problem_id="bad-7")]
    with caplog.at_level(logging.WARNING):
        results = score_batch(["<answer>A</answer>", "<answer>[1, 2, 3, 4]</answer>"], samples, workers=0)
    assert results[0].error is None and results[0].overall > 0
    assert results[1].error is not None and "'bad-7'" in results[1].error
    assert "'bad-7'" in caplog.text
