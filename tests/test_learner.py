"""P3O learner through a real RLlib LearnerGroup on a tiny HF model: local learner and 2 gloo DDP learners."""

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.core.losses import get_loss
from rllib_p3o.data.batching import pad_records, to_multi_agent_batch
from rllib_p3o.learner.rl_module import load_causal_lm
from rllib_p3o.runner.env import TextEnv

SPACES = {DEFAULT_MODULE_ID: (TextEnv.observation_space_default(), TextEnv.action_space_default())}


def _fixed_batch(model_path, rows=8, seed=0, behavior_shift=0.0, sources=None):
    """Random prompt/completion ids; behavior log-probs from the model itself (+ an optional shift)."""
    rng = np.random.default_rng(seed)
    lm = load_causal_lm(model_path)
    records = []
    for i in range(rows):
        p, c = int(rng.integers(3, 7)), int(rng.integers(2, 6))
        ids = rng.integers(2, lm.config.vocab_size, size=p + c)
        with torch.no_grad():
            logits = lm(input_ids=torch.as_tensor(ids)[None]).logits[0, :-1]
            lp = torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(ids[1:])[:, None])[:, 0].numpy()
        behavior = lp[p - 1 :] + behavior_shift * rng.standard_normal(c)
        records.append(
            {
                "prompt_ids": ids[:p],
                "completion_ids": ids[p:],
                "behavior_logprobs": behavior,
                "advantage": float(rng.standard_normal()),
                "source_id": sources[i] if sources else 0,
            }
        )
    return to_multi_agent_batch(pad_records(records, pad_id=0))


def _learner_group(model_path, num_learners, loss="p3o", ess_scope="batch"):
    # grad_clip so RLlib logs the (pre-clip) global gradient norm; 1e6 never clips.
    config = (
        P3OConfig()
        .training(
            model=model_path,
            loss=loss,
            lr=3e-3,
            grad_clip=1e6,
            loss_config={"ess_scope": ess_scope} if get_loss(loss).ess_scoped else {},
        )
        .learners(num_learners=num_learners)
    )
    return config.build_learner_group(spaces=SPACES)


def _weights(lg):
    state = lg.get_state(components="learner/rl_module")["learner"]["rl_module"][DEFAULT_MODULE_ID]
    return {k: torch.as_tensor(v).clone() for k, v in state.items()}


def _per_learner(results, key):
    return [float(r[DEFAULT_MODULE_ID][key].peek()) for r in results]


@pytest.mark.parametrize("num_learners", [0, 2])
def test_update_changes_weights_and_lowers_loss(ray_session, tiny_model, num_learners):
    lg = _learner_group(tiny_model, num_learners)
    try:
        batch = _fixed_batch(tiny_model, behavior_shift=0.3)
        before = _weights(lg)
        losses, ess = [], []
        for _ in range(6):
            results = lg.update(batch=batch)
            losses.append(np.mean(_per_learner(results, m.PG_LOSS)))
            ess.append(_per_learner(results, m.ESS))
        after = _weights(lg)
        changed = [k for k in before if not torch.equal(before[k], after[k])]
        assert len(changed) > len(before) // 2
        # The policy-gradient part falls; the KL term, a trust region toward π_b, may grow while six updates on one
        # batch move the policy away from π_b (with the unbiased k3_is it pulls back less than the plain k3 did).
        assert losses[-1] < losses[0] - 1e-3, losses
        # Every learner used the same (global) ESS.
        for per_step in ess:
            assert max(per_step) - min(per_step) < 1e-6
    finally:
        lg.shutdown()


@pytest.mark.parametrize("ess_scope", ["batch", "source"])
def test_two_learners_use_the_ess_of_the_union(ray_session, tiny_model, ess_scope):
    """Step 1 on identical weights: 2 learners (4+4 rows) report the ESS and gradient norm of 1 learner (8 rows).

    With ess_scope="source" the second learner's shard holds a source the first one lacks (shards are contiguous);
    both must still use the per-source ESS of the whole batch.
    """
    sources = [0, 0, 0, 0, 0, 0, 777, 777] if ess_scope == "source" else None
    batch = _fixed_batch(tiny_model, behavior_shift=0.8, seed=5, sources=sources)
    figures = {}
    for n in (0, 2):
        lg = _learner_group(tiny_model, n, ess_scope=ess_scope)
        try:
            results = lg.update(batch=batch)
            figures[n] = (
                _per_learner(results, m.ESS),
                _per_learner(results, m.NUM_TOKENS),
                _per_learner(results, "gradients_default_optimizer_global_norm"),
                _per_learner(results, m.KL_WEIGHT),
            )
        finally:
            lg.shutdown()
    (ess1,), (tok1,), (gn1,), (klw1,) = figures[0]
    ess2, tok2, gn2, klw2 = figures[2]
    assert len(ess2) == 2 and ess1 < 0.95
    assert ess2 == pytest.approx([ess1, ess1], rel=1e-6)
    assert tok2 == [tok1, tok1]
    # The DDP-averaged gradient (loss scaled by world size) equals the single-learner gradient.
    assert gn2 == pytest.approx([gn1, gn1], rel=1e-4)
    assert klw2 == pytest.approx([klw1, klw1], rel=1e-5)
    if ess_scope == "source":  # per-source ESS differs from the batch's, so the KL weight is not 1 - ESS
        assert abs(klw1 - (1 - ess1)) > 1e-3


def test_auto_anchor_computes_pi_old_only_for_batches_with_another_models_rows(ray_session, tiny_model):
    """P3O's default kl_anchor="auto": no extra forward pass on the policy's own rows (on-policy or stale); with a
    behavior model's rows in the batch the learner computes π_old, and those rows' KL is taken toward it."""
    from rllib_p3o.core.sources import behavior_source_name, source_id

    behavior = {"model": tiny_model, "name": "weak", "samples": 2}
    other = source_id(behavior_source_name(behavior))
    config = (
        P3OConfig()
        .training(model=tiny_model, lr=3e-3, grad_clip=1e6, behavior_models=[behavior], group_size=8)
        .learners(num_learners=0)
    )
    lg = config.build_learner_group(spaces=SPACES)
    try:
        own = lg.update(batch=_fixed_batch(tiny_model, behavior_shift=0.5, seed=3))
        assert m.OLD_LOGPROBS_S not in own[0][DEFAULT_MODULE_ID]
        mixed = _fixed_batch(tiny_model, behavior_shift=0.5, seed=3, sources=[0] * 6 + [other] * 2)
        assert _per_learner(lg.update(batch=mixed), m.OLD_LOGPROBS_S)[0] > 0
    finally:
        lg.shutdown()


def test_grpo_loss_runs_in_learner(ray_session, tiny_model):
    lg = _learner_group(tiny_model, 0, loss="grpo")
    try:
        results = lg.update(batch=_fixed_batch(tiny_model, behavior_shift=0.5))
        assert 0.0 <= _per_learner(results, m.CLIP_FRACTION)[0] <= 1.0
    finally:
        lg.shutdown()


def test_reference_kl_uses_the_frozen_initial_model(ray_session, tiny_model):
    """kl_ref_coeff > 0: the learner scores the batch under a frozen copy of the initial model (0 at step 1)."""
    config = P3OConfig().training(model=tiny_model, lr=3e-3, kl_ref_coeff=0.1, grad_clip=1e6).learners(num_learners=0)
    lg = config.build_learner_group(spaces=SPACES)
    try:
        batch = _fixed_batch(tiny_model, behavior_shift=0.3)
        kl = [_per_learner(lg.update(batch=batch), m.KL_REF)[0] for _ in range(4)]
    finally:
        lg.shutdown()
    assert kl[0] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first step
    assert kl[-1] > kl[0]  # the policy moved away from the frozen reference, which did not move


def test_unknown_ess_scope_is_refused(tiny_model):
    with pytest.raises(ValueError, match="ess_scope must be one of"):
        P3OConfig().training(model=tiny_model, loss_config={"ess_scope": "token"}).validate()


def test_bad_heldout_sampling_settings_are_refused(tiny_model):
    for bad, match in [
        (dict(eval_temperature=-0.5), "eval_temperature must be >= 0"),
        (dict(eval_samples_per_prompt=0), "eval_samples_per_prompt must be >= 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            P3OConfig().training(model=tiny_model, **bad).validate()


def test_nonfinite_step_is_skipped_weights_unchanged_and_repeated_ones_stop_the_run(ray_session, tiny_model):
    config = P3OConfig().training(model=tiny_model, lr=3e-3, max_consecutive_nonfinite_steps=2).learners(num_learners=0)
    lg = config.build_learner_group(spaces=SPACES)
    try:
        good = _fixed_batch(tiny_model, behavior_shift=0.3)
        bad = _fixed_batch(tiny_model, behavior_shift=0.3)
        bad.policy_batches[DEFAULT_MODULE_ID]["advantages"][2] = np.nan  # one poisoned row of the policy's samples
        before = _weights(lg)
        results = lg.update(batch=bad)
        assert results[0][DEFAULT_MODULE_ID][m.SKIPPED_NONFINITE_STEPS].peek() == 1
        after = _weights(lg)
        assert all(torch.equal(before[k], after[k]) for k in before)  # nothing reached the weights
        results = lg.update(batch=good)  # a finite step in between resets the count, and is applied
        assert results[0][DEFAULT_MODULE_ID][m.SKIPPED_NONFINITE_STEPS].peek() == 0
        assert any(not torch.equal(after[k], v) for k, v in _weights(lg).items())
        lg.update(batch=bad)
        with pytest.raises(
            Exception,
            match=r"2 optimizer steps in a row were skipped.*loss = nan.*"
            r"1 rows with non-finite advantages \(policy\)",
        ):
            lg.update(batch=bad)
    finally:
        lg.shutdown()
