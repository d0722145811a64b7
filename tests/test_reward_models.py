"""Reward models served by Ray actors (``env_config["reward_models"]``): a tiny local sequence classifier and a tiny
generative judge (vLLM in its actor) score completions beside a rule reward in real P3O training (Ray, RLlib, vLLM,
transformers), each equal to the model's own scores computed here with transformers, and the reward is the
by-hand combination, and a dead or slow actor is an error that names the reward model."""

import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import ray
from ray import cloudpickle

from rllib_p3o import P3OConfig
from rllib_p3o.core import metrics as m
from rllib_p3o.data.rewards import make_reward_function
from rllib_p3o.reward_models.actors import RewardModelActors
from rllib_p3o.reward_models.server import (
    RewardModelClient,
    RewardModelError,
    RewardModelServer,
    clients,
    judge_text,
    reward_model_specs,
    reward_model_text,
)

# The runner actor cannot import this test module: ship its reward function by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def tiny_reward_model(tiny_model, tmp_path_factory):
    from rllib_p3o.tasks.tiny_model import build_tiny_reward_model

    return build_tiny_reward_model(str(tmp_path_factory.mktemp("models") / "tiny_rm"), tiny_model)


def starts_with_digit(prompts, completions, **_):
    return [1.0 if c.strip()[:1].isdigit() else 0.0 for c in completions]


def test_specs_are_checked_and_completed():
    (spec,) = reward_model_specs({"reward_models": [{"model": "/models/my-rm.v2"}]})
    assert spec["kind"] == "classifier" and spec["name"] == "my_rm_v2" and spec["timeout_s"] > 0
    (judge,) = reward_model_specs({"reward_models": {"model": "/models/judge", "kind": "judge"}})
    assert judge["template"].format(prompt="1+1=", completion="2") == (
        "Question: 1+1=\nAnswer: 2\nIs the answer correct? Reply yes or no."
    )
    assert reward_model_specs({}) == []
    for bad, words in [
        ({"model": "/m", "kind": "judge", "label": 1}, "['label'] do not apply to kind='judge'"),
        ({"model": "/m", "template": "{completion}"}, "['template'] do not apply to kind='classifier'"),
        ({"model": "/m", "kind": "judge", "template": "{answer}"}, "must be a string with {completion}"),
        ({"model": "/m", "kind": "judge", "template": "{completion} {x}"}, "takes only {prompt} and {completion}"),
        ({"model": "/m", "kind": "critic"}, "kind"),
        ({"model": "/m", "score": "tanh"}, "score"),
        ({"model": "/m", "timeout": 3}, "unknown key(s) ['timeout']"),
        ({"model": "/m", "num_gpus": -1}, "num_gpus"),
        ({"kind": "classifier"}, "needs 'model'"),
    ]:
        with pytest.raises(ValueError, match=None) as e:
            reward_model_specs({"reward_models": [bad]})
        assert words in str(e.value) and "reward_models[0]" in str(e.value)


def test_reward_models_follow_the_reward_functions_with_one_weight_each():
    env_config = {"reward_fn": starts_with_digit, "reward_models": [{"model": "/m/rm", "name": "quality"}]}
    reward = make_reward_function({**env_config, "reward_weights": [1.0, 0.5]})
    assert reward.names == ["starts_with_digit", "quality"] and list(reward.weights) == [1.0, 0.5]
    with pytest.raises(ValueError, match="2 reward functions"):
        make_reward_function({**env_config, "reward_weights": [1.0]})
    alone = make_reward_function({"reward_models": [{"model": "/m/rm"}]})
    assert alone.names == ["rm"]
    # Outside a P3O run there is no actor to call: the error says so.
    with pytest.raises(RewardModelError, match="has no actor"):
        alone(["1+1="], ["2"], [{"prompt": "1+1="}])


def test_the_reward_model_reads_prompt_and_completion_as_its_chat_template_renders_them(tiny_chat_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    prompt = [{"role": "user", "content": "1+1"}]
    text = reward_model_text(prompt, [{"role": "assistant", "content": "2"}], tok)
    assert text == "<|im_start|>user 1+1<|im_end|><|im_start|>assistant 2<|im_end|>"
    assert reward_model_text("1+1=", "2", tok) == "1+1=2"
    # A judge's question, as the user's message with the generation prompt.
    question = judge_text(prompt, [{"role": "assistant", "content": "2"}], "Q {prompt} A {completion} ok?", tok)
    assert question == "<|im_start|>user Q user: 1+1 A assistant: 2 ok?<|im_end|><|im_start|>assistant "


def _judge_scores(model_dir, template, prompts, completions, yes="1", no="0"):
    """p(yes) / (p(yes) + p(no)) at the question's last position, by transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    y, n = (tok.encode(t, add_special_tokens=False)[0] for t in (yes, no))
    out = []
    with torch.inference_mode():
        for p, c in zip(prompts, completions):
            ids = tok.encode(judge_text(p, c, template, tok), add_special_tokens=False)
            z = lm(torch.tensor([ids])).logits[0, -1]
            out.append(torch.sigmoid(z[y] - z[n]).item())
    return np.array(out)


def test_actor_scores_a_batch_times_out_and_dies_with_errors_that_name_it(ray_session, tiny_reward_model):
    env_config = {"reward_models": [{"model": tiny_reward_model, "name": "rm", "score": "sigmoid", "batch_size": 3}]}
    actors = RewardModelActors(env_config)
    try:
        (client,) = clients({**env_config, "reward_model_actors": actors.names})
        prompts, completions = ["1+2=", "3+4=", "5+5=", "9+9=", "0+0="], ["3", "7 1", "10", "x", ""]
        scores = client(prompts, completions)
        local = RewardModelServer(reward_model_specs(env_config)[0]).score(prompts, completions)
        np.testing.assert_allclose(scores, local, atol=1e-6)
        assert all(0 < s < 1 for s in scores) and len(set(np.round(scores, 6))) > 1

        slow = RewardModelClient({**client.spec, "timeout_s": 1e-4}, actors.names[0])
        with pytest.raises(RewardModelError, match=r"'rm'.*did not score 200 completions within timeout_s=0.0001"):
            slow(prompts * 40, completions * 40)

        ray.kill(ray.get_actor(actors.names[0]))
        with pytest.raises(RewardModelError, match=r"reward model 'rm' \(classifier, .*\): its actor died"):
            client(prompts, completions)
    finally:
        actors.stop()


def test_a_classifier_scores_completions_beside_a_rule_reward_in_training(ray_session, tiny_model, tiny_reward_model):
    from rllib_p3o.tasks import ArithmeticTask

    weights = [1.0, 0.5, 2.0]
    rm_spec = {"model": tiny_reward_model, "name": "quality", "num_cpus": 1}
    template = "{prompt}{completion} ok?"
    # The tiny arithmetic tokenizer has no "yes": its digits stand for the answers. float32: vLLM's CPU default is bf16.
    judge_spec = {"model": tiny_model, "kind": "judge", "template": template, "yes": "1", "no": "0", "dtype": "float32"}
    config = (
        P3OConfig()
        .environment(
            env_config={
                "dataset": ArithmeticTask().train_rows()[:32],
                "reward_fn": starts_with_digit,
                "reward_models": [rm_spec, judge_spec],
                "reward_weights": weights,
            }
        )
        .training(model=tiny_model, group_size=4, prompts_per_step=2, max_tokens=4, log_completions=1000)
        .env_runners(num_env_runners=1)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        table = pq.read_table(os.path.join(algo.logdir, "completions", "iter_000001.parquet")).to_pylist()
        # Each reward model is logged like every reward function.
        by_function = result[m.P3O][m.REWARDS]
        judge_name = os.path.basename(tiny_model)
        assert set(by_function) == {"starts_with_digit", "quality", judge_name}
        assert len(table) == 8
        rule = np.array([r["rewards/starts_with_digit"] for r in table])
        model = np.array([r["rewards/quality"] for r in table])
        judged = np.array([r["rewards/" + judge_name] for r in table])
        np.testing.assert_allclose(
            [r["reward"] for r in table], weights[0] * rule + weights[1] * model + weights[2] * judged, atol=1e-5
        )
        assert by_function["quality"] == pytest.approx(model.mean(), abs=1e-5)
        assert by_function[judge_name] == pytest.approx(judged.mean(), abs=1e-5)
        # The actor's scores are the classifier's own on prompt + completion.
        local = RewardModelServer(reward_model_specs({"reward_models": [rm_spec]})[0])
        prompts, completions = [r["prompt"] for r in table], [r["completion"] for r in table]
        np.testing.assert_allclose(model, local.score(prompts, completions), atol=1e-5)
        np.testing.assert_allclose(judged, _judge_scores(tiny_model, template, prompts, completions), atol=1e-5)
        assert len(set(np.round(judged, 6))) > 1

        # A dead reward model stops the run with an error that names it, not a hang or a runner restart loop.
        ray.kill(ray.get_actor(algo.config.env_config["reward_model_actors"][0]))
        with pytest.raises(Exception, match=r"reward model 'quality' \(classifier, .*\): its actor died") as e:
            algo.train()
        assert "restart from the latest checkpoint" in str(e.value)
    finally:
        algo.stop()
    with pytest.raises(ValueError):  # stopped with the algorithm
        ray.get_actor(algo.config.env_config["reward_model_actors"][0])


def test_tune_actor_reuse_ignores_the_names_of_the_run_s_reward_model_actors():
    from rllib_p3o.driver.trial_reuse import config_differences

    env_config = {"dataset": [{"prompt": "1+1="}], "reward_models": [{"model": "/m/rm"}]}
    running = P3OConfig().environment(env_config={**env_config, "reward_model_actors": ["rllib_p3o_reward_model_0"]})
    assert config_differences(running, P3OConfig().environment(env_config=env_config)) == []
    other = P3OConfig().environment(env_config={**env_config, "reward_models": [{"model": "/m/other"}]})
    assert config_differences(running, other) == ["env_config"]


def test_the_config_names_a_reward_model_that_is_not_there_or_asks_for_what_its_kind_does_not_take(
    tiny_model, tmp_path
):
    rows = [{"prompt": "1+1="}]
    missing = str(tmp_path / "no-such-rm")
    for models, words in [
        ({"model": missing}, "env_config['reward_models'][0]['model']"),
        ([{"model": tiny_model, "kind": "judge", "score": "sigmoid"}], "['score'] do not apply to kind='judge'"),
    ]:
        config = P3OConfig().environment(env_config={"dataset": rows, "reward_models": models})
        with pytest.raises(ValueError) as e:
            config.training(model=tiny_model).validate()
        assert words in str(e.value)
