"""Length buckets (`rllib_p3o.learner.length_buckets`): the plan is the cheapest split, covers every row once, and a
bucketed forward gives the padded forward's log-probs, P3O loss, ESS and gradients on rows of spread lengths."""

import itertools

import numpy as np
import pytest
import torch
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_p3o import P3OConfig
from rllib_p3o.core.losses.p3o import p3o_loss
from rllib_p3o.learner.length_buckets import (
    DEFAULT_CALL_COST_TOKENS,
    Bucket,
    bucket_call_cost,
    padding_share,
    plan_buckets,
)
from rllib_p3o.learner.rl_module import (
    LONGEST_ROW_POSITIONS,
    REAL_TOKENS,
    TOKEN_LOGP,
    TOKEN_POSITIONS,
    HFCausalLMRLModule,
)
from rllib_p3o.runner.env import TextEnv


def _cost(lengths, buckets, call_cost):
    return sum(len(b.rows) * b.width + call_cost for b in buckets)


def _brute_force_cost(lengths, call_cost):
    """Least cost over every split of the sorted distinct lengths into contiguous groups."""
    widths, counts = np.unique(lengths, return_counts=True)
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=len(widths) - 1):
        cost, rows = 0.0, 0
        for i, (w, c) in enumerate(zip(widths, counts)):
            rows += c
            if i == len(widths) - 1 or cuts[i]:
                cost += rows * w + call_cost
                rows = 0
        best = min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(5))
def test_plan_is_the_cheapest_split_and_covers_every_row_once(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.choice(rng.integers(1, 60, size=10), size=int(rng.integers(1, 40)))  # <= 10 distinct: 2^9 splits
    call_cost = float(rng.choice([0, 5, 40, 300]))
    buckets = plan_buckets(lengths, call_cost)
    assert sorted(np.concatenate([b.rows for b in buckets]).tolist()) == list(range(len(lengths)))
    for b in buckets:
        assert b.width == lengths[b.rows].max()  # each bucket is trimmed to its own longest row
    assert [b.width for b in buckets] == sorted(b.width for b in buckets)
    assert _cost(lengths, buckets, call_cost) == pytest.approx(_brute_force_cost(lengths, call_cost))


def test_call_cost_sets_how_many_buckets():
    lengths = [3, 3, 10, 10, 40, 40]
    assert len(plan_buckets(lengths, call_cost=float("inf"))) == 1  # one call: the padded batch
    assert [b.width for b in plan_buckets(lengths, call_cost=0)] == [3, 10, 40]  # no padding at all
    assert padding_share(lengths, [Bucket(np.arange(6), 40)]) == pytest.approx(1 - 106 / 240)
    assert padding_share(lengths, plan_buckets(lengths, call_cost=0)) == 0.0


@pytest.fixture(scope="module")
def module(tiny_model):
    spec = RLModuleSpec(
        module_class=HFCausalLMRLModule,
        observation_space=TextEnv.observation_space_default(),
        action_space=TextEnv.action_space_default(),
        model_config={"model": tiny_model},
    )
    return spec.build()


def test_the_length_buckets_setting_and_its_validation(tiny_model):
    assert bucket_call_cost(True) == DEFAULT_CALL_COST_TOKENS
    assert bucket_call_cost(False) == float("inf")
    assert bucket_call_cost(0) == 0.0 and bucket_call_cost(300) == 300.0
    config = P3OConfig().environment(env_config={"dataset": [{"prompt": "1+1="}]}).training(model=tiny_model)
    config.rl_module(model_config={"length_buckets": 64}).validate()
    for bad in ("yes", -1):
        with pytest.raises(ValueError, match="length_buckets must be True, False or a call cost"):
            config.copy(copy_frozen=False).rl_module(model_config={"length_buckets": bad}).validate()


def test_bucketed_forward_equals_the_padded_one_in_logprobs_loss_ess_and_gradients(module):
    g = torch.Generator().manual_seed(0)
    rows, width, prompt = 24, 48, 6
    lengths = torch.randint(prompt + 1, width + 1, (rows,), generator=g)
    lengths[0] = width  # the batch is as wide as its longest row
    ids = torch.randint(2, module.lm.config.vocab_size, (rows, width), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    completion = torch.zeros(rows, width - 1)
    for i, n in enumerate(lengths.tolist()):
        completion[i, prompt - 1 : n - 1] = 1.0
    behavior = -torch.rand(rows, width - 1, generator=g) * 3
    advantages = torch.randn(rows, generator=g)

    def run(call_cost):
        module.bucket_call_cost = call_cost
        module.lm.zero_grad()
        out = module.forward_train({"input_ids": ids, "attention_mask": mask})
        loss, stats = p3o_loss(out[TOKEN_LOGP], behavior, advantages, completion.bool())
        loss.backward()
        grads = {n: p.grad.clone() for n, p in module.lm.named_parameters()}
        return out, loss.detach(), stats["ess"], grads

    padded, loss_p, ess_p, grads_p = run(float("inf"))
    bucketed, loss_b, ess_b, grads_b = run(0.0)
    assert padded[TOKEN_POSITIONS] == rows * width
    assert bucketed[REAL_TOKENS] == float(lengths.sum())
    assert bucketed[TOKEN_POSITIONS] == float(lengths.sum())  # call cost 0: a bucket per length, no padding
    assert bucketed[LONGEST_ROW_POSITIONS] == padded[LONGEST_ROW_POSITIONS] == rows * lengths.max()
    valid = completion.bool()
    torch.testing.assert_close(bucketed[TOKEN_LOGP][valid], padded[TOKEN_LOGP][valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_b, loss_p, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ess_b, ess_p, atol=1e-7, rtol=1e-6)
    for name, grad in grads_p.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-6, rtol=1e-4, msg=name)
    # The rows are really permuted and trimmed: a wrong inverse permutation would move log-probs between rows.
    assert not torch.allclose(bucketed[TOKEN_LOGP][1], bucketed[TOKEN_LOGP][2])
