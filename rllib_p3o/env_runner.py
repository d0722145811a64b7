"""An RLlib EnvRunner that generates completions with vLLM and returns one 1-step episode per completion.

Plugged in with ``config.env_runners(env_runner_cls=VLLMEnvRunner)`` (P3OConfig's default). Each *sampling* runner
(every remote runner, or the local one when ``num_env_runners=0``) holds a ``vllm.LLM``; the local runner of a run
with remote runners holds none, so the driver (or Tune trial actor) never pays for an engine.

Behavior log-probs: vLLM reports the log-prob of each sampled token. With ``logprobs_mode="processed"`` (default)
they are log-probs of the distribution the token was actually drawn from (after temperature and top-p/top-k), the
true behavior policy π_b of the importance ratio; so rollouts at T=1.2 count as off-policy data for the T=1
learner, as in the paper. ``"raw"`` reports the unprocessed model log-probs instead (then ratios at T≠1 only
measure weight staleness/numerics, not the sampling distortion). The mode and sampling parameters are recorded
with every sample.

Weight sync: `load_policy_weights` reloads the engine's weights in place (no restart) through vLLM's layerwise
reload, re-processes a tied LM head, resets the prefix cache (cached KV was computed with the old weights) and,
when the payload has a probe, checks that the engine's log-probs of a probe sequence match the learner's.
"""

from __future__ import annotations

import logging
import math
import os
import time
import zlib
from typing import Any, Dict, List, Optional

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

from rllib_p3o.env import TextEnv
from rllib_p3o.episodes import completion_episode

logger = logging.getLogger(__name__)

# A CPU engine's default KV cache claims ~90% of host RAM; this is plenty for small models and short sequences.
CPU_DEFAULT_KV_CACHE_BYTES = 256 << 20


class WeightSyncError(RuntimeError):
    """The engine does not hold the weights the learner sent (a silent sync failure would look like staleness)."""


def behavior_source_name(spec: Dict[str, Any]) -> str:
    return "behavior/" + str(spec.get("name") or os.path.basename(os.path.normpath(spec["model"])))


def make_env(config) -> TextEnv:
    env_cls = config.env if isinstance(config.env, type) and issubclass(config.env, TextEnv) else TextEnv
    env_config = dict(config.env_config)
    return env_cls(env_config)


class VLLMEnvRunner(EnvRunner, Checkpointable):
    """EnvRunner holding a vLLM engine; see the module docstring."""

    def __init__(self, *, config, **kwargs):
        super().__init__(config=config, **kwargs)
        from transformers import AutoTokenizer

        self.num_workers = int(config.num_env_runners)
        env_config = dict(config.env_config)
        env_config.update(worker_index=self.worker_index, num_workers=self.num_workers,
                          seed=env_config.get("seed", config.seed or 0))
        self.config.env_config = env_config
        self.tokenizer = AutoTokenizer.from_pretrained(config.policy_model, trust_remote_code=config.trust_remote_code)
        self._weights_seq_no = 0
        self._groups_sampled = 0
        self._env_steps_lifetime = 0
        self._llm = None
        # An offline-only run without remote runners needs no engine (nor prompts) at all.
        offline_only = config.resolved_offline_fraction >= 1.0
        self.is_sampler = self.worker_index > 0 or (self.num_workers == 0 and not offline_only)
        self.env = make_env(self.config) if (self.is_sampler or "dataset" in env_config) else None
        # Frozen behavior models (never synced) generate their share of every prompt group beside the policy.
        self._behavior: List[tuple] = []
        self._last_sample_end: Optional[float] = None
        if self.is_sampler:
            self._llm = self._make_engine(config.policy_model)
            self._tied_embeddings = bool(getattr(self._llm.llm_engine.model_config.hf_config,
                                                 "tie_word_embeddings", False))
            self._behavior = [(spec, self._make_engine(spec["model"])) for spec in config.behavior_models]

    # -- engine -------------------------------------------------------------------------------------------------

    def _make_engine(self, model: str):
        # In-process engine inside a Ray actor: one process, ~4x faster start than vLLM's multiprocess engine.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM
        from vllm.platforms import current_platform

        cfg = self.config
        kwargs: Dict[str, Any] = dict(
            model=model,
            tokenizer=model,
            dtype=cfg.model_dtype,
            seed=int(cfg.seed or 0),
            trust_remote_code=cfg.trust_remote_code,
            max_model_len=self._max_model_len(),
            logprobs_mode="processed_logprobs" if cfg.logprobs_mode == "processed" else "raw_logprobs",
            worker_extension_cls="rllib_p3o.vllm_ext.WeightSyncExtension",
            # Sampling comes only from our SamplingParams, never from the model's generation_config defaults.
            generation_config="vllm",
        )
        if current_platform.is_cpu():
            kwargs.update(enforce_eager=True, kv_cache_memory_bytes=CPU_DEFAULT_KV_CACHE_BYTES)
        kwargs.update(cfg.vllm_kwargs or {})
        t0 = time.perf_counter()
        llm = LLM(**kwargs)
        logger.info("vLLM engine for %s ready in %.1fs (runner %d)", model, time.perf_counter() - t0,
                    self.worker_index)
        return llm

    def _max_model_len(self) -> int:
        """Longest prompt of the datasets + max_tokens (vLLM silently truncates past max_model_len)."""
        prompts = [r["prompt"] for r in self.env.rows + self.env.eval_rows]
        longest = max(len(ids) for ids in self.tokenizer(prompts, add_special_tokens=True)["input_ids"])
        return int(longest + self.config.max_tokens)

    def _encode(self, prompt: str) -> List[int]:
        return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]

    def has_engine(self) -> bool:
        return self._llm is not None

    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.tokenizer.eos_token_id)

    def _sampling_params(self, seed: int, **overrides):
        from vllm import SamplingParams

        cfg = self.config
        kw = dict(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                  max_tokens=cfg.max_tokens, logprobs=0, seed=seed)
        kw.update(overrides)
        return SamplingParams(**kw)

    def _request_seed(self, group: int) -> int:
        # Per-request seeds make rollouts reproducible regardless of batch composition.
        return zlib.crc32(f"{self.config.seed or 0}/{self.worker_index}/{group}".encode()) & 0x7FFFFFFF

    # -- EnvRunner API --------------------------------------------------------------------------------------------

    def assert_healthy(self) -> None:
        if self.is_sampler and self._llm is None:
            raise RuntimeError(f"VLLMEnvRunner {self.worker_index} has no engine.")

    def get_spaces(self):
        spaces = (TextEnv.observation_space_default(), TextEnv.action_space_default())
        return {INPUT_ENV_SPACES: spaces, DEFAULT_MODULE_ID: spaces}

    def prompts_per_sample(self) -> int:
        return math.ceil(self.config.online_prompts_per_step / max(1, self.num_workers))

    def _engines(self) -> List[tuple]:
        """``(source name, engine, samples per prompt, sampling overrides)`` for the policy and each behavior model."""
        from rllib_p3o.p3o import behavior_sample_counts

        counts = behavior_sample_counts(self.config)
        engines = [("online", self._llm, self.config.group_size - sum(counts), {})]
        for (spec, llm), n in zip(self._behavior, counts):
            overrides = {k: spec[k] for k in ("temperature", "top_p", "top_k", "max_tokens") if k in spec}
            engines.append((behavior_source_name(spec), llm, n, overrides))
        return [e for e in engines if e[2] > 0]

    def sample(self, num_prompts: Optional[int] = None, **kwargs) -> List:
        """Sample ``group_size`` completions for each of ``num_prompts`` prompts; one episode per completion.

        With behavior models, each prompt group holds ``group_size - Σ behavior samples`` policy completions and
        each behavior model's share, generated with that model's own sampling parameters.
        """
        from vllm.inputs import TokensPrompt

        from rllib_p3o.offline import source_id

        t_start = time.perf_counter()
        idle = t_start - self._last_sample_end if self._last_sample_end is not None else 0.0
        rows = self.env.next_rows(num_prompts or self.prompts_per_sample())
        prompt_ids = [self._encode(r["prompt"]) for r in rows]
        first_group = self._groups_sampled
        self._groups_sampled += len(rows)
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompt_ids]

        # (row index, prompt ids, completion ids, behavior log-probs, finish reason, text, source, sampling params)
        flat = []
        t_gen = 0.0
        for k, (source, llm, n, overrides) in enumerate(self._engines()):
            params = [self._sampling_params(self._request_seed(first_group + i) + k, n=n, **overrides)
                      for i in range(len(rows))]
            t0 = time.perf_counter()
            outputs = llm.generate(requests, params, use_tqdm=False)
            t_gen += time.perf_counter() - t0
            for i, (pids, out) in enumerate(zip(prompt_ids, outputs)):
                for comp in out.outputs:
                    ids = list(comp.token_ids)
                    logps = [lp[tid].logprob for tid, lp in zip(ids, comp.logprobs)]
                    text = self.tokenizer.decode(ids, skip_special_tokens=True)
                    flat.append((i, pids, ids, logps, comp.finish_reason, text, source, params[i]))
        rewards = self.env.score([rows[f[0]]["prompt"] for f in flat], [f[5] for f in flat], [rows[f[0]] for f in flat])

        episodes = []
        # Group ids are unique across runners and iterations: advantages are normalized within a prompt group,
        # over the policy's and the behavior models' completions together.
        group_base = self.worker_index * 10**12
        for (i, pids, ids, logps, finish, text, source, sp), reward in zip(flat, rewards):
            episodes.append(completion_episode(
                prompt_ids=pids, completion_ids=ids, behavior_logprobs=logps, reward=float(reward),
                weights_seq_no=self._weights_seq_no, group_id=group_base + first_group + i,
                source_id=source_id(source),
                infos={"prompt": rows[i]["prompt"], "completion": text, "finish_reason": finish, "source": source,
                       "temperature": sp.temperature, "top_p": sp.top_p, "logprobs_mode": self.config.logprobs_mode},
            ))
        n_tokens = sum(len(f[2]) for f in flat)
        self._env_steps_lifetime += len(episodes)
        self.metrics.log_value(NUM_ENV_STEPS_SAMPLED, len(episodes), reduce="sum")
        self.metrics.log_value(NUM_EPISODES, len(episodes), reduce="sum")
        self.metrics.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, len(episodes), reduce="lifetime_sum")
        self.metrics.log_value(NUM_EPISODES_LIFETIME, len(episodes), reduce="lifetime_sum")
        self.metrics.log_value(EPISODE_RETURN_MEAN, float(np.mean(rewards)), window=1)
        self.metrics.log_value("generate_time_s", t_gen, window=1)
        self.metrics.log_value("generated_tokens_per_s", n_tokens / max(t_gen, 1e-9), window=1)
        # Time this runner sat without a sample() request (async mode keeps this near 0).
        self.metrics.log_value("idle_time_s", idle, reduce="sum")
        self._last_sample_end = time.perf_counter()
        return episodes

    def get_metrics(self):
        return self.metrics.reduce()

    def evaluate_heldout(self, max_prompts: int = 200) -> Optional[Dict[str, float]]:
        """Greedy completions on the held-out rows, scored by the reward function."""
        if self._llm is None or not self.env.eval_rows:
            return None
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows = self.env.eval_rows[:max_prompts]
        params = SamplingParams(n=1, temperature=0.0, max_tokens=self.config.max_tokens)
        outs = self._llm.generate([TokensPrompt(prompt_token_ids=self._encode(r["prompt"])) for r in rows],
                                  params, use_tqdm=False)
        completions = [self.tokenizer.decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in outs]
        rewards = self.env.score([r["prompt"] for r in rows], completions, rows)
        return {"reward_mean": float(np.mean(rewards)), "num_prompts": float(len(rows))}

    # -- weights ------------------------------------------------------------------------------------------------

    def probe_token_ids(self) -> List[int]:
        """A fixed sequence (first prompt + a few tokens) on which learner and engine log-probs are compared."""
        ids = self._encode(self.env.rows[0]["prompt"])
        # Fits max_model_len with the one token the probe request must generate.
        extra = [t % len(self.tokenizer) for t in range(3, 3 + min(8, self.config.max_tokens - 1))]
        return ids + extra

    def load_policy_weights(self, payload: Dict[str, Any]) -> Dict[str, float]:
        """Load new policy weights into the engine in place, then verify them (see module docstring)."""
        seq = int(payload["weights_seq_no"])
        if self._llm is None:
            self._weights_seq_no = seq
            return {}
        import safetensors.torch

        t0 = time.perf_counter()
        state = payload["rl_module"]
        if isinstance(state, ray.ObjectRef):
            state = ray.get(state)
        state = state.get(DEFAULT_MODULE_ID, state)
        hf = {k[len("lm."):]: v.contiguous() for k, v in state.items() if k.startswith("lm.")}
        if not hf:
            raise WeightSyncError(f"weight payload has no 'lm.*' tensors (keys: {list(state)[:5]})")
        if self._tied_embeddings:
            hf.pop("lm_head.weight", None)  # shares storage with the embedding; vLLM re-ties it
        blob = safetensors.torch.save(hf)
        engine_stats = self._llm.collective_rpc("p3o_reload_weights", args=(blob,))[0]
        self._llm.reset_prefix_cache()
        self._weights_seq_no = seq
        stats = {"load_s": time.perf_counter() - t0, "engine_reload_s": engine_stats["engine_reload_s"]}
        probe = payload.get("probe")
        if probe is not None:
            stats["probe_max_abs_diff"] = self.verify_weights(probe["token_ids"], probe["logprobs"],
                                                              payload.get("tolerance", 1e-3))
        return stats

    def engine_logprobs(self, token_ids: List[int]) -> np.ndarray:
        """The engine's log-prob of each token of ``token_ids`` given its prefix (length ``len - 1``)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        out = self._llm.generate([TokensPrompt(prompt_token_ids=list(token_ids))],
                                 SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0), use_tqdm=False)[0]
        return np.asarray([lp[t].logprob for t, lp in zip(token_ids[1:], out.prompt_logprobs[1:])], dtype=np.float64)

    def verify_weights(self, token_ids: List[int], expected: List[float], tolerance: float) -> float:
        got = self.engine_logprobs(token_ids)
        diff = float(np.max(np.abs(got - np.asarray(expected, dtype=np.float64))))
        if not diff <= tolerance:
            raise WeightSyncError(
                f"runner {self.worker_index}: after loading weights v{self._weights_seq_no} the engine's log-probs "
                f"differ from the learner's by up to {diff:.3g} (tolerance {tolerance}); the engine does not hold "
                f"the learner's weights.")
        return diff

    # -- state / checkpointing ------------------------------------------------------------------------------------

    def get_state(self, components=None, *, not_components=None, **kwargs) -> Dict[str, Any]:
        return {"weights_seq_no": self._weights_seq_no, NUM_ENV_STEPS_SAMPLED_LIFETIME: self._env_steps_lifetime,
                "groups_sampled": self._groups_sampled}

    def set_state(self, state: Dict[str, Any]) -> None:
        if "rl_module" in state and self._llm is not None:
            self.load_policy_weights({"rl_module": state["rl_module"],
                                      "weights_seq_no": state.get("weights_seq_no", self._weights_seq_no)})
        self._weights_seq_no = int(state.get("weights_seq_no", self._weights_seq_no))
        self._env_steps_lifetime = int(state.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, self._env_steps_lifetime))
        self._groups_sampled = int(state.get("groups_sampled", self._groups_sampled))

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
        self._llm, self._behavior = None, []
