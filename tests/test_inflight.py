"""In-flight weight updates (`rllib_p3o.runner.inflight`) on a real vLLM engine (CPU, tiny models): new weights reach
sequences mid-generation, every token is labelled with the weights version that sampled it, and each token's behavior
log-prob is the one its own version's weights give it (recomputed with transformers, as the learner does); the
engine's other uses (evaluation, probes) run beside the held requests; a completion's per-token versions reach the
learner batch; the config refuses what it cannot update in place. The Ray/RLlib run is in test_inflight_run.py."""

import numpy as np
import pytest
import torch

from rllib_p3o import P3OConfig
from rllib_p3o.core.columns import Columns, Record
from rllib_p3o.data import batching
from rllib_p3o.data.episodes import episodes_to_records
from rllib_p3o.data.prompt_schedule import Group
from rllib_p3o.runner import vllm_engine
from rllib_p3o.runner.inflight import InflightEngine, token_versions
from rllib_p3o.runner.rollouts import Engine, inflight_episodes

MAX_TOKENS = (3, 10, 10)  # the first group finishes first; the others are mid-generation when new weights land


def _weights(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def _learner_logprobs(path, ids):
    """log π(ids[t+1] | ids[:t+1]) under the model at ``path``, by transformers in float32 (the learner's view)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1).numpy()


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    from rllib_p3o.tasks import build_tiny_model

    root = tmp_path_factory.mktemp("inflight")
    return build_tiny_model(str(root / "a"), init_std=0.1, seed=0), build_tiny_model(
        str(root / "b"), init_std=0.1, seed=1
    )


@pytest.fixture(scope="module")
def engine(two_models):
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine the runners step (as make_engine)
    from vllm import LLM

    llm = LLM(
        model=two_models[0], tokenizer=two_models[0], dtype="float32", seed=0, max_model_len=64, enforce_eager=True,
        kv_cache_memory_bytes=64 << 20, enable_chunked_prefill=False, logprobs_mode="processed_logprobs",
        worker_extension_cls=vllm_engine.WORKER_EXTENSION, generation_config="vllm",
    )  # fmt: skip
    yield llm
    llm.llm_engine.engine_core.shutdown()


def _params(seed, max_tokens):
    from vllm import SamplingParams

    return SamplingParams(n=2, temperature=1.0, max_tokens=max_tokens, logprobs=0, seed=seed, ignore_eos=True)


def _groups(tokenizer):
    from vllm.inputs import TokensPrompt

    groups = [Group(group_id=i, row=i, seed=100 + i) for i in range(3)]
    prompts = [TokensPrompt(prompt_token_ids=tokenizer.encode(t)) for t in ("12+7=", "3*4+5=", "(8+1)%10=")]
    return groups, prompts


@pytest.mark.parametrize("kv_cache", ["recompute", "keep"])
def test_a_completion_spanning_two_versions_has_each_tokens_own_versions_logprob(engine, two_models, kv_cache):
    from transformers import AutoTokenizer

    a, b = two_models
    tokenizer = AutoTokenizer.from_pretrained(a)
    vllm_engine.reload_weights(engine, _weights(a))  # (a previous parametrization may have left B loaded)
    inflight = InflightEngine(engine, kv_cache, version=1)
    groups, prompts = _groups(tokenizer)
    inflight.submit(groups, prompts, [_params(g.seed, n) for g, n in zip(groups, MAX_TOKENS)])
    first, _ = inflight.collect(1)
    assert [g.group_id for g, _ in first] == [0] and sorted(g.group_id for g in inflight.held()) == [1, 2]
    # An evaluation call while two groups are mid-generation: its own outputs only; the held requests go on.
    evaluated = inflight.generate(prompts[:1], _params(7, 2))
    assert len(evaluated) == 1 and len(evaluated[0].outputs) == 2
    vllm_engine.reload_weights(inflight, _weights(b))  # between two engine steps of the held sequences
    inflight.set_version(2)
    rest, _ = inflight.collect(2)
    assert sorted(g.group_id for g, _ in rest) == [1, 2] and inflight.held() == []

    spanning = 0
    for _, output in rest:
        for comp in output.outputs:
            versions = token_versions(comp, default=-1)
            assert set(versions.tolist()) <= {1, 2} and versions[0] == 1, "the sequence started with version 1"
            spanning += int(len(set(versions.tolist())) == 2)
            ids = list(output.prompt_token_ids) + list(comp.token_ids)
            engine_lp = np.array([lp[t].logprob for t, lp in zip(comp.token_ids, comp.logprobs)])
            by_version = {1: _learner_logprobs(a, ids), 2: _learner_logprobs(b, ids)}
            start = len(output.prompt_token_ids) - 1  # target position of the first completion token
            for j, v in enumerate(versions):
                learner = by_version[int(v)][start + j]
                if kv_cache == "recompute" or v == 1:
                    assert abs(engine_lp[j] - learner) < 1e-4, (kv_cache, j, int(v), engine_lp[j], learner)
    assert spanning == 4  # every completion of the two held groups spans the update
    vllm_engine.reload_weights(inflight, _weights(a))


def test_inflight_episodes_carry_per_token_versions_into_the_batch(engine, two_models):
    from transformers import AutoTokenizer

    a, b = two_models
    tokenizer = AutoTokenizer.from_pretrained(a)
    inflight = InflightEngine(engine, "recompute", version=3)
    groups, prompts = _groups(tokenizer)
    inflight.submit(groups[1:], prompts[1:], [_params(g.seed, 10) for g in groups[1:]])
    inflight.collect(0)
    for _ in range(4):  # four engine steps with version 3, then version 4
        inflight._step()
    vllm_engine.reload_weights(inflight, _weights(b))
    inflight.set_version(4)
    finished, _ = inflight.collect(2)
    rows = {g: {"prompt": "p"} for g, _ in finished}

    def score(prompts, completions, rows_, ids):
        from rllib_p3o.data.rewards import Rewards

        n = len(completions)
        return Rewards(np.ones(n), np.ones((n, 1)))

    episodes = inflight_episodes(
        tokenizer, finished, rows, Engine("policy", engine, 2, {}), sampling_params=lambda g: _params(g.seed, 10),
        score=score, names=["r"], weights_seq_no=4, logprobs_mode="processed",
    )  # fmt: skip
    records = episodes_to_records(episodes)
    assert len(records) == 4
    for r in records:
        assert r[Record.WEIGHTS_SEQ_NO] == 3  # a completion's own version: its oldest token's
        assert r[Record.POLICY_VERSION].tolist() == [3] * 4 + [4] * 6
        r[Record.ADVANTAGE] = 1.0
    batch = batching.pad_records(records, pad_id=0)
    p = len(records[0][Record.PROMPT_IDS])
    assert batch[Columns.POLICY_VERSION][0, p - 1 : p - 1 + 10].tolist() == [3] * 4 + [4] * 6
    vllm_engine.reload_weights(inflight, _weights(a))


def test_without_a_span_the_rows_version_stands_for_every_token(tiny_model):
    records = [
        {
            Record.PROMPT_IDS: np.array([1, 2]),
            Record.COMPLETION_IDS: np.array([3, 4, 5]),
            Record.BEHAVIOR_LOGPROBS: np.zeros(3, np.float32),
            Record.WEIGHTS_SEQ_NO: 7,
            Record.ADVANTAGE: 0.0,
        }
    ]
    batch = batching.pad_records(records, pad_id=0)
    assert batch[Columns.POLICY_VERSION][0, 1:4].tolist() == [7, 7, 7]


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(async_sampling=False), "inflight_weight_updates needs async_sampling=True"),
        (dict(lora={"r": 4, "alpha": 8, "target_modules": ["q_proj"]}), "does not support LoRA"),
        (dict(behavior_models=[{"model": "/m", "samples": 1}]), "does not support behavior_models"),
    ],
)
def test_what_cannot_be_updated_in_place_is_refused_with_the_alternative(tiny_model, change, match):
    config = P3OConfig().training(
        **{"model": tiny_model, "async_sampling": True, "inflight_weight_updates": True, **change}
    )
    config.env_runners(num_env_runners=1)
    with pytest.raises(ValueError, match=match) as raised:
        config.validate()
    assert "async" in str(raised.value)  # the alternative, or the fix


def test_multi_turn_and_the_multiprocess_engine_are_refused(tiny_model, monkeypatch):
    config = P3OConfig().training(model=tiny_model, async_sampling=True, inflight_weight_updates=True)
    config.env_runners(num_env_runners=1)
    config.environment(env_config={"dataset": [{"prompt": "1+1="}], "multi_turn_env": "rllib_p3o.envs.guess:X"})
    with pytest.raises(ValueError, match="single-turn rollouts only"):
        config.validate()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    config = P3OConfig().training(model=tiny_model, async_sampling=True, inflight_weight_updates=True)
    config.env_runners(num_env_runners=1)
    with pytest.raises(ValueError, match="needs the in-process vLLM engine"):
        config.validate()


def test_more_sample_calls_in_flight_than_staleness_allows_are_refused(tiny_model):
    """Async data are as many versions old as the runner's sample() calls in flight (tests/test_sampler.py): more
    calls than ``max_staleness`` would drop every sample, and in-flight updates keep one call per runner."""
    config = P3OConfig().training(model=tiny_model, async_sampling=True, max_staleness=2)
    config.env_runners(num_env_runners=1, max_requests_in_flight_per_env_runner=3)
    with pytest.raises(ValueError, match="3 weight versions old .* more than max_staleness=2"):
        config.validate()
    config.training(max_staleness=3)
    config.validate()
    config.training(inflight_weight_updates=True)
    with pytest.raises(ValueError, match="keeps one sample.. call per runner"):
        config.validate()
