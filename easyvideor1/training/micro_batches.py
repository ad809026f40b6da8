"""Micro-batches of a pass: a fixed count of sequences, or packed up to a token budget.

`training.micro_batch_tokens` > 0 packs a pass's responses into micro-batches of at most that
many *computed* tokens instead of `micro_batch_size` sequences. A unit is one response (its
prompt + response row) or, with `ForwardContext.shared_prefix`, one group (prompt once + its
responses: one row, so sharing stays complete). A micro-batch computes the sum of its rows'
lengths when packed (padding-free) and rows x its longest row when padded; that is its cost.

The rule is deterministic: units longest first, each into the first micro-batch it fits in
(first-fit decreasing). A unit over the budget gets a micro-batch of its own (warned once per
sample). Then every data-parallel rank makes the same number of micro-batches, because under
FSDP2 each forward and backward is a collective: the count is the largest over the ranks
(`distributed.max_int`, one call per planned pass, on every rank), and a rank with fewer splits
its costliest micro-batch in two (balanced, longest first into the lighter half) until it has as
many. A rank that holds fewer units than that count (never in the trainer, whose ranks hold the
same number of groups and responses) runs *filler* micro-batches: its cheapest unit again, with
its loss multiplied by zero and kept out of the normaliser and the metrics, only so that the
collectives match.

The loss stays exact whatever the split: the normaliser (`algorithms.loss_normalizer`) counts
tokens or sequences row by row, so any partition of the same responses gives the same count.

Responses are trained on the rank that built their prompt (its pixels live there), so tokens
are balanced across ranks earlier, when the step's samples are handed out (`training.rank_balance`);
here ranks are equalised in micro-batch count and tokens balanced within each rank.
`perf/rank_token_imbalance` (max / mean of the computed tokens per rank) shows what is left.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from easyvideor1 import distributed

log = logging.getLogger(__name__)

_warned: set[str] = set()  # samples already warned about being over the budget


@dataclass(frozen=True)
class Unit:
    """What stays in one micro-batch: one response, or one group of responses sharing its prompt."""

    indices: tuple[int, ...]
    """Response indices, in batch order."""
    tokens: int
    """Tokens of its row: prompt + response; a group row: the prompt once + every response."""
    name: str = ""
    """Its sample id (for the over-budget warning)."""


@dataclass(frozen=True)
class MicroBatch:
    """One forward (and backward) of a pass."""

    units: tuple[Unit, ...]
    cost: int
    """Computed tokens: sum of row lengths when packed, rows x longest row when padded."""
    filler: bool = False
    """Only there to match the other ranks' collectives: its loss counts zero (module docstring)."""

    @property
    def indices(self) -> list[int]:
        """Response indices, unit by unit in batch order (a group's responses stay contiguous)."""
        return [i for u in sorted(self.units, key=lambda u: u.indices[0]) for i in u.indices]

    @property
    def tokens(self) -> int:
        """Real (non-padding) tokens; 0 for a filler."""
        return 0 if self.filler else sum(u.tokens for u in self.units)


def token_cost(lengths: Sequence[int], packed: bool) -> int:
    """Tokens computed for rows of `lengths`: their sum when packed, rows x longest when padded."""
    if not lengths:
        return 0
    return sum(lengths) if packed else len(lengths) * max(lengths)


def response_units(indices: Sequence[int], group_ids: Sequence[int], row_tokens: Sequence[int],
                   names: Sequence[str], prompt_tokens: Sequence[int] | None = None) -> list[Unit]:
    """Units of responses `indices`: one per response (`prompt_tokens` None; `row_tokens[i]` is
    response i's prompt + response length), or one per run of consecutive responses of one group
    (`prompt_tokens[g]` the prompt length of group g, `row_tokens[i]` response i's length)."""
    if prompt_tokens is None:
        return [Unit((i,), int(row_tokens[i]), names[i]) for i in indices]
    runs: list[list[int]] = []
    for i in indices:
        if runs and group_ids[runs[-1][-1]] == group_ids[i]:
            runs[-1].append(i)
        else:
            runs.append([i])
    return [Unit(tuple(r), int(prompt_tokens[group_ids[r[0]]]) + sum(int(row_tokens[i]) for i in r), names[r[0]])
            for r in runs]


def micro_batch(units: Sequence[Unit], packed: bool, filler: bool = False) -> MicroBatch:
    """The micro-batch of `units`, its cost computed."""
    return MicroBatch(tuple(units), token_cost([u.tokens for u in units], packed), filler)


def _longest_first(units: Sequence[Unit]) -> list[Unit]:
    return sorted(units, key=lambda u: (-u.tokens, u.indices[0]))


def pack_units(units: Sequence[Unit], budget: int, packed: bool) -> list[MicroBatch]:
    """First-fit decreasing of `units` into micro-batches of at most `budget` computed tokens."""
    if budget < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1 to pack, got {budget}")
    bins: list[list[Unit]] = []
    for u in _longest_first(units):
        if u.tokens > budget:
            if u.name not in _warned:
                _warned.add(u.name)
                log.warning("sample %r: %d tokens in one row, over training.micro_batch_tokens=%d; it gets a "
                            "micro-batch of its own (raise the budget if memory allows)", u.name, u.tokens, budget)
            bins.append([u])
            continue
        for b in bins:
            if token_cost([x.tokens for x in b] + [u.tokens], packed) <= budget:
                b.append(u)
                break
        else:
            bins.append([u])
    return [micro_batch(b, packed) for b in bins]


def split_micro_batch(mb: MicroBatch, packed: bool) -> tuple[MicroBatch, MicroBatch]:
    """`mb` (2+ units) in two: longest first, each unit into the half that costs less so far."""
    halves: tuple[list[Unit], list[Unit]] = ([], [])
    for u in _longest_first(mb.units):  # ties go to the half with fewer units, so neither stays empty
        k = min((0, 1), key=lambda k: (token_cost([x.tokens for x in halves[k]] + [u.tokens], packed), len(halves[k])))
        halves[k].append(u)
    return micro_batch(halves[0], packed), micro_batch(halves[1], packed)


def equalize_count(micros: list[MicroBatch], count: int, packed: bool) -> list[MicroBatch]:
    """`micros` grown to `count` micro-batches: split the costliest splittable one until there are
    as many, then, when none splits, add fillers (the cheapest unit again, loss times zero)."""
    out = list(micros)
    while len(out) < count:
        splittable = [k for k, m in enumerate(out) if len(m.units) > 1]
        if not splittable:
            break
        k = max(splittable, key=lambda k: (out[k].cost, -k))
        out[k:k + 1] = split_micro_batch(out[k], packed)
    if len(out) < count:
        units = [u for m in out for u in m.units]
        if not units:
            raise ValueError("this rank has no responses in a pass the other ranks run: nothing to fill in with")
        cheapest = min(units, key=lambda u: (u.tokens, u.indices[0]))
        out += [micro_batch([cheapest], packed, filler=True)] * (count - len(out))
    return out


def plan_micro_batches(units: Sequence[Unit], budget: int, packed: bool) -> list[MicroBatch]:
    """Micro-batches of `units` within `budget` tokens, as many on every rank (module docstring)."""
    micros = pack_units(units, budget, packed)
    return equalize_count(micros, distributed.max_int(len(micros)), packed)


def balance_metrics(micros: Sequence[MicroBatch]) -> dict[str, float]:
    """Over every rank (two collectives, on every rank): computed tokens per rank max / mean
    (`perf/rank_token_imbalance`), the share of computed tokens that are padding or fillers
    (`perf/padding_fraction`), and micro-batches per rank (`perf/micro_batches`)."""
    computed = float(sum(m.cost for m in micros))
    real = float(sum(m.tokens for m in micros))
    total, real_total, count = distributed.all_reduce_floats([computed, real, float(len(micros))])
    top = distributed.all_reduce_floats([computed], "max")[0]
    world = distributed.world_size()
    return {"perf/rank_token_imbalance": top / (total / world) if total else 1.0,
            "perf/padding_fraction": 1.0 - real_total / total if total else 0.0,
            "perf/micro_batches": count / world}
