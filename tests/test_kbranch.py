"""kbranch: k = 1 is Packed-SS call for call; k >= 2 adds branches that are kept when their outcome occurs.

Exactness (greedy and sampling) is covered by tests/test_exactness.py and tests/test_distribution.py; these
tests check the plans themselves and that both families' layouts give each group the context it names.
"""

from __future__ import annotations

import pytest
import torch

from decoding_helpers import FAMILIES, SETDLM, eos_ids, generate, tiny_model
from specframe import compose
from specframe.errors import ConfigError
from specframe.plan import CallPlan, DraftGroup
from specframe.schedules.kbranch import KBranchSchedule, branch_for

VOCAB = 24
PROMPTS = ([3, 5, 7], [9], [1, 2, 11, 4, 6, 8], [13, 13, 2])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("kbranch")
    return {family: tiny_model(family, root / family, vocab=VOCAB, seed=1) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("width", [1, 3, 8])
def test_k1_makes_exactly_packed_calls(models, family, width):
    with eos_ids(models[family], ()):
        for prompt in PROMPTS:
            packed = generate(models[family], "packed", prompt, 30, width=width)
            single = generate(models[family], {"name": "kbranch", "k": 1}, prompt, 30, width=width)
            assert single.output_ids == packed.output_ids
            assert single.metrics.nfe == packed.metrics.nfe
            assert single.metrics.rows_per_call == packed.metrics.rows_per_call
            assert single.metrics.accept_lengths == packed.metrics.accept_lengths


class Spy(KBranchSchedule):
    """Records each plan's groups, the outcome, which group was kept and the next chain length."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self.log: list[tuple[CallPlan, int, int]] = []

    def update(self, state, plan, result):
        verdict = super().update(state, plan, result)
        accepted = verdict.accepted
        outcome = accepted + (plan.num_verify > accepted)  # the verifier adds a token unless all ranks held drafts
        self.log.append((plan, outcome, branch_for(plan, outcome)))
        return verdict


def _spied(model, k, prompt, width, length=40):
    decoder = compose({"model": model, "schedule": "kbranch", "width": width, "max_new_tokens": length})
    spy = Spy(k)
    decoder.schedule = spy
    return decoder.generate(prompt_ids=prompt), spy.log


@pytest.mark.parametrize("family", FAMILIES)
def test_branches_cover_the_longest_outcomes_and_are_kept_when_they_occur(models, family):
    width, k = 5, 3
    kept_branch = 0
    with eos_ids(models[family], ()):
        for prompt in PROMPTS:
            _, log = _spied(models[family], k, prompt, width)
            for plan, outcome, group in log[1:]:
                m = plan.num_verify
                assert plan.drafts[0].context == 0
                expected = [a for a in range(m, 1, -1)][: k - 1]
                planned = [m - i + 1 for i in range(1, len(plan.drafts))]
                assert planned == expected
                for index, a in enumerate(planned, start=1):
                    assert plan.drafts[index].context == min(a - 1, len(plan.chain))
                    targets = plan.drafts[index].targets  # empty once the output's end is near
                    assert all(t > plan.order[a - 1] for t in targets)
                assert (group != 0) == (outcome in planned)
                kept_branch += group != 0
    assert kept_branch >= 3, "no branch was ever kept: the test model accepts too little"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_kept_branch_gives_the_next_call_a_full_window_chain(models, family):
    width = 4
    seen = 0
    with eos_ids(models[family], ()):
        for prompt in PROMPTS:
            _, log = _spied(models[family], 2, prompt, width, length=60)
            for (_, _, group), (following, _, _) in zip(log[1:], log[2:], strict=False):
                if group and len(following.order) >= width:  # Nemotron adds a bonus rank
                    assert len(following.chain) == width  # packed would have width - outcome drafts
                    seen += 1
    assert seen >= 2


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_per_call_grow_linearly_with_k(models, family):
    width = 6
    with eos_ids(models[family], ()):
        packed = max(generate(models[family], "packed", PROMPTS[2], 40, width=width).metrics.rows_per_call[1:])
        for k in (2, 3, 4):
            rows = generate(models[family], {"name": "kbranch", "k": k}, PROMPTS[2], 40, width=width)
            assert max(rows.metrics.rows_per_call[1:]) <= packed + (k - 1) * (width + 2)


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "2"])
def test_bad_k_is_a_config_error(models, k):
    with pytest.raises(ConfigError, match="kbranch.*k must be an integer >= 1"):
        compose({"model": models[SETDLM], "schedule": {"name": "kbranch", "k": k}})


def _plan_with_groups(first: int, width: int, contexts: tuple[int, ...]) -> CallPlan:
    order = tuple(range(first, first + width))
    chain = tuple(3 + i for i in range(width - 1))
    groups = [DraftGroup(0, order)]
    for c in contexts:
        groups.append(DraftGroup(c, tuple(range(first + c + 1, first + c + 1 + width))))
    return CallPlan(((first - 1, 2),), order, chain, width, tuple(groups), width)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_lays_several_groups_with_their_own_contexts(models, family):
    """Each group's rows see the pending token and exactly its first ``context`` chain tokens."""
    model = models[family]
    decoder = compose({"model": model, "schedule": "kbranch"})
    first, width, contexts = 5, 4, (3, 2, 1)
    plan = _plan_with_groups(first, width, contexts)
    call = decoder.builder.build(plan)
    clean = {}  # position -> row of the clean (pending or chain) token
    for row, (token, position) in enumerate(zip(call.input_ids.tolist(), call.position_ids.tolist(), strict=True)):
        if token != model.mask_token_id and position not in clean:
            clean[position] = row
    for index, group in enumerate(plan.drafts):
        rows = call.output_rows[call.draft_rows[index]]
        visible = {p for p, r in clean.items() if bool(call.attention[rows[0], r])}
        context_end = first - 1 + group.context
        seen_clean = {p for p in visible if call.input_ids[clean[p]] != model.mask_token_id}
        assert seen_clean == set(range(first - 1, context_end + 1)), (index, group)
        assert torch.equal(call.position_ids[rows], torch.tensor(group.targets))
