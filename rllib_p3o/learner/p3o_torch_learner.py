"""P3O TorchLearner: padded token batch → the configured loss (`rllib_p3o.core.losses`), with RLlib's optimizer, grad-clip and metrics.

Batch columns (numpy or torch, right-padded; `rllib_p3o.core.columns.Columns`):
    ``input_ids`` [B, T], ``attention_mask`` [B, T], ``completion_mask`` [B, T-1] (1 on completion targets),
    ``behavior_logprobs`` [B, T-1], ``advantages`` [B]; optional ``ref_logprobs`` [B, T-1], ``source_id`` [B],
    ``staleness`` [B], ``weights_seq_no`` [B] (RLlib then logs how many updates behind the sampler each batch was).

Multi-learner scaling: the objective all-reduces its statistics (ESS sums, token count) over the learners' process
group, so with ``num_learners=k`` the ESS every learner uses is the ESS of the union of the k shards, and each
learner's loss is its share of the global token-mean. DDP averages gradients over the k learners, so the loss
handed to autograd is multiplied by k: the applied gradient then equals the gradient of one learner holding the
whole minibatch.

Non-finite steps: a step whose gradient (after DDP's all-reduce, so every learner decides alike) holds a NaN or inf
is skipped entirely (no optimizer step, no learning-rate step; RLlib's default would zero the bad entries and still
step Adam) and counted under ``skipped_nonfinite_steps``. After ``max_consecutive_nonfinite_steps`` in a row the
learner raises `NonFiniteStepError`, naming what was not finite: the loss, the ESS, the gradient, and which source's
rows held non-finite advantages or behavior log-probs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.utils.typing import ModuleID, ParamDict, TensorType

from rllib_p3o.core import batch_stats, metrics
from rllib_p3o.core.columns import Columns
from rllib_p3o.core.cpu_threads import fitting_threads
from rllib_p3o.core.losses import OldLogprobs, get_loss
from rllib_p3o.core.losses.kl_estimators import kl_k3
from rllib_p3o.core.losses.parts import CAP_RTOL
from rllib_p3o.core.sources import POLICY_SOURCE_ID
from rllib_p3o.learner import row_groups
from rllib_p3o.learner.compute import (
    LONGEST_ROW_POSITIONS,
    REAL_TOKENS,
    TOKEN_LOGP,
    TOKEN_POSITIONS,
    compute_loss,
    kept_set_overflow,
)
from rllib_p3o.learner.rl_module import load_causal_lm

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

# Per-group diagnostics: (batch column, metric group).
_GROUPINGS = ((Columns.SOURCE_ID, metrics.BY_SOURCE), (Columns.STALENESS, metrics.BY_STALENESS))


# Where torch has a fused Adam kernel (its default elsewhere is the per-tensor loop on CPU, foreach on CUDA).
_FUSED_ADAM_DEVICES = ("cpu", "cuda")

# Rows per forward pass when the learner recomputes π_old (`P3OTorchLearner._add_old_logprobs`).
OLD_LOGPROBS_CHUNK_ROWS = 64

# Torch's own thread count in this process, before any learner set one (the learner default in sync mode).
_TORCH_DEFAULT_THREADS = torch.get_num_threads()


class NonFiniteStepError(FloatingPointError):
    """Too many optimizer steps in a row had a non-finite loss or gradient; the message says what was not finite."""


class P3OTorchLearner(TorchLearner):
    """Applies the configured objective (``config.loss``, a name in `rllib_p3o.core.losses`) to a padded token batch."""

    def build(self) -> None:
        # The learner's own thread budget (`P3OConfig.learner_threads`): in async mode it shares the machine with
        # the runners' engines, and oversubscribed OpenMP threads spin-wait on each other. Set every time (also back
        # to torch's default): a local learner lives in the driver or a reused Tune actor, where an earlier run may
        # have set another; unchanged counts are left alone (an in-process vLLM engine forbids setting them).
        # A derived count no larger than this process's cores (Ray's logical CPUs may outnumber them); the user's own
        # ``num_threads_per_learner`` as it is (`rllib_p3o.core.cpu_threads`).
        threads = self.config.num_threads_per_learner or fitting_threads(
            self.config.learner_threads or _TORCH_DEFAULT_THREADS
        )
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        super().build()
        # The modules' compute options resolved on this learner's device now (packing check, the bucket plan's
        # measured call cost, compilation), before the first step and outside DDP's forward and backward.
        for module_id in self.module.keys():
            core = getattr(self.module[module_id].unwrapped(), "core", None)
            if core is not None:
                core.prepare(self._device)
        self._ref_models: Dict[ModuleID, torch.nn.Module] = {}
        self._consecutive_nonfinite = 0
        self._nonfinite_inputs: List[str] = []  # of the current step, from compute_loss_for_module
        self._loss_stats: Dict[str, float] = {}
        # The objective (`rllib_p3o.core.losses`) and its settings, resolved once (validated with the config).
        self._loss = get_loss(self.config.loss)
        self._loss_settings = self.config.loss_settings()
        self._ess_scope = self._loss.ess_scope_of(self._loss_settings)
        self._measure_mismatch = False  # set at the start of each update, for its first minibatch
        # Optimizer steps applied since the current update began: a row sampled by the weights at the update's start
        # is that many steps behind them at the next minibatch (`_row_lag`).
        self._steps_in_update = 0
        self._token_positions = [0.0, 0.0, 0.0]

    def update(self, *args: Any, batch: Any = None, training_data: Any = None, **kwargs: Any) -> Any:
        # The first minibatch of an update meets the weights that sampled the fresh rows: measure the mismatch there.
        self._measure_mismatch = True
        self._steps_in_update = 0
        self._token_positions = [0.0, 0.0, 0.0]  # real tokens, computed, padded to the longest row: over an update
        if self._loss.uses_old_logprobs(self._loss_settings):
            if training_data is None:
                training_data = TrainingData(batch=batch)
            training_data.solve_refs()
            if self._needs_old_logprobs(training_data.batch):
                self._add_old_logprobs(training_data.batch)
            return super().update(*args, training_data=training_data, **kwargs)
        return super().update(*args, batch=batch, training_data=training_data, **kwargs)

    def _needs_old_logprobs(self, batch: Any) -> bool:
        """Whether this batch needs π_old, as the loss declares it (`OldLogprobs`): always, or only where another
        model wrote rows (P3O's ``kl_anchor="auto"``: on-policy and async training pay no extra pass)."""
        need = self._loss.old_logprobs_needed(self._loss_settings)
        if need is OldLogprobs.FOR_OTHER_MODEL_ROWS:
            return any(bool(self._other_model_rows(rows) is not None) for rows in batch.policy_batches.values())
        return need is OldLogprobs.ALWAYS

    def _other_model_rows(self, batch: Any) -> Optional[torch.Tensor]:
        """[B] bool: the rows of ``batch`` another model wrote (`row_groups.other_model_rows`: a behavior model's
        live rows, another model's recorded rows); None when there are none."""
        if Columns.SOURCE_ID not in batch:
            return None
        rows = row_groups.other_model_rows(torch.as_tensor(batch[Columns.SOURCE_ID]).cpu())
        return rows if bool(rows.any()) else None

    @torch.no_grad()
    def _add_old_logprobs(self, batch: Any) -> None:
        """π_old for losses that need it: the log-probs of the whole batch under the weights before this update, one
        forward pass in chunks of ``OLD_LOGPROBS_CHUNK_ROWS`` rows, added as the column ``old_logprobs``."""
        t0 = time.perf_counter()
        for module_id, rows in batch.policy_batches.items():
            module = self.module[module_id].unwrapped()
            ids = torch.as_tensor(np.asarray(rows[Columns.INPUT_IDS]), device=self._device)
            attention = torch.as_tensor(np.asarray(rows[Columns.ATTENTION_MASK]), device=self._device)
            kept = rows[Columns.KEPT_IDS] if Columns.KEPT_IDS in rows else None
            kept = None if kept is None else torch.as_tensor(np.asarray(kept), device=self._device)
            chunks = [
                module.token_logprobs(
                    ids[s : s + OLD_LOGPROBS_CHUNK_ROWS],
                    attention[s : s + OLD_LOGPROBS_CHUNK_ROWS],
                    kept_ids=None if kept is None else kept[s : s + OLD_LOGPROBS_CHUNK_ROWS],
                )
                for s in range(0, ids.shape[0], OLD_LOGPROBS_CHUNK_ROWS)
            ]
            rows[Columns.OLD_LOGPROBS] = torch.cat([c[TOKEN_LOGP] for c in chunks]).float().cpu().numpy()
            self.metrics.log_value((module_id, metrics.OLD_LOGPROBS_S), time.perf_counter() - t0, window=1)

    def get_parameters(self, module) -> List[torch.nn.Parameter]:
        """The parameters that train: all of them, or under LoRA the adapter's (the frozen base gets no gradient,
        no optimizer state and no DDP all-reduce)."""
        return [p for p in module.parameters() if p.requires_grad]

    def configure_optimizers_for_module(self, module_id: ModuleID, config: "AlgorithmConfig" = None) -> None:
        """RLlib's default optimizer (Adam on the trainable parameters, at ``config.lr`` or its schedule) with torch's
        fused kernel: one pass over all tensors instead of about ten small ops per tensor (several times faster on a
        CPU). Devices or dtypes without a fused kernel get the default."""
        params = self.get_parameters(self._module[module_id])
        fused = all(p.is_floating_point() and p.device.type in _FUSED_ADAM_DEVICES for p in params) or None
        self.register_optimizer(
            module_id=module_id,
            optimizer=torch.optim.Adam(params, fused=fused),
            params=params,
            lr_or_lr_schedule=config.lr,
        )

    def apply_gradients(self, gradients_dict: ParamDict) -> None:
        """RLlib's optimizer step, unless the gradient is not finite (module docstring)."""
        grads = list(gradients_dict.values())
        # Two fused passes instead of one check per tensor: g * 0 is 0 where g is finite and NaN where it is not, so
        # its norm is NaN exactly when g has a non-finite entry (g's own norm could overflow). Per tensor on failure.
        finite = not grads or bool(
            torch.isfinite(torch.stack(torch._foreach_norm(torch._foreach_mul(grads, 0.0)))).all()
        )
        bad = [] if finite else [pid for pid, g in gradients_dict.items() if not bool(torch.isfinite(g).all())]
        self.metrics.log_value((DEFAULT_MODULE_ID, metrics.SKIPPED_NONFINITE_STEPS), 1 if bad else 0, reduce="sum")
        if not bad:
            self._consecutive_nonfinite = 0
            super().apply_gradients(gradients_dict)
            self._steps_in_update += 1
            return
        self._consecutive_nonfinite += 1
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        if self._consecutive_nonfinite >= self.config.max_consecutive_nonfinite_steps:
            raise NonFiniteStepError(
                f"{self._consecutive_nonfinite} optimizer steps in a row were skipped because they were not finite "
                f"(max_consecutive_nonfinite_steps={self.config.max_consecutive_nonfinite_steps}). Last step: "
                + "; ".join(self._describe_nonfinite(len(bad), len(gradients_dict)))
            )

    def _describe_nonfinite(self, bad_params: int, params: int) -> List[str]:
        what = [f"{k} = {v}" for k, v in self._loss_stats.items() if not np.isfinite(v)]
        what.append(f"gradient non-finite in {bad_params} of {params} parameter tensors")
        return what + self._nonfinite_inputs

    def compute_loss_for_module(
        self, *, module_id: ModuleID, config: "AlgorithmConfig", batch: Dict[str, Any], fwd_out: Dict[str, TensorType]
    ) -> TensorType:
        """``config`` is a `P3OConfig`: its ``loss`` (with ``loss_config``, its ``ess_scope`` among them) and coefficients choose the
        objective."""
        logp = fwd_out[TOKEN_LOGP]
        mask = batch[Columns.COMPLETION_MASK].bool()
        kept = batch.get(Columns.KEPT_IDS)
        if kept is not None and kept.shape[-1]:  # top-k/top-p: tokens whose kept set overflowed leave the loss
            overflow = kept_set_overflow(kept, mask)
            share = float(overflow.sum()) / max(1.0, float(mask.sum()))
            self.metrics.log_value((module_id, metrics.KEPT_SET_OVERFLOW_SHARE), share, window=1)
            mask = mask & ~overflow
        ref_logp = batch.get(Columns.REF_LOGPROBS)
        if ref_logp is None and config.kl_ref_coeff > 0:
            ref_logp = self._reference_logprobs(module_id, config, batch)
        lag = self._row_lag(batch)
        groups, num_groups = self._ess_groups(batch, lag) if self._loss.ess_scoped else (None, 0)
        loss, ess, stats = compute_loss(
            self._loss,
            self._loss_settings,
            fwd_out,
            batch[Columns.BEHAVIOR_LOGPROBS],
            batch[Columns.ADVANTAGES],
            mask,
            ref_logprobs=ref_logp,
            kl_ref_coeff=config.kl_ref_coeff,
            entropy_coeff=config.entropy_coeff,
            ess_groups=groups,
            num_ess_groups=num_groups,
            old_logprobs=batch.get(Columns.OLD_LOGPROBS),
            other_model_rows=_on(self._other_model_rows(batch), mask.device),
            lagging=self._lagging_rows(batch, lag),
        )

        self.metrics.log_dict({(module_id, k): float(v) for k, v in {**stats, metrics.ESS: ess}.items()}, window=1)
        if fwd_out.get(TOKEN_POSITIONS):
            self._token_positions[0] += fwd_out[REAL_TOKENS]
            self._token_positions[1] += fwd_out[TOKEN_POSITIONS]
            self._token_positions[2] += fwd_out[LONGEST_ROW_POSITIONS]
            real, computed, unbucketed = self._token_positions
            self.metrics.log_dict(
                {
                    (module_id, metrics.PADDING_SHARE): 1.0 - real / computed,
                    (module_id, metrics.PADDING_SHARE_UNBUCKETED): 1.0 - real / unbucketed,
                },
                window=1,
            )
        self._loss_stats = {metrics.LOSS: float(loss.detach()), metrics.ESS: float(ess)}
        self._nonfinite_inputs = _nonfinite_inputs(batch, mask)
        if self._measure_mismatch and Columns.STALENESS in batch:
            self._measure_mismatch = False
            fresh = mask & (batch[Columns.STALENESS] == 0).unsqueeze(-1)
            mismatch = batch_stats.mismatch_metrics(logp, batch[Columns.BEHAVIOR_LOGPROBS], fresh)
            self.metrics.log_dict({(module_id, k): float(v) for k, v in mismatch.items()}, window=1)
        for column, label in _GROUPINGS:
            if column in batch:
                own_cap = label == metrics.BY_SOURCE and groups is not None
                self._log_groups(module_id, column, label, logp.detach(), batch, mask, ess, own_cap)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        return loss * world

    def _row_lag(self, batch: Dict[str, Any]) -> Optional[torch.Tensor]:
        """Each row's (or token's) lag behind the current weights (`row_groups.row_lag`); None without a staleness
        column."""
        if Columns.STALENESS not in batch:
            return None
        versions = batch.get(Columns.POLICY_VERSION)
        if versions is not None and Columns.WEIGHTS_SEQ_NO in batch:
            row_version = batch[Columns.WEIGHTS_SEQ_NO]
            mask = batch[Columns.COMPLETION_MASK].bool()
            # Per token only where a completion spans versions (in-flight weight updates): else the rows' own.
            if bool(((versions != row_version.unsqueeze(-1)) & mask).any()):
                return row_groups.row_lag(batch[Columns.STALENESS], self._steps_in_update, row_version, versions)
        return row_groups.row_lag(batch[Columns.STALENESS], self._steps_in_update)

    def _lagging_rows(self, batch: Dict[str, Any], lag: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """[B] bool: the rows a trust region acts on (`row_groups.lagging_rows`); None when there are none."""
        if lag is None or Columns.SOURCE_ID not in batch:
            return None
        return row_groups.lagging_rows(batch[Columns.SOURCE_ID], lag)

    def _ess_groups(
        self, batch: Dict[str, Any], lag: Optional[torch.Tensor] = None
    ) -> Tuple[Optional[torch.Tensor], int]:
        """Each row's ESS group for the scope the loss asks for (`LossSpec.ess_scope_of` its settings,
        `row_groups.ess_groups`); ``(None, 0)`` for "batch"."""
        if Columns.SOURCE_ID not in batch:
            return None, 0
        return row_groups.ess_groups(self._ess_scope, batch[Columns.SOURCE_ID], lag)

    def _log_groups(self, module_id, column, label, logp, batch, mask, ess, own_cap: bool = False) -> None:
        """Diagnostics per value of ``column``: per source (the policy, offline data, each behavior model) or
        per staleness (policy versions behind). Local to this learner.

        With ``ess_scope="batch"`` the loss uses one ESS for the whole batch and these values show which part of it
        is off-policy; with "source" each source's cap fraction is measured against its own ESS. They are local
        because a group need not be present on every learner (no collective can depend on it).
        """
        with torch.no_grad():
            source = batch[column]
            log_ratio = logp - torch.where(mask, batch[Columns.BEHAVIOR_LOGPROBS].to(logp.dtype), logp)
            for sid in torch.unique(source).tolist():
                if sid < 0:  # not applicable (e.g. staleness of offline rows)
                    continue
                m = mask & (source == sid).unsqueeze(-1)
                n = float(m.sum())
                if n == 0:
                    continue
                r = torch.exp(log_ratio[m].double())
                key = (module_id, label, str(int(sid)))
                group_ess = float(batch_stats.effective_sample_size_from_log_ratios(log_ratio, m, all_reduce=False))
                cap = group_ess if own_cap else float(ess)  # ess_scope="source": each source is capped by its own
                kl = kl_k3(log_ratio[m], torch.zeros_like(log_ratio[m]))
                self.metrics.log_dict(
                    {
                        key + (metrics.ESS,): group_ess,
                        key + (metrics.RATIO_MEAN,): float(r.mean()),
                        key + (metrics.CAP_FRACTION,): float((r > cap * (1 + CAP_RTOL)).double().mean()),
                        key + (metrics.KL_BEHAVIOR,): float(kl.mean()),
                        key + (metrics.NUM_TOKENS,): n,
                    },
                    window=1,
                )

    @torch.no_grad()
    def _reference_logprobs(self, module_id: ModuleID, config, batch) -> torch.Tensor:
        """Log-probs under the frozen initial model, for the optional reference-KL term: under LoRA the module's own
        base with the adapter disabled (no second copy), else a copy loaded once."""
        module = self.module[module_id].unwrapped()
        if module.lora_spec:
            return module.reference_logprobs(batch[Columns.INPUT_IDS], batch[Columns.ATTENTION_MASK])
        if module_id not in self._ref_models:
            ref = (
                load_causal_lm(
                    module.model_path,
                    module.model_config.get("dtype", "float32"),
                    module.model_config.get("trust_remote_code", False),
                )
                .to(self._device)
                .eval()
            )
            for p in ref.parameters():
                p.requires_grad_(False)
            self._ref_models[module_id] = ref
        ref = self._ref_models[module_id]
        ids = batch[Columns.INPUT_IDS].long()
        logits = ref(input_ids=ids, attention_mask=batch[Columns.ATTENTION_MASK]).logits[:, :-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def _on(rows: Optional[torch.Tensor], device: torch.device) -> Optional[torch.Tensor]:
    return None if rows is None else rows.to(device)


def _nonfinite_inputs(batch: Dict[str, Any], mask: torch.Tensor) -> List[str]:
    """Which rows' inputs are not finite, by column and source id ("source 0" is the policy's own samples)."""
    out = []
    source = batch.get(Columns.SOURCE_ID)
    bad_behavior = (~torch.isfinite(batch[Columns.BEHAVIOR_LOGPROBS]) & mask).any(-1)
    for column, bad_rows in (
        (Columns.ADVANTAGES, ~torch.isfinite(batch[Columns.ADVANTAGES])),
        (Columns.BEHAVIOR_LOGPROBS, bad_behavior),
    ):
        if bool(bad_rows.any()):
            ids = sorted(set(source[bad_rows].tolist())) if source is not None else []
            names = ", ".join("policy" if i == POLICY_SOURCE_ID else f"source id {i}" for i in ids) or "unknown source"
            out.append(f"{int(bad_rows.sum())} rows with non-finite {column} ({names})")
    return out
