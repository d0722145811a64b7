"""An RLlib EnvRunner that generates with vLLM: one 1-step episode per completion, or multi-turn episodes.

Prompts are strings or chat messages (`rllib_p3o.data.chat`); with ``env_config["multi_turn_env"]`` each episode plays
several model and environment turns (`rllib_p3o.runner.multiturn`, played by `rllib_p3o.runner.rollouts`).

Plugged in with ``config.env_runners(env_runner_cls=VLLMEnvRunner)`` (P3OConfig's default). Each *sampling* runner
(every remote runner, or the local one when ``num_env_runners=0``) holds a ``vllm.LLM``; the local runner of a run
with remote runners holds none, so the driver (or Tune trial actor) never pays for an engine.

Behavior log-probs: vLLM reports the log-prob of each sampled token. With ``logprobs_mode="processed"`` (default)
they are log-probs of the distribution the token was actually drawn from (after temperature and top-p/top-k), the
true behavior policy π_b of the importance ratio; so rollouts at T=1.2 count as off-policy data for the T=1
learner, as in the paper. ``"raw"`` reports the unprocessed model log-probs instead (then ratios at T≠1 only
measure weight staleness/numerics, not the sampling distortion). The mode and sampling parameters are recorded
with every sample. Under top-k/top-p each token also carries its kept set (`rllib_p3o.runner.rollouts.kept_sets`:
vLLM's top candidates of the processed distribution, up to ``kept_set_cap``), over which the learner renormalizes.

Weight sync (`rllib_p3o.sync`): `load_policy_weights` reloads the engine's weights in place (no restart)
through vLLM's layerwise reload (`rllib_p3o.runner.vllm_engine`), re-processes a tied LM head, resets the prefix cache
(cached KV was computed with the old weights) and, when the payload has a probe, scores a probe sequence: at once,
checked against the learner's log-probs it carries, or with the policy's next generate call (`rllib_p3o.runner.probe_rider`),
returned to the driver by `take_probe_result`. Under LoRA (``config.lora``) the engine serves the frozen base and a sync
swaps in the new adapter alone (`vllm_engine.load_adapter`), under a `LoRARequest` per weights version that every
policy generation and probe then names.

Threads: each engine gets `P3OConfig.env_runner_threads` torch/OpenMP threads (its Ray CPUs by default, plus in
sync mode a share of the idle local learner's), so that in async mode generation and training run side by side
instead of spin-waiting on each other's cores.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import ray
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import (
    EPISODE_RETURN_MEAN,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
)

from rllib_p3o.core import lora, metrics
from rllib_p3o.core.callables import resolve_callable
from rllib_p3o.core.columns import kept_set_candidates
from rllib_p3o.core.cpu_threads import fitting_threads
from rllib_p3o.core.sources import POLICY, behavior_sample_counts, behavior_source_name, source_id
from rllib_p3o.data import chat, prompt_fit
from rllib_p3o.data.datasets import has_conversational_prompts
from rllib_p3o.data.prompt_schedule import Group, PromptSchedule, group_seed
from rllib_p3o.runner import multiturn, vllm_engine
from rllib_p3o.runner.env import TextEnv
from rllib_p3o.runner.inflight import InflightEngine
from rllib_p3o.runner.probe_rider import ProbeRider
from rllib_p3o.runner.rollouts import Engine, MultiTurnRollouts, inflight_episodes, single_turn_episodes, turn_metrics
from rllib_p3o.sync import payload as sync_payload
from rllib_p3o.sync.probe import (
    ProbeResult,
    WeightSyncError,  # noqa: F401  (public here: raised by load_policy_weights)
    check_probe,
)

logger = logging.getLogger(__name__)

# Group ids of a runner's own schedule (sample() called without groups) start here: they never meet the driver's.
_OWN_GROUP_BASE = 10**15


def heldout_seeds(seed: int, num_prompts: int) -> List[int]:
    """One sampling seed per held-out prompt, a hash of (``seed``, its index) as a group's (`group_seed`).

    vLLM gives every seeded request a generator of its own, seeded with the request's seed (its ``n`` samples with
    seed, seed + 1, ...): one seed for every prompt drew the same random numbers for all of them, so their samples
    were correlated and the held-out mean far noisier than its prompt count says (the base model of the claims
    bench scored 0.31, 0.35 and 0.44 under three evaluation seeds); consecutive seeds per prompt overlapped the
    same way across neighbouring prompts."""
    return [group_seed(seed, i) for i in range(num_prompts)]


class VLLMEnvRunner(EnvRunner, Checkpointable):
    """EnvRunner holding a vLLM engine; see the module docstring."""

    def __init__(self, *, config, **kwargs):
        t_init = time.perf_counter()
        super().__init__(config=config, **kwargs)
        from transformers import AutoTokenizer

        self.num_workers = int(config.num_env_runners)
        env_config = dict(config.env_config)
        env_config.update(
            worker_index=self.worker_index, num_workers=self.num_workers, seed=env_config.get("seed", config.seed or 0)
        )
        self.config.env_config = env_config
        self.tokenizer = AutoTokenizer.from_pretrained(config.policy_model, trust_remote_code=config.trust_remote_code)
        self._weights_seq_no = 0
        self._own_schedule: Optional[PromptSchedule] = None
        self._env_steps_lifetime = 0
        self._llm = None
        self._policy: Optional[ProbeRider] = None  # the policy's engine, as its generate calls carry the probe
        # With in-flight weight updates: the policy's engine, stepped by this runner across sample() calls.
        self._inflight: Optional[InflightEngine] = None
        self._lora_request = None  # under LoRA: the adapter of the weights version the engine holds
        # An offline-only run without remote runners needs no engine (nor prompts) at all.
        offline_only = config.resolved_offline_fraction >= 1.0
        self.is_sampler = self.worker_index > 0 or (self.num_workers == 0 and not offline_only)
        env_cls = config.env if isinstance(config.env, type) and issubclass(config.env, TextEnv) else TextEnv
        self.env = env_cls(dict(self.config.env_config)) if (self.is_sampler or "dataset" in env_config) else None
        if self.env is not None and has_conversational_prompts(self.env.rows + self.env.eval_rows):
            chat.check_chat_template(self.tokenizer, config.policy_model)
        self._prompt_fit = {metrics.PROMPTS_DROPPED: 0.0, metrics.PROMPTS_TRUNCATED: 0.0}
        if self.env is not None and not env_config.get("multi_turn_env"):
            self._fit_prompts()
        self._stop_ids = multiturn.stop_token_ids(self.tokenizer, env_config.get("stop_tokens") or ())
        # Multi-turn episodes (`rllib_p3o.runner.multiturn`) when env_config names an environment class.
        self._rollouts: Optional[MultiTurnRollouts] = None
        if self.env is not None and env_config.get("multi_turn_env"):
            multi_turn_cls = resolve_callable(env_config["multi_turn_env"], what="multi_turn_env")
            self._rollouts = MultiTurnRollouts(
                tokenizer=self.tokenizer,
                make_env=lambda: multi_turn_cls(env_config),
                max_turns=multiturn.max_turns(env_config),
                max_tokens=config.max_tokens,
                max_total_tokens=self._max_total_tokens(),
                sampling_params=self._sampling_params,
            )
        # Frozen behavior models (never synced) generate their share of every prompt group beside the policy:
        # (spec, engine) pairs.
        self._behavior: List[tuple] = []
        self._last_sample_end: Optional[float] = None
        t_engines = time.perf_counter()
        if self.is_sampler:
            threads = config.env_runner_threads
            if config.num_threads_per_env_runner is None:  # derived from Ray CPUs: no more than this machine's cores
                threads = fitting_threads(threads)
            vllm_engine.set_engine_threads(threads)
            self._llm = self._make_engine(config.policy_model, lora=config.lora)
            if config.inflight_weight_updates:
                if not vllm_engine.is_in_process(self._llm):
                    raise RuntimeError("inflight_weight_updates needs the in-process vLLM engine (module docstring).")
                # Every use of the engine (sampling, held-out evaluation, probes) goes through it from now on.
                self._inflight = self._llm = InflightEngine(self._llm, config.inflight_kv_cache, self._weights_seq_no)
            self._policy = ProbeRider(self._llm, self.worker_index)
            self._tied_embeddings = bool(
                getattr(self._llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False)
            )
            self._behavior = [(spec, self._make_engine(spec["model"])) for spec in config.behavior_models]
            # Top-k/top-p kept sets are asked for as candidates: at most the smallest vocabulary of the engines.
            engines = [self._llm] + [llm for _, llm in self._behavior]
            self._vocab_size = min(llm.llm_engine.model_config.get_vocab_size() for llm in engines)
        # Where this runner's start went (`startup_times`); the imports before __init__ are not in it.
        self._startup = {"init_s": time.perf_counter() - t_init, "engines_s": time.perf_counter() - t_engines}

    # -- engine -------------------------------------------------------------------------------------------------

    def _make_engine(self, model: str, lora: Optional[Dict[str, Any]] = None):
        return vllm_engine.make_engine(self.config, model, self._max_model_len(), self.worker_index, lora=lora)

    def _max_model_len(self) -> int:
        """Longest prompt of the datasets + max_tokens, or a multi-turn episode's ``max_total_tokens`` (vLLM silently
        truncates past max_model_len)."""
        if self._rollouts is not None:
            return self._rollouts.max_total_tokens
        longest = max(len(self._prompt_ids(r)) for r in self.env.rows + self.env.eval_rows)
        return int(longest + self.config.max_tokens)

    def _max_total_tokens(self) -> int:
        """A multi-turn episode's token limit: ``env_config["max_total_tokens"]`` or the model's context length."""
        limit = self.config.env_config.get("max_total_tokens")
        if limit is None:
            from transformers import AutoConfig

            limit = AutoConfig.from_pretrained(
                self.config.policy_model, trust_remote_code=self.config.trust_remote_code
            ).max_position_embeddings
        return int(limit)

    def _encode(self, prompt: chat.Prompt) -> List[int]:
        return chat.prompt_token_ids(self.tokenizer, prompt)

    def _prompt_ids(self, row: Dict[str, Any]) -> List[int]:
        """The token ids a row's prompt is sent as (cut from the left under ``overlong_prompts="truncate_left"``)."""
        return prompt_fit.row_prompt_ids(row, self._encode)

    def _fit_prompts(self) -> None:
        """The datasets' rows that fit the model's context minus ``max_tokens`` (`rllib_p3o.data.prompt_fit`): every
        runner drops or cuts the same rows, so the driver's prompt schedule indexes the same rows everywhere."""
        cfg = self.config
        context = prompt_fit.model_context(cfg.policy_model, cfg.trust_remote_code, cfg.vllm_kwargs)
        fit = prompt_fit.fit_prompts(
            self.env.rows, self._encode, context, cfg.max_tokens, cfg.overlong_prompts, "env_config['dataset']"
        )
        self.env.rows = fit.rows
        counts = [fit.dropped, fit.truncated]
        if self.env.eval_rows:
            held = prompt_fit.fit_prompts(
                self.env.eval_rows, self._encode, context, cfg.max_tokens, cfg.overlong_prompts, "eval_dataset"
            )
            self.env.eval_rows = held.rows
            counts = [counts[0] + held.dropped, counts[1] + held.truncated]
        self._prompt_fit = {metrics.PROMPTS_DROPPED: float(counts[0]), metrics.PROMPTS_TRUNCATED: float(counts[1])}

    def prompt_fit_counts(self) -> Dict[str, float]:
        """Prompts left out or cut to fit the context (`_fit_prompts`), for the driver's results."""
        return dict(self._prompt_fit)

    def has_engine(self) -> bool:
        return self._llm is not None

    def startup_times(self) -> Dict[str, float]:
        """Seconds of this runner's ``__init__`` (``init_s``) and, within it, of starting its engines (``engines_s``)."""
        return dict(self._startup)

    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def _sampling_params(self, seed: int, **overrides):
        from vllm import SamplingParams

        cfg = self.config
        kw = dict(
            n=cfg.group_size,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_tokens=cfg.max_tokens,
            logprobs=0,
            seed=seed,
            detokenize=vllm_engine.DETOKENIZE,
        )
        if self._stop_ids:
            kw["stop_token_ids"] = self._stop_ids
        kw.update(overrides)
        if cfg.logprobs_mode == "processed":  # top-k/top-p: each token's kept set (`rollouts.kept_sets`)
            candidates = kept_set_candidates(kw["top_k"], kw["top_p"], cfg.kept_set_cap)
            kw["logprobs"] = min(candidates, getattr(self, "_vocab_size", candidates))
        return SamplingParams(**kw)

    # -- EnvRunner API --------------------------------------------------------------------------------------------

    def assert_healthy(self) -> None:
        if self.is_sampler and self._llm is None:
            raise RuntimeError(f"VLLMEnvRunner {self.worker_index} has no engine.")

    def get_spaces(self):
        spaces = (TextEnv.observation_space_default(), TextEnv.action_space_default())
        return {INPUT_ENV_SPACES: spaces, DEFAULT_MODULE_ID: spaces}

    def prompts_per_sample(self) -> int:
        return math.ceil(self.config.online_prompts_per_step / max(1, self.num_workers))

    def num_prompts(self) -> int:
        """Rows of the prompt dataset (every runner holds all of them: the driver's schedule picks)."""
        return len(self.env.rows)

    def _engines(self) -> List[Engine]:
        """The policy's engine and each behavior model's, with their share of a prompt group (if any)."""
        counts = behavior_sample_counts(self.config.behavior_models, self.config.group_size)
        engines = [Engine(POLICY, self._policy, self.config.group_size - sum(counts), {}, self._lora_request)]
        for (spec, llm), n in zip(self._behavior, counts):
            overrides = {k: spec[k] for k in ("temperature", "top_p", "top_k", "max_tokens") if k in spec}
            engines.append(Engine(behavior_source_name(spec), llm, n, overrides))
        return [e for e in engines if e.samples > 0]

    def sample(
        self,
        num_prompts: Optional[int] = None,
        groups: Optional[List[Group]] = None,
        return_groups: Optional[int] = None,
        **kwargs,
    ) -> List:
        """Sample ``group_size`` completions for each prompt group; one episode per completion.

        ``groups`` (`rllib_p3o.data.prompt_schedule.Group`: group id, prompt row, sampling seed) come from the driver's
        schedule, which derives each seed from the group id, so any runner samples the same completions for a group
        (with the same weights). Called without ``groups`` (plain RLlib use), the runner takes ``num_prompts`` from its own
        schedule. With behavior models, each prompt group holds ``group_size - Σ behavior samples`` policy
        completions and each behavior model's share, generated with that model's own sampling parameters.

        With in-flight weight updates (`rllib_p3o.runner.inflight`) ``groups`` join the ones the engine is still
        generating, and the call returns the ``return_groups`` (default: as many as were given) that finish first.
        """
        t_start = time.perf_counter()
        idle = t_start - self._last_sample_end if self._last_sample_end is not None else 0.0
        if groups is None:
            groups = self._take_own(num_prompts or self.prompts_per_sample())
        groups = [Group(*g) for g in groups]
        rows = [self.env.rows[g.row] for g in groups]
        engines = self._engines()
        if self._inflight is not None:
            episodes, t_gen = self._inflight_sample(groups, len(groups) if return_groups is None else return_groups)
        elif self._rollouts is None:
            episodes, t_gen = single_turn_episodes(
                self.tokenizer,
                rows,
                groups,
                engines,
                sampling_params=self._sampling_params,
                score=self.env.score_by_function,
                names=self.env.reward.names,
                weights_seq_no=self._weights_seq_no,
                logprobs_mode=self.config.logprobs_mode,
            )
        else:
            episodes, t_gen = self._rollouts.play_groups(
                rows, groups, engines, weights_seq_no=self._weights_seq_no, logprobs_mode=self.config.logprobs_mode
            )
            for key, value in turn_metrics(episodes).items():
                self.metrics.log_value((metrics.MULTI_TURN, key), value, window=1)
        n_tokens = sum(len(a) for ep in episodes for a in ep.get_actions())
        self._log_sample(episodes, n_tokens, t_gen, idle)
        return episodes

    def _inflight_sample(self, groups: List[Group], return_groups: int) -> Tuple[List, float]:
        """Submit ``groups`` to the in-flight engine, and the episodes of the first ``return_groups`` groups it
        finishes (these or earlier ones), with the generate seconds."""
        from vllm.inputs import TokensPrompt

        if self._policy.armed:  # the probe of the weights last loaded, scored before anything is sampled with them
            self._policy.generate([], [])
        params = lambda g: self._sampling_params(g.seed, n=self.config.group_size)  # noqa: E731
        self._inflight.submit(
            groups, [TokensPrompt(prompt_token_ids=self._prompt_ids(self.env.rows[g.row])) for g in groups],
            [params(g) for g in groups],
        )  # fmt: skip
        finished, t_gen = self._inflight.collect(return_groups)
        episodes = inflight_episodes(
            self.tokenizer,
            finished,
            {g: self.env.rows[g.row] for g, _ in finished},
            self._engines()[0],
            sampling_params=params,
            score=self.env.score_by_function,
            names=self.env.reward.names,
            weights_seq_no=self._weights_seq_no,
            logprobs_mode=self.config.logprobs_mode,
        )
        return episodes, t_gen

    def held_groups(self) -> List[Group]:
        """The prompt groups an in-flight engine holds (submitted, not yet returned); none otherwise."""
        return [] if self._inflight is None else list(self._inflight.held())

    def clear_held_groups(self) -> int:
        """Drop the prompt groups an in-flight engine holds (the driver samples them again); how many there were."""
        return 0 if self._inflight is None else self._inflight.clear()

    def _log_sample(self, episodes: List, n_tokens: int, t_gen: float, idle: float) -> None:
        self._env_steps_lifetime += len(episodes)
        self.metrics.log_value(NUM_ENV_STEPS_SAMPLED, len(episodes), reduce="sum")
        self.metrics.log_value(NUM_EPISODES, len(episodes), reduce="sum")
        self.metrics.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, len(episodes), reduce="lifetime_sum")
        self.metrics.log_value(NUM_EPISODES_LIFETIME, len(episodes), reduce="lifetime_sum")
        self.metrics.log_value(EPISODE_RETURN_MEAN, metrics.nan_mean([ep.get_return() for ep in episodes]), window=1)
        self.metrics.log_value(metrics.GENERATE_TIME_S, t_gen, window=1)
        self.metrics.log_value(metrics.GENERATED_TOKENS_PER_S, n_tokens / max(t_gen, 1e-9), window=1)
        self.metrics.log_value(metrics.IDLE_TIME_S, idle, reduce="sum")
        self._last_sample_end = time.perf_counter()

    def _take_own(self, k: int) -> List[Group]:
        if self._own_schedule is None:
            self._own_schedule = PromptSchedule(len(self.env.rows), seed=(self.config.seed or 0) + self.worker_index)
        groups = self._own_schedule.take(k)
        self._own_schedule.done(g.group_id for g in groups)
        return [g._replace(group_id=_OWN_GROUP_BASE * (1 + self.worker_index) + g.group_id) for g in groups]

    def get_metrics(self):
        return self.metrics.reduce()

    def evaluate_heldout(
        self, max_prompts: int = 200, temperature: float = 0.0, samples_per_prompt: int = 1, seed: int = 0
    ) -> Optional[Dict[str, float]]:
        """The policy's completions on the held-out rows, scored by the reward function: greedy (one per prompt) at
        ``temperature`` 0, else ``samples_per_prompt`` samples per prompt, seeded by ``seed``."""
        if self._llm is None or not self.env.eval_rows:
            return None
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows = self.env.eval_rows[:max_prompts]
        k = 1 if temperature == 0 else int(samples_per_prompt)
        sampling = {"temperature": float(temperature), "top_p": 1.0, "top_k": 0}
        seeds = heldout_seeds(seed, len(rows))
        if self._rollouts is not None:  # episodes, scored by their return
            engine = Engine(POLICY, self._policy, k, sampling, self._lora_request)
            episodes = self._rollouts.play(
                rows,
                seeds,
                engine,
                weights_seq_no=self._weights_seq_no,
                group_ids=list(range(len(rows))),
                source_id=source_id(POLICY),
                logprobs_mode=self.config.logprobs_mode,
            )
            return {
                metrics.REWARD_MEAN: metrics.nan_mean([ep.get_return() for ep in episodes]),
                metrics.NUM_PROMPTS: float(len(rows)),
                metrics.NUM_COMPLETIONS: float(len(episodes)),
                **turn_metrics(episodes),
            }
        params = [
            SamplingParams(
                n=k,
                **sampling,
                seed=prompt_seed if temperature > 0 else None,
                max_tokens=self.config.max_tokens,
                stop_token_ids=self._stop_ids or None,
                detokenize=vllm_engine.DETOKENIZE,
            )
            for prompt_seed in seeds
        ]
        outs = self._policy.generate(
            [TokensPrompt(prompt_token_ids=self._prompt_ids(r)) for r in rows],
            params,
            use_tqdm=False,
            lora_request=self._lora_request,
        )
        ids = [list(c.token_ids) for o in outs for c in o.outputs]
        completions = [self.tokenizer.decode(i, skip_special_tokens=True) for i in ids]
        scored = [r for r in rows for _ in range(k)]
        rewards = self.env.score_by_function([r["prompt"] for r in scored], completions, scored, ids).total
        return {
            metrics.REWARD_MEAN: metrics.nan_mean(rewards),
            metrics.NUM_PROMPTS: float(len(rows)),
            metrics.NUM_COMPLETIONS: float(len(rewards)),
        }

    # -- weights ------------------------------------------------------------------------------------------------

    def probe_token_ids(self) -> List[int]:
        """A fixed sequence (first prompt + a few tokens) on which learner and engine log-probs are compared."""
        ids = self._prompt_ids(self.env.rows[0])
        # Fits max_model_len with the one token the probe request must generate.
        extra = [t % len(self.tokenizer) for t in range(3, 3 + min(8, self.config.max_tokens - 1))]
        return ids + extra

    def load_policy_weights(self, payload: Dict[str, Any]) -> Dict[str, float]:
        """Load new policy weights (`rllib_p3o.sync.payload`) into the engine in place; check the probe now
        (the payload has the learner's log-probs) or with the next generate call (`take_probe_result`).

        Returns the load's time split (`rllib_p3o.core.metrics`: transfer, engine reload, verify) and, when checked now,
        the probe's max |learner - engine| log-prob difference."""
        seq = int(payload[sync_payload.VERSION])
        if self._llm is None:
            self._weights_seq_no = seq
            return {}
        t0 = time.perf_counter()
        state = payload[sync_payload.RL_MODULE]
        if isinstance(state, ray.ObjectRef):
            state = ray.get(state)
        state = sync_payload.module_tensors(state)
        t1 = time.perf_counter()
        if self.config.lora:  # the adapter only, swapped in under this version's id; the base stays as loaded
            engine_stats = vllm_engine.load_adapter(self._llm, seq, lora.adapter_state(state), self.config.lora)
            self._lora_request = vllm_engine.lora_request(seq)
        else:
            engine_stats = vllm_engine.reload_weights(self._llm, sync_payload.hf_weights(state, self._tied_embeddings))
        self._weights_seq_no = seq
        if self._inflight is not None:  # the tokens sampled from now on are this version's
            self._inflight.set_version(seq)
        t2 = time.perf_counter()
        stats = {metrics.TRANSFER_S: t1 - t0, metrics.ENGINE_RELOAD_S: engine_stats["engine_reload_s"]}
        probe = payload.get(sync_payload.PROBE)
        if probe is not None and sync_payload.PROBE_LOGPROBS not in probe:
            self._policy.arm(seq, probe[sync_payload.PROBE_TOKEN_IDS])
        elif probe is not None:
            stats[metrics.PROBE_MAX_ABS_DIFF] = check_probe(
                self.engine_logprobs(probe[sync_payload.PROBE_TOKEN_IDS]),
                probe[sync_payload.PROBE_LOGPROBS],
                payload.get(sync_payload.TOLERANCE, sync_payload.DEFAULT_TOLERANCE),
                where=f"runner {self.worker_index}: after loading weights v{self._weights_seq_no}",
                rtol=payload.get(sync_payload.RTOL, 0.0),
            )
        stats[metrics.VERIFY_S] = time.perf_counter() - t2
        stats[metrics.LOAD_S] = time.perf_counter() - t0
        return stats

    def take_probe_result(self) -> Optional[ProbeResult]:
        """The engine's probe log-probs scored with a generate call since the last call, if any."""
        return self._policy.take_result() if self._policy is not None else None

    def engine_logprobs(self, token_ids: List[int]) -> np.ndarray:
        """The engine's log-prob of each token of ``token_ids`` given its prefix (length ``len - 1``)."""
        return vllm_engine.prompt_logprobs(self._llm, token_ids, self._lora_request)

    # -- state / checkpointing (RLlib's keys, shared with the weight-sync payload: rl_module, weights_seq_no) ------

    def get_state(self, components=None, *, not_components=None, **kwargs) -> Dict[str, Any]:
        return {sync_payload.VERSION: self._weights_seq_no, NUM_ENV_STEPS_SAMPLED_LIFETIME: self._env_steps_lifetime}

    def set_state(self, state: Dict[str, Any]) -> None:
        if sync_payload.RL_MODULE in state and self._llm is not None:
            self.load_policy_weights(
                {
                    sync_payload.RL_MODULE: state[sync_payload.RL_MODULE],
                    sync_payload.VERSION: state.get(sync_payload.VERSION, self._weights_seq_no),
                }
            )
        self._weights_seq_no = int(state.get(sync_payload.VERSION, self._weights_seq_no))
        self._env_steps_lifetime = int(state.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, self._env_steps_lifetime))

    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    def get_checkpointable_components(self):
        return []

    def stop(self) -> None:
        for llm in [self._llm] + [b[1] for b in self._behavior]:
            if llm is not None:
                try:
                    llm.llm_engine.engine_core.shutdown()
                except Exception as e:  # shutting down anyway
                    logger.debug("engine shutdown: %s", e)
        self._llm, self._policy, self._behavior = None, None, []
