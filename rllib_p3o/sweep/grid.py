"""What the claims sweep compares: tasks (the demo's, and the claims bench's sorting task), methods (losses and their
settings), regimes (how off-policy the data are) and the grids. Pure configuration: no Ray, no Tune.

A regime is one Tune experiment (its trials differ only in method, seed and learning rate, which `P3O.reset_config`
can change in a reused actor); a method is a set of `RESETTABLE_KEYS` overrides.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple, Union

from rllib_p3o.core.losses import LOSSES, get_loss
from rllib_p3o.core.losses.p3o import ALONE_FORM, OTHER_MODEL_WEIGHTS
from rllib_p3o.core.settings import BY_KEYWORD
from rllib_p3o.p3o import P3OConfig
from rllib_p3o.tasks.addition import AdditionTask
from rllib_p3o.tasks.arithmetic import ArithmeticTask
from rllib_p3o.tasks.bench_config import EVAL_SAMPLES_PER_PROMPT, addition_config, bench_config
from rllib_p3o.tasks.demo_config import demo_config
from rllib_p3o.tasks.sorting import SortingTask

# The repository this package lives in: grids name the committed results they build on relative to it.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Methods: name -> config overrides (all keys in `rllib_p3o.driver.trial_reuse.RESETTABLE_KEYS`).
# The demo sweep's P3O and its ablations were measured with P3O's KL as it was then (and as the paper writes it): the
# plain k3 toward π_b; they stay so, so that its table reproduces. Every P3O form of the earlier grids names its trust
# region ("none", as it was measured), so that its name keeps its meaning whatever P3O's default.
# The earlier grids ran every P3O form with one ESS per batch unless the form named another scope, so those forms name
# it ("batch"), whatever P3O's default scope.
_NONE = {"trust_region": "none", "ess_scope": "batch"}
_K3_TO_BEHAVIOR = {"kl_estimator": "k3", "kl_anchor": "behavior", **_NONE}
METHODS: Dict[str, Dict[str, Any]] = {
    "p3o": {"loss": "p3o", "loss_config": _K3_TO_BEHAVIOR},
    "grpo_eps0.2": {"loss": "grpo", "loss_config": {"clip_low": 0.2, "clip_high": 0.2}},
    "grpo_eps0.4": {"loss": "grpo", "loss_config": {"clip_low": 0.4, "clip_high": 0.4}},
    "grpo_eps0.6": {"loss": "grpo", "loss_config": {"clip_low": 0.6, "clip_high": 0.6}},
    "p3o_no_cap": {"loss": "p3o_no_cap", "loss_config": _K3_TO_BEHAVIOR},
    "p3o_no_kl": {"loss": "p3o_no_kl", "loss_config": {"ess_scope": "batch"}},
    # The baselines peers ship (π_old recomputed by the learner; see the losses guide), at verl's defaults.
    "grpo_tis_eps0.2": {"loss": "grpo_tis", "loss_config": {"clip_low": 0.2, "clip_high": 0.2}},
    "grpo_tis_eps0.4": {"loss": "grpo_tis", "loss_config": {"clip_low": 0.4, "clip_high": 0.4}},
    "grpo_seq_mask_eps0.2": {"loss": "grpo_seq_mask", "loss_config": {"clip_low": 0.2, "clip_high": 0.2}},
    "grpo_seq_mask_eps0.4": {"loss": "grpo_seq_mask", "loss_config": {"clip_low": 0.4, "clip_high": 0.4}},
    "cispo": {"loss": "cispo"},
    # FeynRL's P4O, as it is (its clamped k3 toward the adaptive mixture of π_b and π_old).
    "p3o_proximal": {"loss": "p3o_proximal"},
    # P3O's KL term, three ways (`rllib_p3o.core.losses.kl_estimators`): the plain k3 on π_b's samples (the estimator the
    # earlier benches ran), the importance-sampled k3 (exactly KL(πθ ‖ π_b)), and that toward π_old.
    "p3o_k3": {"loss": "p3o", "loss_config": _K3_TO_BEHAVIOR},
    "p3o_k3_is": {"loss": "p3o", "loss_config": {"kl_estimator": "k3_is", "kl_anchor": "behavior", **_NONE}},
    "p3o_k3_is_prox": {"loss": "p3o", "loss_config": {"kl_estimator": "k3_is", "kl_anchor": "proximal", **_NONE}},
    # ... each with one ESS per source of rows (the policy's own, each behavior model, offline data).
    "p3o_k3_src": {"loss": "p3o", "loss_config": {**_K3_TO_BEHAVIOR, "ess_scope": "source"}},
    "p3o_k3_is_src": {
        "loss": "p3o",
        "loss_config": {"kl_estimator": "k3_is", "kl_anchor": "behavior", **_NONE, "ess_scope": "source"},
    },
    "p3o_k3_is_prox_src": {
        "loss": "p3o",
        "loss_config": {"kl_estimator": "k3_is", "kl_anchor": "proximal", **_NONE, "ess_scope": "source"},
    },
    # P3O's defaults in 0.2, spelled out (the claims bench's full grid, results/bench): k3_is, anchored at π_b on the
    # policy's own rows and at π_old on another model's, one ESS per source.
    "p3o_default": {
        "loss": "p3o",
        "loss_config": {"kl_estimator": "k3_is", "kl_anchor": "auto", **_NONE, "ess_scope": "source"},
    },
    # The paper's reference implementation (FeynRL `algs/P3O/p3o.py`): the clamped k3 toward π_b, one ESS per batch.
    "p3o_reference": {
        "loss": "p3o",
        "loss_config": {"kl_estimator": "k3_clamped", "kl_anchor": "behavior", **_NONE},
    },
    # Candidates against multi-version staleness (docs/results/claims.md, the development set): P3O as in 0.2 (named
    # by what it is, so that its name keeps its meaning when the default changes), with one ESS per source and policy
    # version, and/or with a trust region on lagging tokens from the ESS itself.
    "p3o_source": {
        "loss": "p3o",
        "loss_config": {"kl_estimator": "k3_is", "kl_anchor": "auto", "trust_region": "none", "ess_scope": "source"},
    },
    "p3o_version": {
        "loss": "p3o",
        "loss_config": {"kl_estimator": "k3_is", "kl_anchor": "auto", "trust_region": "none", "ess_scope": "version"},
    },
    "p3o_clip": {
        "loss": "p3o",
        "loss_config": {
            "kl_estimator": "k3_is",
            "kl_anchor": "auto",
            "trust_region": "ess_clip",
            "ess_scope": "source",
        },
    },
    "p3o_clip_version": {
        "loss": "p3o",
        "loss_config": {
            "kl_estimator": "k3_is",
            "kl_anchor": "auto",
            "trust_region": "ess_clip",
            "ess_scope": "version",
        },
    },
    "p3o_band": {
        "loss": "p3o",
        "loss_config": {
            "kl_estimator": "k3_is",
            "kl_anchor": "auto",
            "trust_region": "ess_band",
            "ess_scope": "source",
        },
    },
}
# Every P3O form above was measured with the paper's weight on another model's tokens, ``min(r, ESS)``, and names it, so
# that its name keeps its meaning after the default changed (`P3OLossSettings.other_model_weight`).
for _spec in METHODS.values():
    if _spec["loss"] in ("p3o", "p3o_no_cap"):
        _spec["loss_config"] = {**_spec["loss_config"], "other_model_weight": "ess_cap"}
# What weights P3O's policy gradient on the tokens another model wrote (`P3OLossSettings.other_model_weight`), found
# after the ablation below showed the KL pull toward the recorder was not all that held P3O back there: the default's
# settings with the importance weight truncated at 1/ESS, or left out above it, instead of capped at ESS; and, after
# the mask chosen first fell behind with a live weaker model on its confirmation seeds, the mask scaled by ESS; and,
# after the cap and the truncation each stayed best on one side (the truncation on a recording trained alone, the cap
# with a live model beside the policy's own rows) on both sets that had run, the truncation alone and the cap beside.
OTHER_MODEL_CANDIDATES: Tuple[str, ...] = (
    "p3o_other_inverse_cap",
    "p3o_other_inverse_mask",
    "p3o_other_scaled_mask",
    "p3o_other_alone",
)
_FORMS = ("inverse_ess_cap", "inverse_ess_mask", "ess_scaled_mask", ALONE_FORM)
for _name, _form in zip(OTHER_MODEL_CANDIDATES, _FORMS):
    METHODS[_name] = {
        "loss": "p3o",
        "loss_config": {**METHODS["p3o_clip_version"]["loss_config"], "other_model_weight": _form},
    }
# Why P3O's default fell below its start on data another model recorded (offline_weaker, read then as the policy's own
# lagging data): the two terms that act only on the policy's own rows, each on and off. Every form reads the recording
# as the policy's own (``offline_provenance="policy"``, as before provenance), with the trust region on or off and
# the KL term anchored at the recorder (π_b), at π_old, or absent; P3O's default reads it as another model's (no trust
# region, KL toward π_old: equal to ``p3o_own_free_prox`` in what it computes, with another source id).
_OWN = {"offline_provenance": "policy"}
ABLATION_METHODS: Tuple[str, ...] = tuple(
    f"p3o_own_{region}_{anchor}" for region in ("clip", "free") for anchor in ("recorder", "prox", "nokl")
)
for _region, _trust in (("clip", "ess_clip"), ("free", "none")):
    for _anchor, _kl in (("recorder", "behavior"), ("prox", "proximal"), ("nokl", "none")):
        METHODS[f"p3o_own_{_region}_{_anchor}"] = {
            "loss": "p3o",
            "loss_config": {
                "kl_estimator": "k3_is",
                "kl_anchor": _kl,
                "trust_region": _trust,
                "ess_scope": "version",
                "other_model_weight": "ess_cap",
            },
            **_OWN,
        }
# Every registered loss is a method too, under its own name with its default settings (a new file in
# `rllib_p3o/core/losses/` is then usable as ``rllib-p3o sweep --methods NAME``); a named bundle above wins.
for _loss in LOSSES:
    METHODS.setdefault(_loss, {"loss": _loss})
# A method that only changes how ESS is scoped trains at the peak lr its batch-scoped twin chose.
LR_FROM: Dict[str, str] = {
    "p3o_k3_src": "p3o_k3",
    "p3o_k3_is_src": "p3o_k3_is",
    "p3o_k3_is_prox_src": "p3o_k3_is_prox",
    "p3o_default": "p3o_k3_is",  # the same update as p3o_k3_is wherever all rows are the policy's
}
# The demo sweep's methods (its table predates the baselines above and stays as it is).
DEMO_METHODS: Tuple[str, ...] = ("p3o", "grpo_eps0.2", "grpo_eps0.4", "grpo_eps0.6", "p3o_no_cap", "p3o_no_kl")
# The claims bench's: P3O's KL term three ways and FeynRL's P4O, plain GRPO and the baselines peers ship (P3O's
# ablations are in the demo's table; `--methods p3o_no_cap p3o_no_kl` adds them to a bench run).
BENCH_METHODS: Tuple[str, ...] = (
    "p3o_k3",
    "p3o_k3_is",
    "p3o_k3_is_prox",
    "p3o_proximal",
    "grpo_eps0.2",
    "grpo_eps0.4",
    "grpo_tis_eps0.2",
    "grpo_tis_eps0.4",
    "grpo_seq_mask_eps0.2",
    "grpo_seq_mask_eps0.4",
    "cispo",
)
# Keys a method may set: each gets a `tune.sample_from` that reads the trial's method.
METHOD_KEYS: Tuple[str, ...] = ("loss", "loss_config", "offline_provenance")
# A method that does not name a key trains with the setting's own default (`rllib_p3o.core.settings`): P3O's loss with
# its own settings' defaults (`P3OLossSettings`), offline data read by their recorded provenance.
DEFAULTS: Dict[str, Any] = {key: BY_KEYWORD[key].default() for key in METHOD_KEYS}
# Tune search keys (not P3OConfig settings: `P3O.reset_config` ignores them): the trial's (method, seed, lr peak)
# cell, and its method's name.
CELL = "sweep_cell"
METHOD = "sweep_method"
# Learning-rate schedule: linear warm-up over the first 10 iterations of 512 completions to a peak (as the demo's).
WARMUP_SAMPLES = 5120


def lr_schedule(peak: float) -> List[List[float]]:
    """``[[0, 1e-5], [5120, peak]]``: RLlib's piecewise-linear lr schedule (sampled completions → lr)."""
    return [[0, min(1e-5, peak)], [WARMUP_SAMPLES, peak]]


def method_value(key: str, defaults: Dict[str, Any], spec: Any) -> Any:
    """``tune.sample_from`` function: the trial's method's value of ``key`` (``defaults``' when the method has none,
    else `DEFAULTS`')."""
    return METHODS[spec.config[CELL][0]].get(key, {**DEFAULTS, **defaults}[key])


def cell_value(index: int, spec: Any) -> Any:
    """``tune.sample_from`` function: item ``index`` of the trial's (method, seed, lr peak) cell."""
    return spec.config[CELL][index]


@dataclass(frozen=True)
class Task:
    """A task the sweep runs on: its rows, reward, base-model builder and the config every trial starts from."""

    name: str
    rows: Callable[[], Tuple[List[dict], List[dict]]]  # (train, held-out)
    reward_fn: str  # import path: Tune saves every trial's config, and a reused actor compares configs
    build_model: Callable[..., str]  # build_model(path, seed=0, pretrain_steps=...) -> path
    config: Callable[..., P3OConfig]  # config(model_path, **training)
    heldout_label: str  # how held-out accuracy is measured, for figures and tables
    weaker_pretrain_steps: int  # the weaker behavior model: the base model's pretraining stopped early
    stronger_heldout: float  # the stronger behavior model: the base model RL-trained until this held-out


def _demo_task() -> Tuple[List[dict], List[dict]]:
    task = ArithmeticTask()
    return task.train_rows(), task.heldout_rows()


def _sorting_task() -> Tuple[List[dict], List[dict]]:
    task = SortingTask()
    return task.train_rows(), task.heldout_rows()


def _build_demo_model(path: str, **kw: Any) -> str:
    from rllib_p3o.tasks.tiny_model import build_demo_model

    return build_demo_model(path, **kw)


def _build_sorting_model(path: str, **kw: Any) -> str:
    from rllib_p3o.tasks.sorting import build_sorting_model

    return build_sorting_model(path, **kw)


def _addition_task() -> Tuple[List[dict], List[dict]]:
    task = AdditionTask()
    return task.train_rows(), task.heldout_rows()


def _build_addition_model(path: str, **kw: Any) -> str:
    from rllib_p3o.tasks.addition import build_addition_model

    return build_addition_model(path, **kw)


TASKS: Dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "arithmetic",
            _demo_task,
            "rllib_p3o.tasks.arithmetic:arithmetic_reward",
            _build_demo_model,
            demo_config,
            "held-out accuracy (greedy)",
            weaker_pretrain_steps=300,
            stronger_heldout=0.8,
        ),
        Task(
            "sorting",
            _sorting_task,
            "rllib_p3o.tasks.sorting:sorting_reward",
            _build_sorting_model,
            bench_config,
            f"held-out accuracy (avg@{EVAL_SAMPLES_PER_PROMPT}, T = 1)",
            weaker_pretrain_steps=500,
            stronger_heldout=0.7,
        ),
        Task(
            "addition",
            _addition_task,
            "rllib_p3o.tasks.addition:addition_reward",
            _build_addition_model,
            addition_config,
            f"held-out accuracy (avg@{EVAL_SAMPLES_PER_PROMPT}, T = 1)",
            weaker_pretrain_steps=800,  # a third of its pretraining, as the sorting task's weaker model
            stronger_heldout=0.7,
        ),
    )
}


@dataclass(frozen=True)
class Prepared:
    """Artifacts some regimes need (`rllib_p3o.sweep.prep`): paths of the models and of the stale recording."""

    base_model: str
    train_prompts: str  # .jsonl files of the task's rows
    heldout_prompts: str
    stronger_model: Optional[str] = None
    weaker_model: Optional[str] = None
    stale_recording: Optional[str] = None
    weaker_recording: Optional[str] = None


# What a regime's batches hold, as far as a loss can tell (`canonical_method`): rows another model wrote, rows the
# learner has moved from since they were sampled (stale async rows, a batch's second optimizer step, offline data
# of the policy's own lineage), several policy versions in one minibatch (async), and more than one optimizer step
# per batch; and whether they are offline rows (whose provenance a method may override, ``offline_provenance``).
OTHER_MODEL_ROWS, LAGGING_ROWS, VERSIONS, MULTI_STEP = "other_model_rows", "lagging_rows", "versions", "multi_step"
OFFLINE_ROWS = "offline_rows"


@dataclass(frozen=True)
class Regime:
    """How the data reach the learner: a description for the report, the config changes it makes, and its traits
    (which of `OTHER_MODEL_ROWS`, `LAGGING_ROWS`, `VERSIONS`, `MULTI_STEP` its batches have)."""

    name: str
    description: str
    apply: Callable[[P3OConfig, Prepared], P3OConfig]
    needs: Tuple[str, ...] = ()  # fields of `Prepared` this regime reads
    traits: FrozenSet[str] = frozenset()


def _behavior(model: str, name: str) -> Dict[str, Any]:
    return {"model": model, "name": name, "samples": 4}


def _calls_in_flight(name: str, calls: int) -> "Regime":
    """Async sampling with ``calls`` sample() calls in flight per runner (RLlib's
    ``max_requests_in_flight_per_env_runner``): each weight push queues behind them, so the data are up to ``calls``
    weight versions old (``max_staleness`` as many, so none is dropped)."""
    return Regime(
        name,
        f"async sampling with {calls} sample() calls in flight per runner: the data are up to {calls} weight versions "
        f"old (each weight push queues behind {calls} calls)",
        lambda c, p: c.training(async_sampling=True, max_staleness=calls).env_runners(
            max_requests_in_flight_per_env_runner=calls
        ),
        traits=_ASYNC,
    )


def _offline(recording: Callable[[Prepared], str]) -> Callable[[P3OConfig, Prepared], P3OConfig]:
    """Offline-only training on a recording (a grid with `Grid.recording_per_seed` gives each trial its seed's,
    `seed_recording`)."""
    # Read in the trial's process: every trial of a stage opens its own inputs (`P3O.reset_config`), which costs Ray
    # Data a pipeline per trial; the batches are the same (tests/test_offline.py).
    return lambda c, p: c.training(offline_fraction=1.0, offline_reader="in_process").offline_data(
        input_=[recording(p)],
        # A small dataset on 2 cores: one reader, one preprocessing actor (Ray Data's defaults start many).
        input_read_method_kwargs={"override_num_blocks": 1},
        map_batches_kwargs={"concurrency": 1},
    )


_ASYNC = frozenset({LAGGING_ROWS, VERSIONS})
_STEPS = frozenset({LAGGING_ROWS, MULTI_STEP})
REGIMES: Dict[str, Regime] = {
    r.name: r
    for r in (
        Regime(
            "on_policy_4_steps",
            "on-policy rollouts, 4 optimizer steps per iteration (minibatches of 128 of 512)",
            lambda c, p: c.training(minibatch_size=128),
            traits=_STEPS,
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
            traits=_ASYNC,
        ),
        Regime(
            "behavior_stronger",
            "4 of each group's 8 completions from a frozen stronger checkpoint",
            lambda c, p: c.training(behavior_models=[_behavior(p.stronger_model, "stronger")]),
            needs=("stronger_model",),
            traits=frozenset({OTHER_MODEL_ROWS}),
        ),
        Regime(
            "behavior_weaker",
            "4 of each group's 8 completions from a frozen weaker checkpoint",
            lambda c, p: c.training(behavior_models=[_behavior(p.weaker_model, "weaker")]),
            needs=("weaker_model",),
            traits=frozenset({OTHER_MODEL_ROWS}),
        ),
        Regime(
            "offline_stale",
            "offline only: trajectories recorded by the frozen base policy (staler as the learner improves; the "
            "policy's own lineage, so its own lagging data)",
            _offline(lambda p: p.stale_recording),
            needs=("stale_recording",),
            traits=frozenset({LAGGING_ROWS, OFFLINE_ROWS}),
        ),
        # The claims bench's regimes (with `temperature_1.2`, `behavior_*` and `offline_stale` above).
        Regime(
            "on_policy",
            "the control: on-policy rollouts, one optimizer step per iteration (the paper's protocol), "
            "engine and learner in float32",
            lambda c, p: c,
        ),
        Regime(
            "two_steps_per_batch",
            "on-policy rollouts, 2 optimizer steps per iteration (minibatches of 256 of 512): the second step's "
            "data are one update stale, so the trust region is what is measured",
            lambda c, p: c.training(minibatch_size=256),
            traits=_STEPS,
        ),
        Regime(
            "bf16_rollouts",
            "the engine samples in bfloat16, the learner trains in float32: every ratio carries the precision gap",
            lambda c, p: c.training(rollout_dtype="bfloat16"),
        ),
        Regime(
            "fp8_rollouts",
            "the engine samples in bfloat16 with FP8-rounded linear weights (fp8_simulated), the learner in float32",
            lambda c, p: c.training(rollout_dtype="bfloat16", rollout_quantization="fp8_simulated"),
        ),
        Regime(
            "async_staleness_4",
            "async sampling: the runner keeps generating while the learner updates, one sample() call in flight "
            "(the data are one weight version old; up to 4 would be kept)",
            lambda c, p: c.training(async_sampling=True, max_staleness=4),
            traits=_ASYNC,
        ),
        _calls_in_flight("async_4_in_flight", 4),
        Regime(
            "async_staleness_4_inflight",
            "async_staleness_4 with in-flight weight updates (inflight_weight_updates=True, prefix KV recomputed): new "
            "weights reach the sequences a runner is generating, so a completion may span weight versions",
            lambda c, p: c.training(async_sampling=True, max_staleness=4, inflight_weight_updates=True),
            traits=_ASYNC,
        ),
        # The confirmation set's harder variants of the staleness regimes.
        _calls_in_flight("async_staleness_8", 8),
        Regime(
            "four_steps_per_batch",
            "on-policy rollouts, 4 optimizer steps per iteration (minibatches of 128 of 512): the last step's data "
            "are three updates stale",
            lambda c, p: c.training(minibatch_size=128),
            traits=_STEPS,
        ),
        Regime(
            "offline_weaker",
            "offline only: trajectories recorded by the frozen weaker checkpoint (another model's data: its "
            "fingerprint is not the policy's lineage)",
            _offline(lambda p: p.weaker_recording),
            needs=("weaker_recording",),
            traits=frozenset({OTHER_MODEL_ROWS, OFFLINE_ROWS}),
        ),
    )
}
DEMO_REGIMES: Tuple[str, ...] = (
    "on_policy_4_steps",
    "temperature_1.2",
    "async_staleness_2",
    "behavior_stronger",
    "behavior_weaker",
    "offline_stale",
)
# In the order they run: the control, then the regime the bench exists for (a weaker model writes half of each
# group), the trust-region question, then the others.
BENCH_REGIMES: Tuple[str, ...] = (
    "on_policy",
    "behavior_weaker",
    "two_steps_per_batch",
    "behavior_stronger",
    "temperature_1.2",
    "async_staleness_4",
    "bf16_rollouts",
    "fp8_rollouts",
    "offline_stale",
)
# Methods run in some regimes only: ESS per source where rows come from two models (offline-only data are one
# source, where "source" equals "batch" by construction); P3O's defaults in every regime.
_TWO_MODELS = ("behavior_weaker", "behavior_stronger")
BENCH_REGIME_METHODS: Dict[str, Tuple[str, ...]] = {
    regime: (("p3o_k3_src", "p3o_k3_is_src", "p3o_k3_is_prox_src") if regime in _TWO_MODELS else ()) + ("p3o_default",)
    for regime in BENCH_REGIMES
}


# Losses whose PPO clip acts on πθ/π_old only: with one optimizer step per batch π_old = πθ there, so the clip range
# changes nothing (`canonical_method`).
_CLIP_AGAINST_OLD = ("grpo_tis", "grpo_seq_mask", "decoupled_ppo")


def method_traits(method: str, regime: Regime, defaults: Optional[Dict[str, Any]] = None) -> FrozenSet[str]:
    """The regime's traits as ``method`` sees its rows: a method (or a grid's `Grid.method_defaults`) that says whose
    offline data they are (``offline_provenance``) reads a recording as the policy's own lagging rows or as another
    model's."""
    provenance = METHODS[method].get("offline_provenance", {**DEFAULTS, **(defaults or {})}["offline_provenance"])
    if OFFLINE_ROWS not in regime.traits or provenance == "auto":
        return regime.traits
    own = provenance == "policy"
    return (regime.traits - {LAGGING_ROWS, OTHER_MODEL_ROWS}) | {LAGGING_ROWS if own else OTHER_MODEL_ROWS}


# The learning-rate families: every method's peak lr is chosen per family, in the family's lr regime, and used in
# every regime of the family (`lr_family`): one policy version of the policy's own data; the policy's own data several
# versions old (stale async rows, later optimizer steps, its own recordings); another model's data (live or recorded).
ON_POLICY_FAMILY, OWN_STALE_FAMILY, OTHER_MODEL_FAMILY = "on_policy", "own_stale", "other_model"
LR_FAMILY_REGIMES: Dict[str, str] = {
    ON_POLICY_FAMILY: "on_policy",
    OWN_STALE_FAMILY: "async_staleness_4",
    OTHER_MODEL_FAMILY: "offline_weaker",
}


def lr_family(regime: str) -> str:
    """The lr family of a regime, by what its batches hold (`Regime.traits`): another model's rows first."""
    traits = REGIMES[regime].traits
    if OTHER_MODEL_ROWS in traits:
        return OTHER_MODEL_FAMILY
    return OWN_STALE_FAMILY if LAGGING_ROWS in traits else ON_POLICY_FAMILY


def family_key(method: str, family: str) -> str:
    """A method's peak lr in a family, as `lr_choice.json` keys it: ``method@family``."""
    return f"{method}@{family}"


def method_peak(lr_peak: Union[float, Dict[str, float]], method: str, regime: Optional[str] = None) -> float:
    """A method's peak lr: the one peak of the grid, the method's own best (in ``regime``'s lr family where the
    choice was made per family, `Grid.lr_per_family`), or that of its `LR_FROM` twin."""
    if not isinstance(lr_peak, dict):
        return float(lr_peak)
    if regime is not None:
        family = lr_family(regime)
        for name in (method, LR_FROM.get(method)):
            if name and family_key(name, family) in lr_peak:
                return float(lr_peak[family_key(name, family)])
    return float(lr_peak[method] if method in lr_peak else lr_peak[LR_FROM[method]])


def repository_path(path: str) -> str:
    """``path`` as given when absolute, else relative to the repository this package lives in (a grid names the
    committed results it builds on, `Grid.lr_choice_from`)."""
    return path if os.path.isabs(path) else os.path.join(REPOSITORY, path)


@functools.lru_cache(maxsize=None)
def read_lr_peaks(path: str) -> Dict[str, float]:
    """The ``lr_peak`` of a committed `lr_choice.json` (`Grid.lr_choice_from`)."""
    with open(repository_path(path)) as f:
        return json.load(f)["lr_peak"]


def _other_model_rows_alone(traits: FrozenSet[str]) -> bool:
    """Whether a regime's minibatches hold another model's rows and none of the policy's own: every offline regime
    trains on its recording alone (`_offline`), so its rows are all another model's where they are any."""
    return OTHER_MODEL_ROWS in traits and OFFLINE_ROWS in traits and LAGGING_ROWS not in traits


def canonical_method(method: str, regime: Regime, defaults: Optional[Dict[str, Any]] = None) -> Tuple[Any, ...]:
    """What ``method`` computes in ``regime``: its loss, its settings (defaults filled in) and ESS scope, with every
    setting the regime's batches cannot tell apart replaced by its equivalent. Two methods with the same canonical form
    in a regime run the same trial, bit for bit (the grid runs it once; `Grid.same_run_as`):

    - ESS scope ``"version"`` is ``"source"`` where a minibatch never holds two policy versions (no `VERSIONS`), and
      ``"source"`` is ``"batch"`` where all rows have one source (no `OTHER_MODEL_ROWS`); scope is not read by a loss
      that is not ESS-scoped;
    - P3O's ``trust_region`` acts only on lagging rows: ``"none"`` where there are none (no `LAGGING_ROWS`);
    - P3O's ``kl_anchor="auto"`` is ``"behavior"`` where no other model wrote rows, and its ``other_model_weight``
      acts only there (``"inverse_ess_cap_alone"``: ``"inverse_ess_cap"`` on a recording trained alone, ``"ess_cap"``
      beside the policy's own rows);
    - the clip range of a loss that clips πθ/π_old is inert with one optimizer step per batch (no `MULTI_STEP`).
    """
    spec = METHODS[method]
    loss = get_loss(spec.get("loss", DEFAULTS["loss"]))
    settings = dataclasses.asdict(loss.make_settings(spec.get("loss_config", DEFAULTS["loss_config"])))
    traits = method_traits(method, regime, defaults)
    scope = settings.pop("ess_scope", None) if loss.ess_scoped else None
    if scope == "version" and VERSIONS not in traits:
        scope = "source"
    if scope == "source" and OTHER_MODEL_ROWS not in traits:
        scope = "batch"
    if "trust_region" in settings and LAGGING_ROWS not in traits:
        settings["trust_region"] = "none"
    if settings.get("kl_anchor") == "auto" and OTHER_MODEL_ROWS not in traits:
        settings["kl_anchor"] = "behavior"
    if settings.get("other_model_weight") == ALONE_FORM and OTHER_MODEL_ROWS in traits:
        settings["other_model_weight"] = "inverse_ess_cap" if _other_model_rows_alone(traits) else "ess_cap"
    if "other_model_weight" in settings and OTHER_MODEL_ROWS not in traits:
        settings["other_model_weight"] = OTHER_MODEL_WEIGHTS[0]
    if loss.name in _CLIP_AGAINST_OLD and MULTI_STEP not in traits:
        settings.pop("clip_low", None)
        settings.pop("clip_high", None)
    return (loss.name, tuple(sorted(settings.items())), scope)


@dataclass(frozen=True)
class Grid:
    """One sweep: regimes × methods × seeds, ``iterations`` of 512 completions per trial, after the lr stage.

    The lr stage runs ``lr_methods`` × ``lr_peaks`` × ``lr_seeds`` in each of ``lr_regimes``. With
    ``lr_per_method`` every method then trains at its own best peak (mean held-out at the budget over the lr stage's
    regimes and seeds), and the lr stage's trials at that peak count as seeds of the regime stages; otherwise one
    peak serves every method: the one whose worse method does best."""

    regimes: Tuple[str, ...]
    methods: Tuple[str, ...]
    seeds: Tuple[int, ...]
    iterations: int
    task: str = "arithmetic"
    target: float = 0.8
    lr_peaks: Tuple[float, ...] = ()  # the lr stage's candidates; empty: no lr stage, ``default_lr`` is used
    lr_methods: Tuple[str, ...] = ("p3o", "grpo_eps0.2")
    lr_seeds: Tuple[int, ...] = (0, 1)
    lr_regimes: Tuple[str, ...] = ("on_policy_4_steps",)
    lr_per_method: bool = False
    default_lr: float = 5e-4
    eval_interval: int = 5
    collapse_from: str = "first"  # a collapse: the last held-out 0.1 below the trial's "first" or "best" (`report`)
    extra: Dict[str, Any] = field(default_factory=dict)  # other `.training()` settings (tests: a tiny task)
    # Run a trial once for all methods that compute the same thing in a regime (`canonical_method`), and show it in
    # each of their cells.
    dedupe: bool = False
    # The lr stage extends its bracket upward (doubling the top peak) while a method's best peak is the top one.
    lr_extend: bool = False
    # No lr stage: each method's peak lr from this lr choice file (another grid's `lr_choice.json`).
    lr_choice_from: Optional[str] = None
    # Methods added in some regimes only (at the lr of their `LR_FROM` twin).
    regime_methods: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    # Each method's peak lr chosen per lr family (`lr_family`), in the family's regime among ``lr_regimes``; the lr
    # stage's bracket extends downward too while a method's best is its lowest peak.
    lr_per_family: bool = False
    # Offline regimes read the recording their trial's seed made (`seed_recording`), so a seed changes the data too.
    recording_per_seed: bool = False
    # Method keys (`METHOD_KEYS`) for the methods that do not name them, over `DEFAULTS`: a round measured before a
    # setting existed keeps what it ran (the staleness round read every recording as the policy's own).
    method_defaults: Dict[str, Any] = field(default_factory=dict)
    # A committed `prep` folder (a development set's) whose base and weaker models the grid starts from instead of
    # building them: a confirmation set then trains the models its lr choice was made on, on any machine (another
    # CPU builds other ones, `prep`). Where the folder is absent (an installed package) or ``--base-model`` is given,
    # the grid builds them; a model already in the set's folder that differs from the committed one is refused.
    models_from: Optional[str] = None

    def methods_in(self, regime: str) -> Tuple[str, ...]:
        """The methods a regime's stage reports: every regime's, then its own."""
        return tuple(self.methods) + tuple(m for m in self.regime_methods.get(regime, ()) if m not in self.methods)

    def same_run_as(self, regime: str, method: str, methods: Optional[Tuple[str, ...]] = None) -> str:
        """The method whose trial ``method`` shares in ``regime``: the first of ``methods`` (the regime's, by
        default) with the same `canonical_method` there; ``method`` itself when none comes before it. Where
        ``dedupe`` is off, always ``method``."""
        if not self.dedupe:
            return method
        form = self._trial_form(regime, method)
        for other in methods if methods is not None else self.methods_in(regime):
            if self._trial_form(regime, other) == form:
                return other
        return method

    def _trial_form(self, regime: str, method: str) -> Tuple[Any, ...]:
        """What a trial of ``method`` in ``regime`` computes: its `canonical_method` there, and its lr. The lr is the
        peak read from ``lr_choice_from`` where that file exists; with ``lr_per_family`` (chosen by this grid's own
        lr stage) the method's form in its family's lr regime stands for it, since the trials there chose it. Two
        methods alike in a regime but not in its lr regime may train at different rates, so they share no trial."""
        form = canonical_method(method, REGIMES[regime], self.method_defaults)
        if self.lr_choice_from and os.path.exists(repository_path(self.lr_choice_from)):
            try:
                return (form, method_peak(read_lr_peaks(self.lr_choice_from), method, regime))
            except KeyError:  # a method the file names no rate for (not one of the grid's regime methods)
                return (form, None)
        lr_regime = LR_FAMILY_REGIMES[lr_family(regime)]
        if self.lr_per_family and lr_regime != regime:
            return (form, canonical_method(method, REGIMES[lr_regime], self.method_defaults))
        return form

    def runs_in(self, regime: str, methods: Optional[Tuple[str, ...]] = None) -> Tuple[str, ...]:
        """The methods whose trials a regime's stage runs: one per distinct `canonical_method` (`same_run_as`)."""
        methods = self.methods_in(regime) if methods is None else methods
        return tuple(m for m in methods if self.same_run_as(regime, m, methods) == m)

    def all_methods(self) -> Tuple[str, ...]:
        """Every method of the grid, in table order."""
        return tuple(dict.fromkeys(m for r in self.regimes for m in self.methods_in(r))) or tuple(self.methods)

    def lr_cells(self) -> int:
        return (
            sum(len(self.runs_in(r, self.lr_methods)) for r in self.lr_regimes)
            * len(self.lr_peaks)
            * len(self.lr_seeds)
        )

    def num_trials(self) -> int:
        """Trials the grid runs (a regime stage's cells already run by the lr stage are not run again, nor a method's
        that shares another's trial, `same_run_as`); an lr stage that extends its bracket runs more."""
        regime_cells = sum(len(self.runs_in(r)) for r in self.regimes) * len(self.seeds)
        if self.lr_per_method and self.lr_peaks:
            for r in set(self.regimes) & set(self.lr_regimes):
                both = set(self.runs_in(r)) & set(self.runs_in(r, self.lr_methods))
                regime_cells -= len(both) * len(set(self.seeds) & set(self.lr_seeds))
        return regime_cells + self.lr_cells()


# The rounds measured before offline provenance and shuffled offline reads existed keep what they ran: every recording
# read as the policy's own, in file order, every seed alike.
AS_MEASURED_BEFORE_PROVENANCE = dict(method_defaults={"offline_provenance": "policy"}, extra={"offline_shuffle": False})
# The demo task's sweep (the easy control; its table is in docs/results/claims-sweep.md).
QUICK = Grid(
    regimes=("on_policy_4_steps", "temperature_1.2"), methods=("p3o", "grpo_eps0.2"), seeds=(0,), iterations=15
)
FULL = Grid(
    regimes=DEMO_REGIMES,
    methods=DEMO_METHODS,
    seeds=(0, 1, 2),
    iterations=40,
    lr_peaks=(2e-4, 5e-4, 1e-3),
    **AS_MEASURED_BEFORE_PROVENANCE,
)
# The claims bench (the sorting task; docs/results/claims.md), one optimizer step per rollout batch: stage (a) every
# method at 3 peaks × 2 seeds on-policy, stage (b) every regime × method at the method's best peak × 3 seeds (plus
# the ESS-per-source variants where two models write the data).
BENCH_FULL = Grid(
    regimes=BENCH_REGIMES,
    methods=BENCH_METHODS,
    seeds=(0, 1, 2),
    # Held-out is measured at the start of iterations 1, 5, 10, ..., 30: the last measures the policy after 29 updates.
    iterations=30,
    task="sorting",
    target=0.7,
    # Peaks that bracket every method's best on this task: at 5e-4 the GRPO variants already peak and P3O falls
    # late in some seeds; at 1.25e-4 all learn too slowly for the budget (an earlier range, 5e-4 to 2e-3, had
    # every method's best at its lowest peak).
    lr_peaks=(1.25e-4, 2.5e-4, 5e-4),
    lr_methods=BENCH_METHODS,
    lr_seeds=(0, 1),
    lr_regimes=("on_policy",),
    lr_per_method=True,
    collapse_from="best",
    regime_methods=BENCH_REGIME_METHODS,
    **AS_MEASURED_BEFORE_PROVENANCE,
)
# Its smoke test: the whole pipeline (lr stage per method, then the regime stages) on a few cells, ≤ 10 min.
BENCH_QUICK = Grid(
    regimes=("on_policy", "fp8_rollouts"),
    methods=("p3o_k3_is", "grpo_tis_eps0.2"),
    seeds=(0,),
    iterations=11,
    task="sorting",
    target=0.7,
    lr_peaks=(5e-4, 1e-3),
    lr_methods=("p3o_k3_is", "grpo_tis_eps0.2"),
    lr_seeds=(0,),
    lr_regimes=("on_policy",),
    lr_per_method=True,
    collapse_from="best",
)
# P3O under multi-version staleness (docs/results/claims.md, "Staleness"): candidates are compared and P3O's default is
# chosen on the development set, committed, then checked once on the confirmation set.
STALENESS_CANDIDATES: Tuple[str, ...] = ("p3o_version", "p3o_clip", "p3o_clip_version", "p3o_band")
# What P3O's default is chosen from (`rllib_p3o.sweep.verdicts.CHOICE_RULE`), the fewer changes first: 0.2's default
# (`p3o_source`), then the candidates.
DEFAULT_CANDIDATES: Tuple[str, ...] = ("p3o_source",) + STALENESS_CANDIDATES
# The peers' answers to staleness, and every baseline of the bench.
BASELINES: Tuple[str, ...] = (
    "grpo_eps0.2",
    "grpo_eps0.4",
    "grpo_tis_eps0.2",
    "grpo_tis_eps0.4",
    "grpo_seq_mask_eps0.2",
    "grpo_seq_mask_eps0.4",
    "cispo",
    "p3o_proximal",
    "m2po",
    "decoupled_ppo",
)
# P3O's default in the staleness round's grids, chosen on its development set by `rllib_p3o.sweep.verdicts.CHOICE_RULE`
# (docs/results/staleness.md): the trust region and one ESS per policy version.
STALENESS_DEFAULT = "p3o_clip_version"
# P3O's default now: the method whose settings are P3O's defaults (`P3OLossSettings`), the staleness round's with the
# weight on another model's tokens the provenance round's development set chose by the same rule, the third time
# (docs/results/provenance.md); the second choice, the truncation everywhere, stays in the confirmation set beside it.
DEFAULT_METHOD = "p3o_other_alone"
SECOND_CHOICE = "p3o_other_inverse_cap"
# The development set's methods, as it ran: 0.2's default, the paper's reference form, the candidates, the baselines.
DEVELOPMENT_METHODS: Tuple[str, ...] = ("p3o_source", "p3o_reference") + STALENESS_CANDIDATES + BASELINES
# The development set: the three regimes where P3O's 0.3 default lost (the bench's async regime is one version old),
# and async data 4 versions old; seeds 0-2, every method at its own best peak lr, the bracket extended upward until
# each method's best is inside it.
BENCH_DEVELOPMENT = Grid(
    regimes=("async_staleness_4", "offline_stale", "two_steps_per_batch", "async_4_in_flight"),
    methods=DEVELOPMENT_METHODS,
    seeds=(0, 1, 2),
    iterations=30,
    task="sorting",
    target=0.7,
    lr_peaks=(2.5e-4, 5e-4, 1e-3),
    lr_methods=DEVELOPMENT_METHODS,
    lr_seeds=(0, 1),
    lr_regimes=("on_policy",),
    lr_per_method=True,
    lr_extend=True,
    collapse_from="best",
    dedupe=True,
    **AS_MEASURED_BEFORE_PROVENANCE,
)
# The confirmation set: every regime of the bench and three harder variants, seeds 3-5, run once after the default was
# committed; P3O's chosen default, the paper's reference form and every baseline, at the development set's lr.
CONFIRMATION_METHODS: Tuple[str, ...] = (STALENESS_DEFAULT, "p3o_reference") + BASELINES
# The regimes where the data are stale first (the harder variants, then the development set's own), so that a run cut
# short has the cells the choice is about; then the bench's other regimes.
_STALE_FIRST: Tuple[str, ...] = (
    "async_staleness_8",
    "four_steps_per_batch",
    "offline_weaker",
    "async_4_in_flight",
    "async_staleness_4",
    "offline_stale",
    "two_steps_per_batch",
)
CONFIRMATION_REGIMES: Tuple[str, ...] = _STALE_FIRST + tuple(r for r in BENCH_REGIMES if r not in _STALE_FIRST)
BENCH_CONFIRMATION = Grid(
    regimes=CONFIRMATION_REGIMES,
    methods=CONFIRMATION_METHODS,
    seeds=(3, 4, 5),
    iterations=30,
    task="sorting",
    target=0.7,
    collapse_from="best",
    dedupe=True,
    lr_choice_from="results/bench-development/lr_choice.json",
    **AS_MEASURED_BEFORE_PROVENANCE,
)
# The bench's async regime with and without in-flight weight updates (docs/results/inflight.md): P3O's default and
# GRPO-clip, seeds 0-2, at the development set's lr choice.
BENCH_INFLIGHT = Grid(
    regimes=("async_staleness_4", "async_staleness_4_inflight"),
    methods=(STALENESS_DEFAULT, "grpo_eps0.2"),
    seeds=(0, 1, 2),
    iterations=30,
    task="sorting",
    target=0.7,
    collapse_from="best",
    lr_choice_from="results/bench-development/lr_choice.json",
    **AS_MEASURED_BEFORE_PROVENANCE,
)
# Data another model recorded (docs/results/provenance.md): offline files read by their provenance, every method's lr
# chosen per lr family (on-policy, the policy's own stale data, another model's data) with a bracket that holds each
# method's best, seeds that change the data (a recording per seed, the rows in a seed's order), and in offline_weaker
# the ablation that says which of P3O's terms held it back there. The development set: seeds 0-2 in each family's
# regime; the confirmation set: every regime of the bench, seeds 6-8, after the development set's choices were
# committed.
PROVENANCE_METHODS: Tuple[str, ...] = (STALENESS_DEFAULT, "p3o_clip", "p3o_reference") + BASELINES
LR_FROM.update({m: STALENESS_DEFAULT for m in ABLATION_METHODS})
# The development set ran the candidates for another model's tokens after the ablation, in the same grid (they compute
# the default's loss wherever no other model wrote rows, so they share its trials there).
PROVENANCE_DEVELOPMENT_METHODS: Tuple[str, ...] = PROVENANCE_METHODS + OTHER_MODEL_CANDIDATES
# The development set: the three lr families' regimes, and a live weaker model (added with the ESS-scaled mask, after
# the first choice fell behind there on its confirmation seeds; another model's lr family, so no lr stage of its own).
PROVENANCE_DEVELOPMENT = Grid(
    regimes=(*LR_FAMILY_REGIMES.values(), "behavior_weaker"),
    methods=PROVENANCE_DEVELOPMENT_METHODS,
    seeds=(0, 1, 2),
    iterations=30,
    task="sorting",
    target=0.7,
    lr_peaks=(2.5e-4, 5e-4, 1e-3),
    lr_methods=PROVENANCE_DEVELOPMENT_METHODS,
    lr_seeds=(0, 1),
    lr_regimes=tuple(LR_FAMILY_REGIMES.values()),
    lr_per_method=True,
    lr_per_family=True,
    lr_extend=True,
    collapse_from="best",
    dedupe=True,
    recording_per_seed=True,
    regime_methods={"offline_weaker": ABLATION_METHODS},
)
# The confirmation set: P3O's default (as chosen there), the second and first choices and the staleness round's default
# (what the choices changed: they differ only where another model wrote rows), ESS per source, the paper's form and
# every baseline, on seeds 9-11: seeds 6-8 confirmed the first choice in the regimes where it acts and informed the
# second (`PROVENANCE_FIRST_CONFIRMATION`). The default comes last: it was added after the others had started, and a
# trial is named for the first method that runs it.
FIRST_CHOICE = "p3o_other_inverse_mask"
PROVENANCE_CONFIRMATION_METHODS: Tuple[str, ...] = tuple(
    dict.fromkeys((SECOND_CHOICE, FIRST_CHOICE, *PROVENANCE_METHODS, DEFAULT_METHOD))
)
PROVENANCE_CONFIRMATION = Grid(
    regimes=CONFIRMATION_REGIMES,
    methods=PROVENANCE_CONFIRMATION_METHODS,
    seeds=(9, 10, 11),
    iterations=30,
    task="sorting",
    target=0.7,
    collapse_from="best",
    dedupe=True,
    recording_per_seed=True,
    lr_choice_from="results/bench-provenance-development/lr_choice.json",
)
# The first choice's confirmation (`FIRST_CHOICE`, docs/results/provenance.md): seeds 6-8 in the regimes where it acts,
# run after it was committed; it fell behind with a live weaker model, which the development set then gained.
PROVENANCE_FIRST_CONFIRMATION = Grid(
    **{
        **PROVENANCE_CONFIRMATION.__dict__,
        "regimes": ("offline_weaker", "behavior_weaker"),
        "methods": (FIRST_CHOICE, *PROVENANCE_METHODS),
        "seeds": (6, 7, 8),
    }
)
# The second bench task (docs/guide/sweep.md, rllib_p3o/tasks/addition.py): every method of the sorting bench, its lr chosen per lr family by
# the same rule on the task's own development seeds (0-2), then a confirmation set on seeds 3-5 in the task's regimes:
# the sorting bench's, and in-flight weight updates, which its completions (~27 tokens) are long enough to span.
ADDITION_REGIMES: Tuple[str, ...] = (
    "async_staleness_8",
    "four_steps_per_batch",
    "offline_weaker",
    "async_4_in_flight",
    "async_staleness_4",
    "async_staleness_4_inflight",
    "offline_stale",
    "two_steps_per_batch",
    "behavior_weaker",
    "temperature_1.2",
    "on_policy",
)
ADDITION_DEVELOPMENT = Grid(**{**PROVENANCE_DEVELOPMENT.__dict__, "task": "addition", "regime_methods": {}})
ADDITION_CONFIRMATION = Grid(
    regimes=ADDITION_REGIMES,
    methods=PROVENANCE_CONFIRMATION_METHODS,
    seeds=(3, 4, 5),
    iterations=30,
    task="addition",
    target=0.7,
    collapse_from="best",
    dedupe=True,
    recording_per_seed=True,
    lr_choice_from="results/bench-addition-development/lr_choice.json",
    models_from="results/bench-addition-development/prep",
)
# Rounds of the claims bench's development and confirmation sets, the latest first (``rllib-p3o sweep --round``).
ROUNDS: Tuple[str, ...] = ("provenance", "first-choice", "staleness")
GRIDS: Dict[Tuple[str, str], Grid] = {
    ("arithmetic", "quick"): QUICK,
    ("arithmetic", "full"): FULL,
    ("sorting", "quick"): BENCH_QUICK,
    ("sorting", "full"): BENCH_FULL,
    ("sorting", "development"): PROVENANCE_DEVELOPMENT,
    ("sorting", "confirmation"): PROVENANCE_CONFIRMATION,
    ("sorting", "first-choice-confirmation"): PROVENANCE_FIRST_CONFIRMATION,
    ("sorting", "staleness-development"): BENCH_DEVELOPMENT,
    ("sorting", "staleness-confirmation"): BENCH_CONFIRMATION,
    ("sorting", "inflight"): BENCH_INFLIGHT,
    ("addition", "development"): ADDITION_DEVELOPMENT,
    ("addition", "confirmation"): ADDITION_CONFIRMATION,
}


# Seconds a sweep's trial waits for a runner's samples (`regime_config`).
SAMPLE_TIMEOUT_S = 900.0


def seed_recording(recording: str, seed: int) -> str:
    """The recording a trial with ``seed`` trains on, in a grid with `Grid.recording_per_seed` (`rllib_p3o.sweep.prep`
    makes one per seed under the regime's recording folder)."""
    return os.path.join(recording, f"seed{int(seed)}")


def recorded_seeds(grid: Grid) -> List[int]:
    """The seeds a grid with `Grid.recording_per_seed` records for (`rllib_p3o.sweep.prep`): those it trains, and its
    lr stage's where it has one (a grid reading another's lr choice has none, though its ``lr_seeds`` keep their
    default)."""
    return sorted(set(grid.seeds) | (set(grid.lr_seeds) if grid.lr_peaks else set()))


def seed_inputs(regime: Regime, prepared: Prepared, grid: Grid) -> Optional[Dict[int, Any]]:
    """Each seed's offline input (``offline_data(input_=...)``) in an offline regime of a grid with
    `Grid.recording_per_seed`; None elsewhere (every trial reads what the regime's config names)."""
    if not grid.recording_per_seed or not any(n.endswith("_recording") for n in regime.needs):
        return None
    return {s: regime_config(regime, prepared, grid, seed=s).input_ for s in recorded_seeds(grid)}


def regime_config(regime: Regime, prepared: Prepared, grid: Grid, seed: Optional[int] = None) -> P3OConfig:
    """The task's config (64 prompts × 8 completions per iteration, held-out eval every ``eval_interval``),
    changed by ``regime``; an offline regime of a grid with `Grid.recording_per_seed` reads ``seed``'s recording
    (the grid's first seed's when None)."""
    if grid.recording_per_seed:
        seed = grid.seeds[0] if seed is None else seed
        prepared = dataclasses.replace(
            prepared,
            **{
                name: seed_recording(getattr(prepared, name), seed)
                for name in regime.needs
                if name.endswith("_recording") and getattr(prepared, name)
            },
        )
    task = TASKS[grid.task]
    config = task.config(prepared.base_model, eval_interval=grid.eval_interval, **grid.extra)
    # A trial waits for a late runner rather than fail: on a machine other work slows down, RLlib's 60 s can pass
    # while the runner is still generating (a timeout is retried as an infrastructure failure, not the method's).
    config.env_runners(sample_timeout_s=max(config.sample_timeout_s or 0, SAMPLE_TIMEOUT_S))
    # Prompts by path and the reward by import path: Tune saves every trial's config (with rows, ~0.7 MB each),
    # and a reused actor compares configs.
    config.environment(
        env_config={
            **config.env_config,
            "dataset": prepared.train_prompts,
            "eval_dataset": prepared.heldout_prompts,
            "reward_fn": task.reward_fn,
        }
    )
    return regime.apply(config, prepared)
