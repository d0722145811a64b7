"""Top-k/top-p sampling with P3O: the runner records each token's kept set, the learner renormalizes over it.

Pure torch against an enumerated small vocabulary (vLLM's own top-k/top-p masking as the sampler), the kept sets read
from vLLM-shaped log-prob candidates, their way through episodes and batches, the learner's compute core; then a
real vLLM-on-CPU rollout whose behavior log-probs equal the learner's renormalized ones at the same weights.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import ray
import torch

from rllib_p3o.core.columns import KEPT_OVERFLOW, KEPT_PAD, Columns, Record, kept_set_candidates
from rllib_p3o.data import batching
from rllib_p3o.data.episodes import Turn, completion_episode, episodes_to_records, multi_turn_episode
from rllib_p3o.learner.compute import (
    TOKEN_LOGP,
    TokenLogprobs,
    kept_set_logprobs,
    kept_set_overflow,
)
from rllib_p3o.runner.rollouts import kept_sets

V = 12


def _vllm_processed(logits, temperature, top_k=None, top_p=None):
    """vLLM's processed log-probs of a sampling step (``vllm.v1.sample``: temperature, then its top-k/top-p mask,
    then log-softmax), with vLLM's own masking function."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    z = logits.clone().float() / temperature
    k = None if top_k is None else torch.full((z.shape[0],), top_k, dtype=torch.long)
    p = None if top_p is None else torch.full((z.shape[0],), top_p, dtype=torch.float32)
    return apply_top_k_top_p_pytorch(z, k, p).log_softmax(-1)


def _kept(processed, width):
    """Each row's kept set as ids padded with KEPT_PAD, as the runner records it."""
    out = torch.full((processed.shape[0], width), KEPT_PAD, dtype=torch.long)
    for i, row in enumerate(processed):
        ids = torch.nonzero(torch.isfinite(row))[:, 0]
        out[i, : len(ids)] = ids
    return out


@pytest.mark.parametrize(
    "top_k, top_p, temperature", [(3, None, 1.0), (None, 0.8, 1.0), (5, 0.7, 1.0), (4, None, 0.7), (None, 0.9, 1.3)]
)
def test_renormalized_logprob_is_the_truncated_distribution_of_an_enumerated_vocabulary(
    processes, top_k, top_p, temperature
):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, V, generator=g, dtype=torch.float64) * 2
    processed = _vllm_processed(logits, temperature, top_k, top_p)
    kept = _kept(processed, V)
    for i in range(logits.shape[0]):
        # The truncated distribution, enumerated: p(v) over K, renormalized.
        probs = torch.softmax(logits[i] / temperature, -1)
        members = [v for v in range(V) if torch.isfinite(processed[i, v])]
        if top_k is not None and top_p is None:
            assert len(members) == top_k
        if top_p is not None:  # the smallest top set of mass >= top_p, of the top-k distribution (vLLM's rule)
            order = torch.argsort(probs, descending=True).tolist()
            assert sorted(members) == sorted(order[: len(members)])
            base = probs / probs[order[:top_k]].sum() if top_k else probs
            assert float(base[members].sum()) >= top_p - 1e-6
            assert float(base[members].sum() - base[members].min()) < top_p + 1e-6
        mass = float(probs[members].sum())
        for y in members:
            truncated = math.log(float(probs[y]) / mass)
            mine = kept_set_logprobs(logits[i : i + 1], torch.tensor([y]), kept[i : i + 1], temperature)
            assert float(mine) == pytest.approx(truncated, abs=1e-6)
            # learner == sampler: the ratio against the sampler's processed log-prob is 1.
            assert math.exp(float(mine) - float(processed[i, y])) == pytest.approx(1.0, abs=1e-5)
            # Without renormalization the ratio is the kept mass, < 1 (what the refusal was about).
            full = torch.log_softmax(logits[i] / temperature, -1)[y]
            assert math.exp(float(full - processed[i, y])) == pytest.approx(mass, abs=1e-5)


def test_positions_without_a_kept_set_keep_the_full_distribution_and_finite_gradients():
    logits = torch.randn(2, 3, V, generator=torch.Generator().manual_seed(1), requires_grad=True)
    targets = torch.tensor([[0, 1, 2], [3, 4, 5]])
    kept = torch.full((2, 3, 4), KEPT_PAD)
    kept[0, 0, :3] = torch.tensor([0, 7, 8])  # a kept set
    kept[1, 1, 0] = KEPT_OVERFLOW  # an overflowed one: full distribution here, out of the loss
    logp = kept_set_logprobs(logits, targets, kept)
    full = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(logp[0, 1:], full[0, 1:])
    torch.testing.assert_close(logp[1], full[1])
    expected = full[0, 0] - torch.logsumexp(torch.log_softmax(logits[0, 0], -1)[[0, 7, 8]], -1)
    torch.testing.assert_close(logp[0, 0], expected)
    logp.sum().backward()
    assert torch.isfinite(logits.grad).all()
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert kept_set_overflow(kept, mask).tolist() == [[False] * 3, [False, True, False]]


def _position(entries):
    return {t: SimpleNamespace(logprob=lp) for t, lp in entries.items()}


def test_kept_sets_from_vllm_candidates():
    """vLLM returns the sampled token and the top ``requested`` candidates of the processed distribution: -inf outside
    the kept set. Fewer finite than requested: the set; as many: it may be larger (overflow)."""
    inf = float("-inf")
    positions = [
        _position({3: -0.1, 5: -2.5, 1: inf, 2: inf}),  # |K| = 2 < 4 requested
        _position({7: 0.0, 0: inf, 1: inf, 2: inf}),  # |K| = 1
        _position({4: -1.0, 5: -1.2, 6: -1.4, 8: -1.6}),  # 4 finite of 4: overflow
    ]
    out = kept_sets([3, 7, 4], positions, requested=4)
    assert out.dtype == np.int32 and out.shape == (3, 2)
    assert out.tolist() == [[3, 5], [7, KEPT_PAD], [KEPT_OVERFLOW, KEPT_PAD]]
    assert kept_sets([3], positions[:1], requested=0) is None
    # What the runner asks for: one more than the largest set it records.
    assert kept_set_candidates(5, 1.0, 64) == 6
    assert kept_set_candidates(-1, 0.9, 64) == 65
    assert kept_set_candidates(100, 0.9, 64) == 65
    assert kept_set_candidates(-1, 1.0, 64) == 0 and kept_set_candidates(5, 1.0, 0) == 0


def test_kept_sets_travel_through_episodes_and_batches():
    single = completion_episode(
        prompt_ids=[1, 2],
        completion_ids=[3, 4, 5],
        behavior_logprobs=[-0.1, -0.2, -0.3],
        reward=1.0,
        weights_seq_no=0,
        group_id=0,
        kept_ids=np.array([[3, 9], [4, KEPT_PAD], [5, 6]]),
    )
    plain = completion_episode(
        prompt_ids=[1], completion_ids=[6], behavior_logprobs=[-0.5], reward=0.0, weights_seq_no=0, group_id=0
    )
    turns = [
        Turn([7], [-0.1], 0.0, [8, 9], kept_ids=np.array([[7, 1, 2]])),
        Turn([10], [-0.2], 1.0, [], kept_ids=np.array([[10]])),
    ]
    multi = multi_turn_episode(prompt_ids=[1], turns=turns, terminated=True, weights_seq_no=0, group_id=1)
    records = episodes_to_records([single, plain, multi])
    assert Record.KEPT_IDS not in records[1]  # untruncated: the episode carries no kept sets at all
    assert records[2][Record.KEPT_IDS].tolist() == [[7, 1, 2], [KEPT_PAD] * 3, [KEPT_PAD] * 3, [10, KEPT_PAD, KEPT_PAD]]
    for r in records:
        r[Record.ADVANTAGE] = 0.0
    batch = batching.pad_records(records, pad_id=0)
    kept = batch[Columns.KEPT_IDS]
    assert kept.shape == (3, 4, 3) and kept.dtype == np.int32
    assert kept[0, 1:4].tolist() == [[3, 9, KEPT_PAD], [4, KEPT_PAD, KEPT_PAD], [5, 6, KEPT_PAD]]
    assert (kept[0, 0] == KEPT_PAD).all() and (kept[1] == KEPT_PAD).all()
    assert kept[2, 0, 0] == 7 and kept[2, 3, 0] == 10
    # A part without kept sets (offline rows) joins one with them; widths and kept widths equalized with KEPT_PAD.
    offline = batching.pad_records([{**records[1], Record.KEPT_IDS: None}], pad_id=0, pad_to=8)
    assert offline[Columns.KEPT_IDS].shape == (1, 7, 0)
    joined = batching.concat_padded([batch, offline], pad_id=0)
    assert joined[Columns.KEPT_IDS].shape == (4, 4, 3)
    assert (joined[Columns.KEPT_IDS][3] == KEPT_PAD).all()
    wide = batching.fit_width(batch, 7, pad_id=0)
    assert wide[Columns.KEPT_IDS].shape == (3, 6, 3) and (wide[Columns.KEPT_IDS][:, 4:] == KEPT_PAD).all()


@pytest.mark.parametrize("pack", [False, True])
def test_the_compute_core_renormalizes_each_target_over_its_kept_set(tiny_model, pack):
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    core = TokenLogprobs(lm, pack_sequences=pack, length_buckets=1.0)  # buckets of one row each, or packed
    g = torch.Generator().manual_seed(0)
    vocab = lm.config.vocab_size
    ids = torch.randint(0, vocab, (3, 9), generator=g)
    attention = torch.ones_like(ids)
    attention[1, 6:] = 0
    attention[2, 4:] = 0
    kept = torch.full((3, 8, 4), KEPT_PAD)
    kept[:, :, 0] = ids[:, 1:]  # the target itself, and three others (some positions: none)
    kept[:, :, 1:] = torch.randint(0, vocab, (3, 8, 3), generator=g)
    kept[0, 2] = KEPT_PAD
    with torch.no_grad():
        out = core.token_logprobs(ids, attention, kept_ids=kept)[TOKEN_LOGP]
        logits = lm(input_ids=ids).logits[:, :-1]
    expected = kept_set_logprobs(logits, ids[:, 1:], kept)
    valid = attention[:, 1:].bool()
    torch.testing.assert_close(out[valid], expected[valid], atol=1e-5, rtol=1e-5)
    assert float(out[0, 2]) == pytest.approx(float(torch.log_softmax(logits[0, 2], -1)[ids[0, 3]]), abs=1e-5)
    assert core.packing is pack
    with torch.no_grad():  # an empty kept-set column: nothing renormalized
        plain = core.token_logprobs(ids, attention, kept_ids=kept[..., :0])[TOKEN_LOGP]
    full = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(plain[valid], full[valid], atol=1e-5, rtol=1e-5)


# -- real vLLM on CPU ---------------------------------------------------------------------------------------------------


def test_on_policy_rollouts_with_top_k_and_top_p_have_ratio_one(ray_session, tiny_untied_model):
    """The policy samples with top-k, a behavior model (the same weights) with top-p: the recorded behavior log-probs
    equal the learner's log-probs renormalized over the recorded kept sets (ESS 1), not its untruncated ones."""
    from transformers import AutoModelForCausalLM

    from rllib_p3o import P3OConfig
    from rllib_p3o.core import batch_stats
    from rllib_p3o.core.sources import POLICY_SOURCE_ID
    from rllib_p3o.runner.env_runner import VLLMEnvRunner
    from rllib_p3o.tasks import ArithmeticTask, arithmetic_reward

    task = ArithmeticTask()
    cfg = (
        P3OConfig()
        .environment(env_config={"dataset": task.train_rows()[:32], "reward_fn": arithmetic_reward})
        .training(
            model=tiny_untied_model,
            group_size=4,
            prompts_per_step=4,
            max_tokens=6,
            top_k=5,
            behavior_models=[{"model": tiny_untied_model, "name": "nucleus", "samples": 2, "top_p": 0.7, "top_k": -1}],
        )
        .env_runners(num_env_runners=1)
        .debugging(seed=3)
    )
    runner = ray.remote(num_cpus=1)(VLLMEnvRunner).remote(config=cfg, worker_index=1, num_workers=1)
    try:
        records = episodes_to_records(ray.get(runner.sample.remote()))
    finally:
        ray.get(runner.stop.remote())
        ray.kill(runner)
    for r in records:
        r[Record.ADVANTAGE] = 0.0
    batch = {k: torch.as_tensor(v) for k, v in batching.pad_records(records, pad_id=0).items()}
    mask = batch[Columns.COMPLETION_MASK].bool()
    kept = batch[Columns.KEPT_IDS]
    sizes = (kept >= 0).sum(-1)[mask]
    policy = mask & (batch[Columns.SOURCE_ID] == POLICY_SOURCE_ID)[:, None]
    nucleus = mask & ~policy
    assert policy.any() and nucleus.any()
    assert ((kept >= 0).sum(-1)[policy] == 5).all()  # top-k: k tokens kept
    assert ((sizes >= 1) & (sizes < 64)).all() and not kept_set_overflow(kept, mask).any()
    target_kept = (kept == batch[Columns.INPUT_IDS][:, 1:, None]).any(-1)
    assert target_kept[mask].all()  # each sampled token is in its kept set

    lm = AutoModelForCausalLM.from_pretrained(tiny_untied_model).eval()
    core = TokenLogprobs(lm)
    with torch.no_grad():
        renormalized = core.token_logprobs(batch[Columns.INPUT_IDS], batch[Columns.ATTENTION_MASK], kept_ids=kept)
        full = core.token_logprobs(batch[Columns.INPUT_IDS], batch[Columns.ATTENTION_MASK])
    behavior = batch[Columns.BEHAVIOR_LOGPROBS]
    gap = (renormalized[TOKEN_LOGP] - behavior)[mask].abs()
    assert float(gap.max()) < 1e-4, float(gap.max())
    print(
        f"kept sets: {int(mask.sum())} tokens, sizes {int(sizes.min())}-{int(sizes.max())}, max gap {float(gap.max()):.2e}"
    )
    for part in (policy, nucleus):
        log_ratio = renormalized[TOKEN_LOGP] - behavior
        ess = float(batch_stats.effective_sample_size_from_log_ratios(log_ratio, part, all_reduce=False))
        assert ess == pytest.approx(1.0, abs=1e-6)
    # The untruncated learner log-probs sit below the behavior ones by the kept mass (the old refusal's reason).
    assert float((full[TOKEN_LOGP] - behavior)[mask].max()) < 1e-4
    assert float((behavior - full[TOKEN_LOGP])[policy].mean()) > 1e-3
