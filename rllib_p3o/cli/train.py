"""``rllib-p3o train CONFIG.yaml``: a P3O run from a config file, through Ray Tune, one line per iteration.

The file's top-level sections are `P3OConfig`'s methods, their keys the methods' arguments (the configuration
reference), and ``run`` says how Tune runs it:

    training:      {model: runs/demo/base_model, group_size: 8, prompts_per_step: 64, max_tokens: 3, lr: 5.0e-4}
    environment:   {env_config: {dataset: train.jsonl, eval_dataset: heldout.jsonl, reward_fn: "my_pkg.rewards:exact"}}
    env_runners:   {num_env_runners: 1}
    learners:      {num_learners: 0}
    debugging:     {seed: 0}
    run:
      name: demo                                  # experiment name (default: the file's name)
      storage_path: runs/cli                      # where Tune writes (default: ~/ray_results)
      stop: {training_iteration: 100, time_total_s: 600}          # Tune's stop conditions (any result column)
      target: {p3o/heldout_reward_mean: 0.9}      # stop when reached; the run fails (exit 1) if never reached
      checkpoint: {checkpoint_frequency: 5, checkpoint_at_end: true, num_to_keep: 2}   # tune.CheckpointConfig
      progress_every: 1                           # iterations between progress lines
      tracking: {wandb: {project: demo, mode: offline}, mlflow: {tracking_uri: "file:./mlruns"}}
      ray: {num_cpus: 4}                          # ray.init arguments: a new local Ray instance, unless
                                                  # `address` (or RAY_ADDRESS) names a cluster to join

``--set SECTION.KEY=VALUE`` overrides one key (the value is read as YAML: ``--set training.lr=1e-5``,
``--set run.stop.training_iteration=2``). A section's keys, from the file or ``--set``, are read as the types their
settings declare (`typed_section`: ``1e-5``, a string to YAML, is a float for ``lr``). Paths are relative to the
working directory (made absolute before Ray starts), and ``"module:function"`` strings work where the config takes
callables (``reward_fn``) or datasets: the module is imported from the working directory first, as ``python -m``
would, and Ray ships such a module to the workers (`modules_from_working_directory`).
``--resume`` continues the experiment from its latest checkpoint when it exists (``tune.Tuner.restore``), with the
``--set`` items the run started with (kept in its experiment directory: `record_overrides`).

Exit status: 0 when the trial finished and reached its target (if any); 1 when it errored or missed the target;
2 when the file is invalid; 130 when it was interrupted (Ctrl-C: the command line that continues it is printed).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

NAME = "train"
# P3OConfig methods a config file may use as sections (the AlgorithmConfig methods that set options).
SECTIONS = (
    "training",
    "environment",
    "env_runners",
    "learners",
    "resources",
    "debugging",
    "fault_tolerance",
    "offline_data",
    "evaluation",
    "reporting",
    "rl_module",
    "framework",
)
RUN = "run"
RUN_KEYS = ("name", "storage_path", "stop", "target", "checkpoint", "progress_every", "tracking", "ray")
TRACKERS = ("wandb", "mlflow")


# Why an interrupted run may have no checkpoint: Tune writes one every checkpoint_frequency iterations, and the one
# at the end only when the run ends by its stopping condition.
NO_CHECKPOINT_YET = (
    "one is written every run.checkpoint.checkpoint_frequency iterations; checkpoint_at_end does not run on Ctrl-C"
)
# A --resume whose experiment state Tune left unreadable, put back from Tune's staged copy (`experiment_state`).
REPAIRED = "Tune's experiment state was damaged (the driver was killed while Tune wrote it)"
# As the README's Tune example: a run that is interrupted resumes from its latest checkpoint, not from iteration 1.
DEFAULT_CHECKPOINT = {"checkpoint_frequency": 10, "checkpoint_at_end": True}


class ConfigFileError(ValueError):
    """The config file is invalid; the message names the file and the key."""


def add_parser(sub: Any) -> None:
    t = sub.add_parser(NAME, help="run P3O from a YAML config file through Ray Tune")
    t.add_argument("config", help="YAML file: P3OConfig sections (training, environment, ...) and run")
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one key of the file (value read as YAML); repeatable",
    )
    t.add_argument("--resume", action="store_true", help="continue the experiment from its latest checkpoint")


def read_config_file(path: str, overrides: List[str] = ()) -> Dict[str, Any]:
    """The file's sections as a dict, with ``SECTION.KEY=VALUE`` overrides applied. `ConfigFileError` when the file
    is unreadable or has an unknown section."""
    import yaml

    try:
        with open(path) as f:
            spec = yaml.safe_load(f) or {}
    except OSError as e:
        raise ConfigFileError(f"cannot read {path}: {e}") from e
    except yaml.YAMLError as e:
        raise ConfigFileError(f"{path} is not valid YAML: {e}") from e
    if not isinstance(spec, dict):
        raise ConfigFileError(f"{path} must hold a mapping of sections, got a {type(spec).__name__}")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise ConfigFileError(f"--set {item!r}: expected SECTION.KEY=VALUE")
        node = spec
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigFileError(f"--set {item!r}: {part} is not a section")
        node[leaf] = yaml.safe_load(value)
    unknown = sorted(set(spec) - set(SECTIONS) - {RUN})
    if unknown:
        raise ConfigFileError(
            f"{path}: unknown section(s) {', '.join(unknown)}; sections are P3OConfig's methods "
            f"({', '.join(SECTIONS)}) and '{RUN}' (Tune: {', '.join(RUN_KEYS)})"
        )
    for section, value in spec.items():
        if not isinstance(value, dict):
            raise ConfigFileError(f"{path}: section {section!r} must be a mapping of keys, got {value!r:.100}")
    unknown = sorted(set(spec.get(RUN, {})) - set(RUN_KEYS))
    if unknown:
        raise ConfigFileError(f"{path}: unknown key(s) run.{', run.'.join(unknown)}; known: {', '.join(RUN_KEYS)}")
    return spec


def build_config(spec: Dict[str, Any], path: str = "config", overrides: Sequence[str] = ()):
    """The `P3OConfig` of a config file's sections (each applied as ``config.<section>(**keys)``, every value read
    as its setting's declared type: `typed_section`), validated. ``overrides``: the ``--set`` items applied to
    ``spec``, to name them in a message."""
    from rllib_p3o import P3OConfig

    config = P3OConfig()
    for section in SECTIONS:
        if section in spec:
            keys = typed_section(P3OConfig, section, spec[section], path, overrides)
            try:
                getattr(config, section)(**keys)
            except TypeError as e:  # an unknown key: Python names it
                raise ConfigFileError(f"{path}: section {section!r}: {e}") from e
    try:
        config.validate()
    except ValueError as e:
        raise ConfigFileError(f"{path}: {e}{_demo_model_hint(config.policy_model)}") from e
    return config


# Where `make demo` (examples/demo.py) builds the demo's base model, which examples/demo.yaml trains.
DEMO_BASE_MODEL = os.path.join("runs", "demo", "base_model")


def _demo_model_hint(model: Optional[str]) -> str:
    """How to build the demo's base model, when the config names it and it is not there."""
    if not model or os.path.isdir(model) or not os.path.normpath(model).endswith(DEMO_BASE_MODEL):
        return ""
    return (
        f" It is the demo's base model: `make demo` builds it (and trains the demo once), in {DEMO_BASE_MODEL} of the "
        'repository (run the command from there); to build the model alone: python -c "from rllib_p3o.tasks import '
        f"build_demo_model; build_demo_model('{DEMO_BASE_MODEL}')\"."
    )


def typed_section(
    config_class: type, section: str, keys: Dict[str, Any], path: str, overrides: Sequence[str] = ()
) -> Dict[str, Any]:
    """A section's keys read as their declared types (`rllib_p3o.cli.declared_types`: ``--set training.lr=1e-4`` is
    the float 1e-4, which YAML reads as a string); `ConfigFileError` naming the setting, the value and the types it
    takes when a value fits none, where it was given (the ``--set`` item, else the file)."""
    from rllib_p3o.cli.declared_types import as_declared, declared_type, describe, type_problem

    given = {item.partition("=")[0]: item for item in overrides}
    typed = {}
    for key, value in keys.items():
        hint = declared_type(config_class, section, key)
        typed[key] = as_declared(value, hint)
        expected = type_problem(typed[key], hint)
        if expected is not None:
            name = f"{section}.{key}"
            where = f"--set {given[name]}" if name in given else path
            raise ConfigFileError(f"{where}: {name} is {value!r}, {describe(type(value))}; {name} takes {expected}")
    return typed


def target_of(run: Dict[str, Any]) -> Optional[Tuple[str, float]]:
    """``(column, value)`` of ``run.target`` (one column, reached at >=), or None."""
    target = run.get("target") or {}
    if len(target) > 1:
        raise ConfigFileError(f"run.target names {len(target)} columns; give one, e.g. p3o/heldout_reward_mean: 0.9")
    return next(((str(k), float(v)) for k, v in target.items()), None)


def _callbacks(run: Dict[str, Any], target: Optional[Tuple[str, float]]) -> List[Any]:
    from rllib_p3o.driver.progress import IterationPrinter

    stop = run.get("stop") or {}
    callbacks = [
        IterationPrinter(
            every=int(run.get("progress_every", 1)),
            time_limit=stop.get("time_total_s"),
            max_iterations=stop.get("training_iteration"),
            target=target[1] if target else None,
        )
    ]
    tracking = run.get("tracking") or {}
    unknown = sorted(set(tracking) - set(TRACKERS))
    if unknown:
        raise ConfigFileError(f"run.tracking: unknown tracker(s) {', '.join(unknown)}; known: {', '.join(TRACKERS)}")
    if "wandb" in tracking:
        from ray.air.integrations.wandb import WANDB_MODE_ENV_VAR, WandbLoggerCallback

        mode = tracking["wandb"].get("mode")
        if mode in ("offline", "disabled"):  # Tune asks for an API key unless the environment says so
            os.environ.setdefault(WANDB_MODE_ENV_VAR, mode)
        callbacks.append(WandbLoggerCallback(**tracking["wandb"]))
    if "mlflow" in tracking:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(MLflowLoggerCallback(**tracking["mlflow"]))
    return callbacks


def modules_from_working_directory(spec: Any) -> List[Any]:
    """The modules a config names as ``"module:function"`` (anywhere in it) that were imported from the working
    directory rather than installed: ``my_rewards.py`` beside the YAML file. Ray ships them to the workers of every
    node (``runtime_env={"py_modules": ...}``); on this node they would find them anyway, on another they would not.
    This package itself is installed, never shipped."""
    from rllib_p3o.core.callables import BY_NAME

    names = set()

    def walk(value: Any) -> None:
        if isinstance(value, str) and BY_NAME.match(value):
            names.add(value.split(":")[0].split(".")[0])
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(spec)
    here = os.getcwd() + os.sep
    modules = []
    for name in sorted(names - {"rllib_p3o"}):
        module = sys.modules.get(name)
        location = getattr(module, "__file__", None) or ""
        if os.path.abspath(location).startswith(here) and "-packages" + os.sep not in location:
            modules.append(module)
    return modules


def _ray_init_args(given: Dict[str, Any]) -> Dict[str, Any]:
    """``run.ray`` as ``ray.init`` arguments: a new local Ray instance unless ``address`` (or ``RAY_ADDRESS``) names a
    cluster to join, so that a Ray started on this machine by another program is never joined by accident. A
    cluster that is joined has its own resources: ``num_cpus``/``num_gpus`` are then left out."""
    args = dict(given)
    address = args.get("address") or os.environ.get("RAY_ADDRESS")
    if not address:
        args["address"] = "local"
    elif address != "local":
        dropped = [k for k in ("num_cpus", "num_gpus") if args.pop(k, None) is not None]
        if dropped:
            print(f"joining the Ray cluster at {address}: run.ray's {', '.join(dropped)} left out", flush=True)
    return args


def _reached(df: Any, target: Tuple[str, float]) -> Tuple[bool, float]:
    """Whether the target column ever reached its value in the trial's results, and its best value (NaN if none)."""
    column, value = target
    if df is None or column not in df:
        return False, math.nan
    best = df[column].max(skipna=True)
    best = float(best) if best == best else math.nan
    return best >= value, best


def train(path: str, overrides: List[str] = (), resume: bool = False) -> int:
    """Run the file's experiment (module docstring); returns the exit status."""
    # The first line at once: what follows (the config's checks, Ray's start, the trial's) takes a minute on a busy
    # machine before the run's own lines.
    print(f"rllib-p3o train {path}: checking the config, then starting Ray", flush=True)
    spec, overrides = run_spec(path, overrides, resume)
    run = dict(spec.get(RUN) or {})
    target = target_of(run)
    from rllib_p3o.driver.experiment_state import check_experiment_state
    from rllib_p3o.driver.progress import silence_driver_and_workers

    env = silence_driver_and_workers()
    config = build_config(spec, path, overrides)
    experiment = experiment_dir(spec, path)
    if resume:  # before Ray starts: Tune would start the experiment over on a state it cannot read
        staged = check_experiment_state(experiment, repair=True)
        if staged:
            print(f"{REPAIRED}: put back Tune's intact copy {staged} (the damaged file is kept beside it)", flush=True)
    import ray
    from ray import tune

    started_ray = not ray.is_initialized()
    if started_ray:
        ray_args = _ray_init_args(run.get("ray") or {})
        runtime_env = {"env_vars": env, **ray_args.pop("runtime_env", {})}
        shipped = modules_from_working_directory(spec)
        if shipped:  # the user's own py_modules first, then these
            runtime_env["py_modules"] = [*runtime_env.get("py_modules", []), *shipped]
        ray.init(
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            runtime_env=runtime_env,
            **ray_args,
        )
    try:
        storage, name = os.path.split(experiment)
        stop = dict(run.get("stop") or {})
        if target:
            stop[target[0]] = target[1]
        run_config = tune.RunConfig(
            name=name,
            storage_path=storage,
            stop=stop or None,
            checkpoint_config=tune.CheckpointConfig(**(run.get("checkpoint") or DEFAULT_CHECKPOINT)),
            callbacks=_callbacks(run, target),
            verbose=0,
        )
        if resume and tune.Tuner.can_restore(experiment):
            print(f"resuming {experiment} from its latest checkpoint", flush=True)
            tuner = tune.Tuner.restore(experiment, trainable="P3O", resume_errored=True, param_space=config)
        else:
            tuner = tune.Tuner("P3O", param_space=config, run_config=run_config)
        record_overrides(experiment, overrides)
        print(f"P3O run {name}: results in {experiment}", flush=True)
        result = tuner.fit()[0]
    finally:
        if started_ray:
            ray.shutdown()
    return _report(result, target, resume=resume_command(path, overrides))


def experiment_dir(spec: Dict[str, Any], path: str) -> str:
    """Where Tune writes the file's experiment: ``run.storage_path``/``run.name`` (defaults: ``~/ray_results``, the
    file's name), absolute."""
    run = spec.get(RUN) or {}
    name = run.get("name") or os.path.splitext(os.path.basename(path))[0]
    return os.path.join(os.path.abspath(os.path.expanduser(run.get("storage_path") or "~/ray_results")), name)


def run_spec(path: str, overrides: Sequence[str], resume: bool) -> Tuple[Dict[str, Any], List[str]]:
    """The file's sections with the run's overrides, and those overrides. With ``resume``, the overrides the
    experiment was started with (`record_overrides`) come first and the command's own after them (a key given again
    takes the command's value): ``--resume`` alone continues the run that ``--set`` items started."""
    spec = read_config_file(path, overrides)
    if not resume:
        return spec, list(overrides)
    given = {item.partition("=")[0] for item in overrides}
    recorded = [item for item in recorded_overrides(experiment_dir(spec, path)) if item.partition("=")[0] not in given]
    if not recorded:
        return spec, list(overrides)
    print(f"with the overrides the run started with: {' '.join(_set_flags(recorded))}", flush=True)
    merged = [*recorded, *overrides]
    return read_config_file(path, merged), merged


# The overrides a run started with, in its experiment directory (`record_overrides`).
OVERRIDES_FILE = "rllib_p3o_overrides.json"


def record_overrides(experiment: str, overrides: Sequence[str]) -> None:
    """Keep the run's ``--set`` items with its experiment, for ``--resume`` (`run_spec`)."""
    os.makedirs(experiment, exist_ok=True)
    with open(os.path.join(experiment, OVERRIDES_FILE), "w") as f:
        json.dump({"overrides": list(overrides)}, f, indent=1)


def recorded_overrides(experiment: str) -> List[str]:
    """The ``--set`` items the experiment was started with; none when it has no record (or none yet)."""
    try:
        with open(os.path.join(experiment, OVERRIDES_FILE)) as f:
            return [str(item) for item in json.load(f)["overrides"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def resume_command(path: str, overrides: Sequence[str]) -> str:
    """The command line that continues the run: the file and every ``--set`` item it ran with, then ``--resume``."""
    return " ".join(["rllib-p3o", NAME, shlex.quote(path), *_set_flags(overrides), "--resume"])


def _set_flags(overrides: Sequence[str]) -> List[str]:
    return [f"--set {shlex.quote(item)}" for item in overrides]


def _report(result: Any, target: Optional[Tuple[str, float]], resume: str = "") -> int:
    """Print how the trial ended; 0 when it finished and reached its target (if any), 130 when it was interrupted,
    else 1."""
    from rllib_p3o.driver.interruption import INTERRUPTED_EXIT_STATUS, unfinished_trials

    checkpoint = result.checkpoint.path if result.checkpoint is not None else None
    where = f"  trial directory  {result.path}\n" + (
        f"  checkpoint       {checkpoint}\n  export with      rllib-p3o export {checkpoint} OUT\n" if checkpoint else ""
    )
    if result.error is not None:
        print(f"Trial FAILED: {type(result.error).__name__}: {result.error}\n{where}", end="", file=sys.stderr)
        return 1
    if unfinished_trials([result]):  # Ctrl-C: Tune stopped the trial before its stopping condition
        iterations = (result.metrics or {}).get("training_iteration")
        if checkpoint is None:  # --resume would have nothing to continue from (P3O refuses to start over silently)
            again = resume.removesuffix(" --resume")
            how = f"before its first checkpoint ({NO_CHECKPOINT_YET}), so it cannot be resumed; run it again: {again}"
        else:
            how = f"continue it with: {resume}"
        print(f"Run INTERRUPTED after {iterations} iterations; {how}\n{where}", end="", file=sys.stderr)
        return INTERRUPTED_EXIT_STATUS
    if target is not None:
        reached, best = _reached(result.metrics_dataframe, target)
        if not reached:
            print(f"Target NOT reached: {target[0]} best {best:.4g} < {target[1]:g}\n{where}", end="", file=sys.stderr)
            return 1
        print(f"Target reached: {target[0]} {best:.4g} >= {target[1]:g}")
    iterations = (result.metrics or {}).get("training_iteration")
    print(f"Finished after {iterations} iterations\n{where}", end="")
    return 0


def run(args: argparse.Namespace) -> int:
    from rllib_p3o.driver.experiment_state import DamagedExperimentStateError

    try:
        return train(args.config, args.set, resume=args.resume)
    except (ConfigFileError, DamagedExperimentStateError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
