"""Precision as deployed: a mixed-precision learner (fp32 master weights, bf16 autocast), rollouts in their own dtype
(bf16, simulated FP8), syncs checked across dtypes, and the training-inference mismatch metrics.

The unit tests at the top need no Ray; the rest run the real learner group, vLLM runner and probe check."""

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.core.precision import RolloutWeights, fp8_round_per_channel, is_linear_weight
from rllib_p3o.sync.probe import WeightSyncError


def test_fp8_rounding_matches_a_hand_computed_example():
    # Row 0: amax 1 -> scale 1/448; w/scale = 448, 134.4, -313.6. e4m3 keeps 3 mantissa bits: 134.4 lies between
    # 128 and 144 (spacing 16) -> 128; -313.6 between -288 and -320 (spacing 32) -> -320. Row 1 (zeros) stays zero.
    # Row 2: amax 2 -> scale 2/448; -0.02/scale = -4.48, between -4.5 and -4.0 (spacing 0.5) -> -4.5.
    w = torch.tensor([[1.0, 0.3, -0.7], [0.0, 0.0, 0.0], [2.0, -0.02, 0.5]])
    expected = torch.tensor(
        [[1.0, 128 / 448, -320 / 448], [0.0, 0.0, 0.0], [2.0, -4.5 * 2 / 448, 0.5]], dtype=torch.float32
    )
    torch.testing.assert_close(fp8_round_per_channel(w), expected, rtol=0, atol=1e-7)
    assert fp8_round_per_channel(w.to(torch.bfloat16)).dtype == torch.bfloat16


def test_rollout_weights_round_linear_weights_only_and_cast_every_float():
    state = {
        "lm.model.embed_tokens.weight": torch.full((4, 3), 0.3),
        "lm.model.layers.0.self_attn.q_proj.weight": torch.tensor([[1.0, 0.3, -0.7]]),
        "lm.model.layers.0.self_attn.q_proj.bias": torch.tensor([0.3]),
        "lm.lm_head.weight": torch.full((4, 3), 0.3),
        "lm.model.rotary.inv_freq_count": torch.tensor([3]),
    }
    out = RolloutWeights("bfloat16", fp8_simulated=True).apply(state)
    assert out["lm.model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert float(out["lm.model.layers.0.self_attn.q_proj.weight"][0, 1]) == pytest.approx(128 / 448, abs=2e-3)
    for name in ("lm.model.embed_tokens.weight", "lm.lm_head.weight", "lm.model.layers.0.self_attn.q_proj.bias"):
        assert float(out[name].flatten()[0]) == pytest.approx(0.3, abs=2e-3)  # bf16 of 0.3, not FP8's 0.3 -> 0.29
    assert out["lm.model.rotary.inv_freq_count"].dtype == torch.int64
    assert is_linear_weight("model.layers.3.mlp.down_proj.weight", torch.zeros(2, 2))
    assert not RolloutWeights("float32").changes("float32") and RolloutWeights("bfloat16").changes("float32")


def test_the_probe_check_bounds_each_token_by_rtol_and_the_mean_by_atol_and_lets_isolated_outliers_pass():
    from rllib_p3o.sync.probe import check_probe

    learner = np.array([-10.0, -1.0] + [-2.0] * 10)  # 12 tokens, as the demo's probe

    def engine(*changes):
        out = learner.copy()
        for i, delta in changes:
            out[i] += delta
        return out

    # One unlikely token off by 0.5 (allowed there: 0.08 + 0.1 * 10), the others close: rounding, accepted.
    assert check_probe(engine((0, -0.5), (2, 0.01)), learner, 0.08, "runner 1:", rtol=0.1) == pytest.approx(0.5)
    # One token a little past its bound (0.2 where 0.18 is allowed): an isolated rounding outlier, accepted.
    assert check_probe(engine((1, -0.2)), learner, 0.08, "runner 1:", rtol=0.1) == pytest.approx(0.2)
    with pytest.raises(WeightSyncError, match=r"runner 1: the engine's log-prob of probe token 1 differs .* by 2\.5"):
        check_probe(engine((0, -2.5)), learner, 0.08, "runner 1:", rtol=0.1)  # beyond twice its bound (2.16)
    with pytest.raises(WeightSyncError, match=r"2 of 12 tokens beyond their bound, at most 1"):
        check_probe(engine((1, -0.2), (2, 0.3)), learner, 0.08, "runner 1:", rtol=0.1)  # two outliers
    # A float32 engine (rtol 0): every token keeps its bound.
    with pytest.raises(WeightSyncError, match=r"probe token 2 differs from the learner's by 0\.002 "):
        check_probe(engine((1, 0.002)), learner, 1e-3, "runner 1:")
    # Every token a little off (each within its bound): a wrong sync, caught by the mean.
    with pytest.raises(WeightSyncError, match=r"the 12 probe tokens differ from the learner's by 0\.15 on average"):
        check_probe(learner - 0.15, learner, 0.08, "runner 1:", rtol=0.1)
    with pytest.raises(WeightSyncError, match="probe token 2 differs from the learner's by nan"):
        check_probe(engine((1, float("nan"))), learner, 0.08, "runner 1:", rtol=0.1)
    assert P3OConfig().training(rollout_dtype="bfloat16").resolved_weight_sync_rtol == 0.1
    assert P3OConfig().resolved_weight_sync_rtol == 0.0 and P3OConfig().resolved_weight_sync_tolerance == 1e-3


def test_precision_settings_are_validated():
    cfg = P3OConfig().training(precision="bf16-mixed")
    assert cfg.rollout_weights == RolloutWeights("bfloat16")  # default: the learner's compute dtype
    assert cfg.lm_model_config()["dtype"] == "float32"  # master weights
    assert P3OConfig().training(rollout_quantization="fp8_simulated").rollout_weights.fp8_simulated
    for bad, match in [
        (dict(precision="bf16_mixed"), "precision must be one of"),
        (dict(rollout_dtype="fp8"), "rollout_dtype must be one of"),
        (dict(rollout_quantization="int4"), "rollout_quantization must be one of"),
        (dict(rollout_quantization="fp8_simulated", lora={"r": 4}), "LoRA"),
    ]:
        with pytest.raises(ValueError, match=match):
            P3OConfig().training(model="/m", **bad).validate()


# -- the learner ------------------------------------------------------------------------------------------------------


def _learner_group(model_path, num_learners, **training):
    from rllib_p3o.runner.env import TextEnv

    spaces = {DEFAULT_MODULE_ID: (TextEnv.observation_space_default(), TextEnv.action_space_default())}
    config = (
        P3OConfig().training(model=model_path, lr=3e-3, grad_clip=1e6, **training).learners(num_learners=num_learners)
    )
    return config.build_learner_group(spaces=spaces)


def test_bf16_mixed_keeps_fp32_master_weights_and_optimizer_state(ray_session, tiny_model):
    from test_learner import _fixed_batch

    lg = _learner_group(tiny_model, 0, precision="bf16-mixed")
    try:
        batch = _fixed_batch(tiny_model, behavior_shift=0.3)
        before = {k: v.clone() for k, v in lg._learner.module[DEFAULT_MODULE_ID].state_dict().items()}
        lg.update(batch=batch)
        learner = lg._learner
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        params = dict(module.named_parameters())
        assert {p.dtype for p in params.values()} == {torch.float32}
        assert any(not torch.equal(before[k], v) for k, v in module.state_dict().items())  # it trained
        optim_state = next(iter(learner._named_optimizers.values())).state
        assert {t.dtype for s in optim_state.values() for t in s.values() if t.dim() > 0} == {torch.float32}
        checkpoint = lg.get_state(components="learner/rl_module")["learner"]["rl_module"][DEFAULT_MODULE_ID]
        assert {torch.as_tensor(v).dtype for v in checkpoint.values() if torch.as_tensor(v).is_floating_point()} == {
            torch.float32
        }
        # The forward runs under bf16 autocast: its log-probs differ from the same fp32 weights' fp32 forward.
        ids = torch.tensor([[3, 5, 7, 9, 11, 4, 6, 8]])
        mixed = module.token_logprobs(ids, torch.ones_like(ids))["token_logp"]
        module._autocast = None
        plain = module.token_logprobs(ids, torch.ones_like(ids))["token_logp"]
        assert 1e-5 < float((mixed - plain).abs().max()) < 0.1
    finally:
        lg.shutdown()


def test_bf16_mixed_two_learners_share_the_ess_and_match_one_learner(ray_session, tiny_model):
    """One step on identical weights: 2 gloo DDP learners (4+4 rows) under bf16-mixed report the same ESS as each
    other and as 1 learner on all 8 rows."""
    from test_learner import _fixed_batch, _per_learner

    batch = _fixed_batch(tiny_model, behavior_shift=0.8, seed=5)
    figures = {}
    for n in (0, 2):
        lg = _learner_group(tiny_model, n, precision="bf16-mixed")
        try:
            results = lg.update(batch=batch)
            figures[n] = (
                _per_learner(results, m.ESS),
                _per_learner(results, "gradients_default_optimizer_global_norm"),
            )
        finally:
            lg.shutdown()
    (ess1,), (gn1,) = figures[0]
    ess2, gn2 = figures[2]
    assert ess1 < 0.95 and len(ess2) == 2
    assert ess2[0] == ess2[1]  # one all-reduced statistic
    # bf16 rounds each matmul's output: shards of 4 rows and one batch of 8 need not round alike, so the match is
    # to bf16's precision, not to float32's.
    assert ess2 == pytest.approx([ess1, ess1], rel=1e-3)
    assert gn2 == pytest.approx([gn1, gn1], rel=2e-2)


# -- rollouts in their own precision, through the real runner ----------------------------------------------------------


def _algo_config(model, **training):
    from helpers import tiny_config

    return tiny_config(model, rows=64, eval_rows=16, max_tokens=6, eval_interval=0, seed=3, **training)


def _learner_metric(result, key):
    return float(result["learners"][DEFAULT_MODULE_ID][key])


def test_mismatch_metrics_read_zero_in_fp32_and_clearly_more_with_bf16_rollouts(ray_session, tiny_untied_model):
    figures = {}
    for rollout_dtype in ("float32", "bfloat16"):
        algo = _algo_config(tiny_untied_model, rollout_dtype=rollout_dtype).build_algo()
        try:
            for _ in range(2):
                result = algo.train()
                p3o = result[m.P3O]
                assert p3o[m.SYNC_PROBE_MAX_ABS_DIFF] < (
                    1e-3 if rollout_dtype == "float32" else 0.5
                )  # every sync checked
            figures[rollout_dtype] = {
                key: _learner_metric(result, key)
                for key in (m.MISMATCH_KL, m.MISMATCH_PROB_ABS_DIFF, m.MISMATCH_ESS, m.MISMATCH_NUM_TOKENS)
            }
            figures[rollout_dtype]["sync_bytes"] = p3o[m.SYNC_PREFIX + m.SYNC_BYTES]
        finally:
            algo.stop()
    fp32, bf16 = figures["float32"], figures["bfloat16"]
    assert fp32[m.MISMATCH_NUM_TOKENS] > 0 and bf16[m.MISMATCH_NUM_TOKENS] > 0
    assert fp32[m.MISMATCH_KL] < 1e-6 and fp32[m.MISMATCH_PROB_ABS_DIFF] < 1e-6 and 1 - fp32[m.MISMATCH_ESS] < 1e-6
    assert bf16[m.MISMATCH_KL] > 1e-5 and bf16[m.MISMATCH_PROB_ABS_DIFF] > 1e-4 and 1 - bf16[m.MISMATCH_ESS] > 1e-5
    assert bf16["sync_bytes"] == pytest.approx(fp32["sync_bytes"] / 2, rel=0.01)  # bf16 halves the payload


def test_a_bf16_rollout_run_trains_and_a_corrupted_bf16_sync_is_refused(ray_session, tiny_model, monkeypatch):
    """On the tied-embedding model (vLLM's tied-LM-head reload trap included)."""
    import rllib_p3o.driver.weight_sync as push

    algo = _algo_config(tiny_model, precision="bf16-mixed", rollout_dtype="bfloat16").build_algo()
    try:
        before = (
            algo.learner_group._learner.module[DEFAULT_MODULE_ID]
            .unwrapped()
            .state_dict()["lm.model.layers.0.mlp.down_proj.weight"]
            .clone()
        )
        for _ in range(2):
            result = algo.train()
            assert result[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 0.5
        after = (
            algo.learner_group._learner.module[DEFAULT_MODULE_ID]
            .unwrapped()
            .state_dict()["lm.model.layers.0.mlp.down_proj.weight"]
        )
        assert after.dtype == torch.float32 and not torch.equal(before, after)

        class Corrupted(push.PackedTensors):
            """The payload with one tensor corrupted on its way to the runners (the learner's probe is not)."""

            def __init__(self, tensors):
                tensors = dict(tensors)
                name = "lm.model.layers.0.mlp.down_proj.weight"
                generator = torch.Generator().manual_seed(0)
                tensors[name] = torch.randn(tensors[name].shape, generator=generator).to(tensors[name].dtype)
                super().__init__(tensors)

        monkeypatch.setattr(push, "PackedTensors", Corrupted)
        with pytest.raises(WeightSyncError, match=r"EnvRunner 1: with weights v\d+"):
            for _ in range(2):  # the push after this iteration is corrupted; the next one's samples are refused
                algo.train()
    finally:
        algo.stop()


def test_fp8_simulated_rollouts_are_rounded_and_checked(ray_session, tiny_model):
    algo = _algo_config(tiny_model, precision="bf16-mixed", rollout_quantization="fp8_simulated").build_algo()
    try:
        result = algo.train()
        assert result[m.P3O][m.ROLLOUT_FP8_SIMULATED] == 1.0
        assert result[m.P3O][m.SYNC_PROBE_MAX_ABS_DIFF] < 0.5
        assert _learner_metric(result, m.MISMATCH_KL) > 1e-6  # FP8-rounded weights are a real policy gap
        assert np.isfinite(_learner_metric(result, m.LOSS))
    finally:
        algo.stop()
