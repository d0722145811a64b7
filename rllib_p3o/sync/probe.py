"""Weight-sync verification: the engine's log-probs of a fixed probe sequence must match the learner's.

A sync (`rllib_p3o.driver.weight_sync`) is checked in one of two ways:
- **at load**: the payload carries the learner's probe log-probs and the runner scores the probe in a call of its own
  right after loading. Used where the weights must be verified before anything else runs: a trial's first sync, a
  restored checkpoint, a restarted runner.
- **riding along** (every training iteration): at load the runner arms its `ProbeRider` (`rllib_p3o.runner.probe_rider`), and the probe joins the next
  batch the policy engine generates (a sample() or a held-out evaluation) as one more request. That costs the engine
  a few prompt tokens in a batch it runs anyway, instead of a call of its own. The runner returns the engine's probe
  log-probs (a `ProbeResult`) with those results, and the driver compares them (`rllib_p3o.driver.weight_sync.LearnerProbes.check`) before it
  uses them: no sample generated with unverified weights reaches the learner, and a failed check raises
  `WeightSyncError` naming the runner and the version. The learner's side is scored in a background thread
  (`LearnerProbes.start`) while the runners load and generate.
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence

import numpy as np


class WeightSyncError(RuntimeError):
    """The engine does not hold the weights the learner sent (a silent sync failure would look like staleness)."""


class PolicyDivergedError(FloatingPointError):
    """The learner's policy has diverged: its log-probs on the probe are not finite, or its logits have exploded."""


# A log-prob below this on the probe (a probability under e^-1000) means the learner's logits have exploded: no sane
# language model is that sure of anything, float32 cannot even represent e^-104, and the engine's log-probs of such
# weights differ from the learner's by float32 rounding of thousands (1e-3 and more), which would look like a sync
# failure. Up to this magnitude float32 rounding stays under 4e-4, below the float32 tolerance (1e-3): the learner's
# side is checked against this first (`check_not_diverged`), so divergence is never reported as a sync failure.
DIVERGED_LOGPROB = -1000.0


def check_not_diverged(learner_logprobs: Sequence[float], where: str) -> None:
    """Raise `PolicyDivergedError` if a learner probe log-prob is not finite or below `DIVERGED_LOGPROB`. ``where``
    opens the message (e.g. "weights v7")."""
    logprobs = np.asarray(learner_logprobs, dtype=np.float64)
    bad = ~np.isfinite(logprobs) | (logprobs < DIVERGED_LOGPROB)
    if bad.any():
        i = int(np.argmax(bad))
        raise PolicyDivergedError(
            f"{where}: the policy has diverged: its log-prob of probe token {i + 1} is {logprobs[i]:.6g} (a sane model "
            f"stays above {DIVERGED_LOGPROB:g}; worst over the probe: {np.nanmin(logprobs):.6g}), so its logits have "
            "exploded."
        )


# A low-precision engine's rounding moves single probe tokens past their bound now and then (a sharpening policy's
# larger logits round coarser): up to this share of the probe's tokens (at least one) may exceed their bound by up
# to `OUTLIER_FACTOR` times it. Found in a 30-iteration bf16-rollout run at lr 2e-3: one token of 12 off by 0.169
# where 0.168 was allowed, which ended the run as a "sync failure".
OUTLIER_SHARE = 0.1
OUTLIER_FACTOR = 2.0


def check_probe(
    engine_logprobs: np.ndarray,
    learner_logprobs: Sequence[float],
    tolerance: float,
    where: str,
    rtol: float = 0.0,
) -> float:
    """``max_t |engine_t - learner_t|`` over the probe's log-probs. Raises `WeightSyncError` where the mean difference
    over the probe exceeds ``tolerance``, or a token's difference exceeds its bound ``tolerance + rtol · |learner_t|``
    (or is NaN). With ``rtol = 0`` (a float32 engine) every token must keep its bound.

    The relative and the mean bounds are for low-precision engines (``rtol > 0``). Their rounding differs from
    torch's, and the difference grows with a log-prob's magnitude and varies from token to token: on the demo model a
    bf16 engine's log-probs differed from the same weights' bf16 forward in torch by 0.005-0.06 on most tokens, and
    by up to 0.26 on single ones. A wrong sync (a corrupted, missed or mis-mapped tensor, a stale LM head) moves
    every token; rounding moves a few: the mean tells them apart where a single token cannot. So there, isolated
    outliers pass: at most `OUTLIER_SHARE` of the tokens (at least one) may exceed their bound, by at most
    `OUTLIER_FACTOR` times it. ``where`` opens the error message (e.g. "runner 1: after loading weights v7").
    """
    learner = np.asarray(learner_logprobs, dtype=np.float64)
    raw = np.abs(np.asarray(engine_logprobs, dtype=np.float64) - learner)
    diff = np.where(np.isnan(raw), np.inf, raw)  # a NaN is beyond every bound
    allowed = tolerance + rtol * np.abs(learner)
    beyond = diff > allowed
    outliers_allowed = max(1, int(OUTLIER_SHARE * len(diff))) if rtol > 0 else 0
    gross = diff > (OUTLIER_FACTOR * allowed if rtol > 0 else allowed)
    if gross.any() or beyond.sum() > outliers_allowed:
        worst = int(np.argmax(diff - allowed))
        bound = f"tolerance {tolerance}" + (f" + {rtol} x |log-prob| = {allowed[worst]:.3g}" if rtol else "")
        others = (
            f"; {int(beyond.sum())} of {len(diff)} tokens beyond their bound, at most {outliers_allowed} by at most "
            f"{OUTLIER_FACTOR:g}x allowed as rounding"
            if rtol > 0
            else ""
        )
        raise WeightSyncError(
            f"{where} the engine's log-prob of probe token {worst + 1} differs from the learner's by {raw[worst]:.3g} "
            f"(learner {learner[worst]:.3f}; {bound}{others}); the engine does not hold the learner's weights."
        )
    if not float(np.mean(diff)) <= tolerance:
        raise WeightSyncError(
            f"{where} the engine's log-probs of the {len(diff)} probe tokens differ from the learner's by "
            f"{float(np.mean(diff)):.3g} on average (tolerance {tolerance}); the engine does not hold the learner's "
            "weights."
        )
    return float(np.max(diff))


class ProbeResult(NamedTuple):
    """The engine's probe log-probs with one weights version, as a runner returns them."""

    runner_id: int
    weights_seq_no: int
    logprobs: List[float]
