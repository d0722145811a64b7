"""The signature of ``P3OConfig.training``: one keyword argument per P3O setting, with its type and default.

Generated from `rllib_p3o.core.settings` by ``make reference`` (`devtools.reference`): do not edit by hand;
``tests/test_settings.py`` fails when it is stale. ``P3OConfig`` inherits ``training`` from here, so that ``help()`` and
an IDE show every setting; the work is ``P3OConfig._set_training``'s.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ray.rllib.algorithms.algorithm_config import NotProvided
from typing_extensions import Self


class TrainingSignature:
    """``training`` with every P3O setting as a keyword argument (`rllib_p3o.core.settings`)."""

    def training(
        self,
        *,
        model: Optional[str] = NotProvided,
        trust_remote_code: bool = NotProvided,
        lora: Optional[Dict[str, Any]] = NotProvided,
        logprob_chunk_size: int = NotProvided,
        fused_head: str = NotProvided,
        loss: str = NotProvided,
        loss_config: Dict[str, Any] = NotProvided,
        kl_ref_coeff: float = NotProvided,
        entropy_coeff: float = NotProvided,
        ess_scope: str = NotProvided,
        max_consecutive_nonfinite_steps: int = NotProvided,
        group_size: int = NotProvided,
        prompts_per_step: int = NotProvided,
        max_tokens: int = NotProvided,
        temperature: float = NotProvided,
        top_p: float = NotProvided,
        top_k: int = NotProvided,
        kept_set_cap: int = NotProvided,
        logprobs_mode: str = NotProvided,
        vllm_kwargs: Dict[str, Any] = NotProvided,
        async_sampling: bool = NotProvided,
        max_staleness: int = NotProvided,
        inflight_weight_updates: bool = NotProvided,
        inflight_kv_cache: str = NotProvided,
        behavior_models: List[Dict[str, Any]] = NotProvided,
        dynamic_sampling: bool = NotProvided,
        dynamic_sampling_max_rounds: int = NotProvided,
        overlong_buffer: int = NotProvided,
        overlong_penalty: float = NotProvided,
        overlong_prompts: str = NotProvided,
        log_completions: int = NotProvided,
        verify_weight_sync: bool = NotProvided,
        weight_sync_tolerance: Optional[float] = NotProvided,
        weight_sync_rtol: Optional[float] = NotProvided,
        weight_sync_timeout_s: float = NotProvided,
        eval_interval: int = NotProvided,
        eval_max_prompts: int = NotProvided,
        eval_temperature: float = NotProvided,
        eval_samples_per_prompt: int = NotProvided,
        offline_fraction: Optional[float] = NotProvided,
        offline_skip_bad_rows: bool = NotProvided,
        offline_rescore_model: Optional[str] = NotProvided,
        offline_max_seq_len: int = NotProvided,
        offline_reader: str = NotProvided,
        offline_provenance: Any = NotProvided,
        offline_shuffle: bool = NotProvided,
        record_rollouts: Optional[str] = NotProvided,
        precision: Optional[str] = NotProvided,
        rollout_dtype: Optional[str] = NotProvided,
        rollout_quantization: Optional[str] = NotProvided,
        num_threads_per_learner: Optional[int] = NotProvided,
        num_threads_per_env_runner: Optional[int] = NotProvided,
        **kwargs: Any,
    ) -> Self:
        """Sets the training options: P3O's own (below; their meaning: the configuration reference,
        docs/reference/configuration.md) and RLlib's (``lr``, ``grad_clip``, ``num_epochs``, ``minibatch_size``, ...).
        A key left out keeps its value; an unknown key raises TypeError, as RLlib's ``training`` does. Relative paths
        (``model``, ``behavior_models``' models, ``offline_rescore_model``, ``record_rollouts``) are resolved here,
        where the script runs.

        P3O's settings (group, then key (type, default)):

            Model:
                model (Optional[str], default None)
                trust_remote_code (bool, default False)
                lora (Optional[Dict[str, Any]], default None)
                logprob_chunk_size (int, default 8)
                fused_head (str, default "auto")
            Losses:
                loss (str, default "p3o")
                loss_config (Dict[str, Any], default {})
                kl_ref_coeff (float, default 0.0)
                entropy_coeff (float, default 0.0)
                ess_scope (str, default "version")
                max_consecutive_nonfinite_steps (int, default 3)
            Sampling:
                group_size (int, default 8)
                prompts_per_step (int, default 16)
                max_tokens (int, default 64)
                temperature (float, default 1.0)
                top_p (float, default 1.0)
                top_k (int, default -1)
                kept_set_cap (int, default 64)
                logprobs_mode (str, default "processed")
                vllm_kwargs (Dict[str, Any], default {})
                async_sampling (bool, default False)
                max_staleness (int, default 2)
                inflight_weight_updates (bool, default False)
                inflight_kv_cache (str, default "recompute")
                behavior_models (List[Dict[str, Any]], default [])
                dynamic_sampling (bool, default False)
                dynamic_sampling_max_rounds (int, default 8)
                overlong_buffer (int, default 0)
                overlong_penalty (float, default 1.0)
                overlong_prompts (str, default "error")
                log_completions (int, default 0)
            Sync:
                verify_weight_sync (bool, default True)
                weight_sync_tolerance (Optional[float], default None)
                weight_sync_rtol (Optional[float], default None)
                weight_sync_timeout_s (float, default 300.0)
            Evaluation:
                eval_interval (int, default 1)
                eval_max_prompts (int, default 200)
                eval_temperature (float, default 0.0)
                eval_samples_per_prompt (int, default 1)
            Offline:
                offline_fraction (Optional[float], default None)
                offline_skip_bad_rows (bool, default False)
                offline_rescore_model (Optional[str], default None)
                offline_max_seq_len (int, default 512)
                offline_reader (str, default "auto")
                offline_provenance (Any, default "auto")
                offline_shuffle (bool, default True)
                record_rollouts (Optional[str], default None)
            Precision:
                precision (Optional[str], default None)
                rollout_dtype (Optional[str], default None)
                rollout_quantization (Optional[str], default None)
            Resources:
                num_threads_per_learner (Optional[int], default None)
                num_threads_per_env_runner (Optional[int], default None)
        """
        settings: Dict[str, Any] = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}
        return self._set_training(settings, kwargs)  # type: ignore[attr-defined]
