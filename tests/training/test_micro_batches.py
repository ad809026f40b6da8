"""The token-budget planner (`training.micro_batches`) on very unequal lengths: pure functions,
checked against hand-packed results. Gradients through it: tests/models/test_micro_batch_tokens.py;
ranks in step under FSDP2: tests/training/test_token_balance_distributed.py."""

import logging

import pytest

from easyvideor1.training import micro_batches as mb
from easyvideor1.training.micro_batches import (Unit, balance_metrics, equalize_count, micro_batch, pack_units,
                                               plan_micro_batches, response_units, split_micro_batch, token_cost)

LENGTHS = [4000, 200, 300, 3900, 250, 220, 1000]  # prompt + response rows, 200 to 4,000 tokens


def _units(lengths=LENGTHS):
    return [Unit((i,), n, f"s{i}") for i, n in enumerate(lengths)]


def _tokens(micros):
    return [sorted(u.tokens for u in m.units) for m in micros]


def _all_indices(micros):
    return sorted(i for m in micros if not m.filler for i in m.indices)


def test_cost_packed_is_the_sum_padded_is_rows_times_longest():
    assert token_cost([5, 3, 2], packed=True) == 10
    assert token_cost([5, 3, 2], packed=False) == 15
    assert token_cost([], packed=False) == 0


def test_first_fit_longest_first_packed():
    micros = pack_units(_units(), 4096, packed=True)
    # longest first: 4000 | 3900 | 1000 (+300 +250 +220 +200: neither big one has room for 300)
    assert _tokens(micros) == [[4000], [3900], [200, 220, 250, 300, 1000]]
    assert [m.cost for m in micros] == [4000, 3900, 1970]
    assert all(m.cost <= 4096 for m in micros)
    assert _all_indices(micros) == list(range(len(LENGTHS)))


def test_first_fit_longest_first_padded():
    micros = pack_units(_units(), 4096, packed=False)
    # padded rows cost rows x longest: 1000 takes 4 rows (4,000), the fifth (200) opens a new one
    assert _tokens(micros) == [[4000], [3900], [220, 250, 300, 1000], [200]]
    assert [m.cost for m in micros] == [4000, 3900, 4000, 200]


def test_unit_over_the_budget_runs_alone_and_is_named_once(caplog):
    mb._warned.discard("s0")
    with caplog.at_level(logging.WARNING, logger="easyvideor1.training.micro_batches"):
        micros = pack_units(_units(), 2000, packed=True)
        pack_units(_units(), 2000, packed=True)
    assert [4000] in _tokens(micros) and [3900] in _tokens(micros)
    assert all(m.cost <= 2000 for m in micros if len(m.units) > 1)
    warned = [r.getMessage() for r in caplog.records if "'s0'" in r.getMessage()]
    assert len(warned) == 1 and "4000 tokens" in warned[0]


def test_indices_come_back_in_batch_order_groups_contiguous():
    units = [Unit((4, 5), 50, "b"), Unit((0, 1, 2), 90, "a"), Unit((3,), 10, "c")]
    assert micro_batch(units, packed=True).indices == [0, 1, 2, 3, 4, 5]


def test_response_units_group_rows_hold_the_prompt_once():
    group_ids = [0, 0, 0, 1, 1, 2]
    responses = [10, 20, 0, 5, 5, 7]  # one empty response (a padding or reward-error slot)
    units = response_units([0, 1, 2, 3, 4, 5], group_ids, responses, ["a"] * 3 + ["b"] * 2 + ["c"],
                           prompt_tokens=[1000, 100, 30])
    assert [(u.indices, u.tokens, u.name) for u in units] == [((0, 1, 2), 1030, "a"), ((3, 4), 110, "b"),
                                                           ((5,), 37, "c")]
    # a mini-batch's indices are whole groups in batch order; without sharing, one unit per response
    single = response_units([3, 4], group_ids, [1005, 105, 130, 105, 105, 37], list("aaabbc"))
    assert [(u.indices, u.tokens) for u in single] == [((3,), 105), ((4,), 105)]


def test_split_balances_longest_first():
    a, b = split_micro_batch(micro_batch(_units([5, 4, 3, 3]), packed=True), packed=True)
    assert (sorted(u.tokens for u in a.units), sorted(u.tokens for u in b.units)) == ([3, 5], [3, 4])
    # equal lengths of zero tokens: ties go to the emptier half, neither half stays empty
    a, b = split_micro_batch(micro_batch(_units([0, 0]), packed=True), packed=True)
    assert len(a.units) == len(b.units) == 1


def test_equalize_splits_the_costliest_then_adds_fillers():
    short = _units([200, 220, 250, 300])  # the short rank: one micro-batch under a 4,096 budget
    micros = pack_units(short, 4096, packed=True)
    assert len(micros) == 1
    three = equalize_count(micros, 3, packed=True)
    assert len(three) == 3 and not any(m.filler for m in three)
    assert _all_indices(three) == [0, 1, 2, 3]
    # 970 -> [300, 200] + [250, 220] (balanced halves), then the costlier half again -> [300] + [200]
    assert sorted(m.cost for m in three) == [200, 300, 470]
    six = equalize_count(micros, 6, packed=True)  # more micro-batches than units: fillers
    assert len(six) == 6 and sum(m.filler for m in six) == 2
    assert _all_indices(six) == [0, 1, 2, 3]  # every real unit exactly once
    fillers = [m for m in six if m.filler]
    assert all(m.tokens == 0 and [u.tokens for u in m.units] == [200] for m in fillers)  # the cheapest unit
    assert equalize_count(micros, 1, packed=True) == micros


def test_equalize_with_nothing_to_fill_in_with_says_so():
    with pytest.raises(ValueError, match="no responses"):
        equalize_count([], 2, packed=True)


def test_plan_in_one_process_is_pack():
    assert plan_micro_batches(_units(), 4096, packed=True) == pack_units(_units(), 4096, packed=True)


def test_balance_metrics_in_one_process():
    micros = [micro_batch(_units([300, 100]), packed=False), micro_batch(_units([50]), packed=False)]
    out = balance_metrics(micros)
    assert out["perf/rank_token_imbalance"] == 1.0  # one rank is its own mean
    assert out["perf/padding_fraction"] == pytest.approx(1 - 450 / 650)  # costs 600 + 50, real 450
    assert out["perf/micro_batches"] == 2.0
