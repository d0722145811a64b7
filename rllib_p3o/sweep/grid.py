"""What the claims sweep compares: methods (losses and their settings), regimes (how off-policy the data are) and
the quick and full grids. Pure configuration: no Ray, no Tune.

A regime is one Tune experiment (its trials differ only in method, seed and learning rate, which `P3O.reset_config`
can change in a reused actor); a method is a set of `RESETTABLE_KEYS` overrides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from rllib_p3o.p3o import P3OConfig
from rllib_p3o.tasks.demo_config import demo_config

# Methods: name -> config overrides (all keys in `rllib_p3o.trial_reuse.RESETTABLE_KEYS`).
METHODS: Dict[str, Dict[str, Any]] = {
    "p3o": {"loss": "p3o"},
    "grpo_eps0.2": {"loss": "grpo", "loss_config": {"clip_low": 0.2, "clip_high": 0.2}},
    "grpo_eps0.4": {"loss": "grpo", "loss_config": {"clip_low": 0.4, "clip_high": 0.4}},
    "grpo_eps0.6": {"loss": "grpo", "loss_config": {"clip_low": 0.6, "clip_high": 0.6}},
    "p3o_no_cap": {"loss": "p3o_no_cap"},
    "p3o_no_kl": {"loss": "p3o_no_kl"},
}
# Keys a method may set: each gets a `tune.sample_from` that reads the trial's method.
METHOD_KEYS: Tuple[str, ...] = ("loss", "loss_config")
DEFAULTS: Dict[str, Any] = {"loss": "p3o", "loss_config": {}}
# The Tune search key naming a trial's method (not a P3OConfig setting: `P3O.reset_config` ignores it).
METHOD = "sweep_method"
# Learning-rate schedule: linear warm-up over the first 10 iterations of 512 completions to a peak (as the demo's).
WARMUP_SAMPLES = 5120


def lr_schedule(peak: float) -> List[List[float]]:
    """``[[0, 1e-5], [5120, peak]]``: RLlib's piecewise-linear lr schedule (sampled completions → lr)."""
    return [[0, min(1e-5, peak)], [WARMUP_SAMPLES, peak]]


def method_value(key: str, spec: Any) -> Any:
    """``tune.sample_from`` function: the trial's method's value of ``key`` (its default when the method has none)."""
    return METHODS[spec.config[METHOD]].get(key, DEFAULTS[key])


@dataclass(frozen=True)
class Prepared:
    """Artifacts some regimes need (`rllib_p3o.sweep.prep`): paths of the models and of the stale recording."""

    base_model: str
    train_prompts: str  # .jsonl files of the demo task's rows
    heldout_prompts: str
    stronger_model: Optional[str] = None
    weaker_model: Optional[str] = None
    stale_recording: Optional[str] = None


@dataclass(frozen=True)
class Regime:
    """How the data reach the learner: a description for the report and the config changes it makes."""

    name: str
    description: str
    apply: Callable[[P3OConfig, Prepared], P3OConfig]
    needs: Tuple[str, ...] = ()  # fields of `Prepared` this regime reads


def _behavior(model: str, name: str) -> Dict[str, Any]:
    return {"model": model, "name": name, "samples": 4}


REGIMES: Dict[str, Regime] = {
    r.name: r
    for r in (
        Regime(
            "on_policy_4_steps",
            "on-policy rollouts, 4 optimizer steps per iteration (minibatches of 128 of 512)",
            lambda c, p: c.training(minibatch_size=128),
        ),
        Regime(
            "temperature_1.2",
            "rollouts sampled at temperature 1.2 (behavior log-probs of the tempered policy)",
            lambda c, p: c.training(temperature=1.2),
        ),
        Regime(
            "async_staleness_2",
            "async sampling: the runner keeps generating while the learner updates, "
            "samples up to 2 weight versions old",
            lambda c, p: c.training(async_sampling=True, max_staleness=2),
        ),
        Regime(
            "behavior_stronger",
            "4 of each group's 8 completions from a frozen stronger checkpoint",
            lambda c, p: c.training(behavior_models=[_behavior(p.stronger_model, "stronger")]),
            needs=("stronger_model",),
        ),
        Regime(
            "behavior_weaker",
            "4 of each group's 8 completions from a frozen weaker checkpoint",
            lambda c, p: c.training(behavior_models=[_behavior(p.weaker_model, "weaker")]),
            needs=("weaker_model",),
        ),
        Regime(
            "offline_stale",
            "offline only: trajectories recorded by the frozen base policy (staler as the "
            "learner improves), read once in recorded order",
            lambda c, p: c.training(offline_fraction=1.0).offline_data(
                input_=[p.stale_recording],
                # A small dataset on 2 cores: one reader, one preprocessing actor (Ray Data's defaults start many).
                input_read_method_kwargs={"override_num_blocks": 1},
                map_batches_kwargs={"concurrency": 1},
            ),
            needs=("stale_recording",),
        ),
    )
}


@dataclass(frozen=True)
class Grid:
    """One sweep: regimes × methods × seeds, ``iterations`` of 512 completions per trial, plus the lr stage."""

    regimes: Tuple[str, ...]
    methods: Tuple[str, ...]
    seeds: Tuple[int, ...]
    iterations: int
    target: float = 0.8
    lr_peaks: Tuple[float, ...] = ()  # the lr stage's candidates; empty: no lr stage, ``default_lr`` is used
    lr_methods: Tuple[str, ...] = ("p3o", "grpo_eps0.2")
    lr_seeds: Tuple[int, ...] = (0, 1)
    lr_regime: str = "on_policy_4_steps"
    default_lr: float = 5e-4
    eval_interval: int = 5
    extra: Dict[str, Any] = field(default_factory=dict)  # other `.training()` settings (tests: a tiny task)

    def num_trials(self) -> int:
        return len(self.regimes) * len(self.methods) * len(self.seeds) + (
            len(self.lr_peaks) * len(self.lr_methods) * len(self.lr_seeds)
        )


QUICK = Grid(
    regimes=("on_policy_4_steps", "temperature_1.2"), methods=("p3o", "grpo_eps0.2"), seeds=(0,), iterations=15
)
FULL = Grid(regimes=tuple(REGIMES), methods=tuple(METHODS), seeds=(0, 1, 2), iterations=40, lr_peaks=(2e-4, 5e-4, 1e-3))


def regime_config(regime: Regime, prepared: Prepared, grid: Grid) -> P3OConfig:
    """The demo config (64 prompts × 8 completions per iteration, greedy held-out eval every ``eval_interval``),
    changed by ``regime``."""
    config = demo_config(prepared.base_model, eval_interval=grid.eval_interval, **grid.extra)
    # Prompts by path and the reward by import path: Tune saves every trial's config (with rows, ~0.7 MB each),
    # and a reused actor compares configs.
    config.environment(
        env_config={
            **config.env_config,
            "dataset": prepared.train_prompts,
            "eval_dataset": prepared.heldout_prompts,
            "reward_fn": "rllib_p3o.tasks.arithmetic:arithmetic_reward",
        }
    )
    return regime.apply(config, prepared)
