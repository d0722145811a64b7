"""Checks of a config against the world it will run in, before anything starts: the Ray cluster's CPUs and GPUs, and
model and data paths (a relative path would be read from Tune's trial directory, not from where the script ran).

A request the cluster can never meet would otherwise leave a Tune trial PENDING forever (or ``build_algo()``
waiting for actors that never start); a model path that is neither a directory nor a hub id would surface as a
transformers error about repository names.
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import ray

from rllib_p3o.core import storage
from rllib_p3o.core.callables import BY_NAME
from rllib_p3o.core.config_error import ConfigError

# Ray's cluster launcher writes this file on the head node of an autoscaling cluster (Tune's own test for one,
# `ray.tune.execution.cluster_info`): there, a request beyond today's nodes may be met by new ones.
AUTOSCALER_BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"
RESOURCES = ("CPU", "GPU")


class ClusterTooSmallError(ConfigError):
    """The config asks for more CPUs or GPUs than the Ray cluster has; the message gives both, by role."""


class ModelPathError(ConfigError):
    """A model path that is neither a directory nor a Hugging Face hub id."""


# (who, the settings that size its CPUs and GPUs)
MAIN_PROCESS = ("the algorithm", {"CPU": "num_cpus_for_main_process", "GPU": "num_gpus_per_learner, a local learner"})
ENV_RUNNER = ("EnvRunners", {"CPU": "num_cpus_per_env_runner", "GPU": "num_gpus_per_env_runner"})
LEARNER = ("learners", {"CPU": "num_cpus_per_learner", "GPU": "num_gpus_per_learner"})
Role = Tuple[str, Dict[str, str]]


# env_config keys that may name files (`rllib_p3o.data.datasets`).
DATASET_KEYS = ("dataset", "eval_dataset")


def resource_request(config: Any, include_main_process: bool = True) -> List[Tuple[Role, Dict[str, float]]]:
    """``[(role, {"CPU": n, "GPU": m}), ...]``: the Ray resources of the algorithm's process (Tune's trial actor,
    with a local learner's), each EnvRunner and each learner, as RLlib computes them
    (`Algorithm.default_resource_request`)."""
    from ray.rllib.algorithms.utils import _get_env_runner_bundles, _get_learner_bundles, _get_main_process_bundle

    roles: List[Tuple[Role, Dict[str, float]]] = []
    if include_main_process:
        roles.append((MAIN_PROCESS, _get_main_process_bundle(config)))
    roles += [(ENV_RUNNER, bundle) for bundle in _get_env_runner_bundles(config)]
    roles += [(LEARNER, bundle) for bundle in _get_learner_bundles(config)]
    return roles


def check_cluster_fits(config: Any, include_main_process: bool = True) -> None:
    """Raise `ClusterTooSmallError` where the config asks for more CPUs or GPUs than the running Ray cluster has in
    all (not just free now: other trials may hold some). Nothing is checked without a running Ray or on an
    autoscaling cluster."""
    if not ray.is_initialized() or os.path.exists(os.path.expanduser(AUTOSCALER_BOOTSTRAP_CONFIG)):
        return
    cluster = ray.cluster_resources()
    roles = resource_request(config, include_main_process)
    short = []
    for resource in RESOURCES:
        asked = sum(float(bundle.get(resource, 0) or 0) for _, bundle in roles)
        have = float(cluster.get(resource, 0))
        if asked > have + 1e-9:
            short.append(f"{_num(asked)} {resource}s: {_breakdown(roles, resource)}; the cluster has {_num(have)}")
    if short:
        raise ClusterTooSmallError(
            "This config asks for more than the Ray cluster has, so it could never start. It asks for "
            + ". It asks for ".join(short)
            + ". Ask for less (.env_runners(...), .learners(num_learners=..., num_gpus_per_learner=...), "
            "num_cpus_for_main_process) or give Ray more (ray.init(num_cpus=...), nodes with GPUs)."
        )
    _check_offline_reader_fits(config, roles, float(cluster.get("CPU", 0)))


def _check_offline_reader_fits(config: Any, roles: List[Tuple[Role, Dict[str, float]]], have: float) -> None:
    """``offline_reader="ray_data"``: Ray Data's tasks and actors run beside the trial, on CPUs it does not hold; on a
    cluster without them they would wait forever (`rllib_p3o.data.offline_data.ray_data_cpus`)."""
    from rllib_p3o.data.offline_data import RAY_DATA, ray_data_cpus

    if not getattr(config, "is_offline", False) or getattr(config, "offline_reader", None) != RAY_DATA:
        return
    held = sum(float(bundle.get("CPU", 0) or 0) for _, bundle in roles)
    need = ray_data_cpus(config)
    if have - held < need:
        raise ClusterTooSmallError(
            f"offline_reader='ray_data' reads the offline data with Ray Data beside the trial, which needs "
            f"{_num(need)} CPUs the trial does not hold ({_num(need - 1)} for the prelearner actors, "
            f"map_batches_kwargs' concurrency x num_cpus, + 1 for the read tasks); the cluster has {_num(have)} CPUs "
            f"and the trial holds {_num(held)} ({_breakdown(roles, 'CPU')}), so the reads would wait forever. Set "
            f".training(offline_reader='in_process') (or 'auto': read in the trial's process when the cluster is "
            f"this small), or give Ray {_num(held + need)} CPUs: ray.init(num_cpus={_num(held + need)})."
        )


def check_model_path(name: str, path: Optional[str]) -> None:
    """Raise `ModelPathError` unless ``path`` is a directory or could be a Hugging Face hub id (``name`` or
    ``namespace/name``, that transformers and vLLM would download). A path under an existing local directory
    (``runs/no-such-model``) is taken for a local path, not for a hub id."""
    if path is None or os.path.isdir(path):
        return
    if os.path.exists(path):
        raise ModelPathError(
            f"{name}={path!r} is a file; it must be a model directory (config.json, weights, tokenizer)."
        )
    if not _could_be_hub_id(path):
        raise ModelPathError(
            f"{name}={path!r}: no such directory"
            + (f" (relative to {os.getcwd()})" if not os.path.isabs(path) else "")
            + ", and not a Hugging Face hub id ('name' or 'namespace/name') either."
        )


def absolute_if_local(path: Any) -> Any:
    """``path`` made absolute if it is a relative path to something that exists here; anything else unchanged.
    Tune runs each trial in a directory of its own, so relative paths must be resolved where the config is made."""
    if isinstance(path, (str, os.PathLike)) and not os.path.isabs(path) and os.path.exists(path):
        return os.path.abspath(path)
    return path


def absolute_data_path(path: Any) -> Any:
    """A data path the user gives (a dataset, the offline input) made absolute against this process's working
    directory, whether or not it exists yet: Tune reads it in each trial's directory of its own, where a relative
    path would name a file under Ray's session folder. URIs, ``"module:function"`` and non-paths are unchanged."""
    if isinstance(path, (str, os.PathLike)) and not storage.is_uri(path) and not BY_NAME.match(os.fspath(path)):
        return os.path.abspath(os.path.expanduser(os.fspath(path)))
    return path


def absolute_paths(mapping: Mapping[str, Any], keys: Sequence[str]) -> Dict[str, Any]:
    """A copy of ``mapping`` with the values of ``keys`` passed through `absolute_data_path`."""
    return {k: absolute_data_path(v) if k in keys else v for k, v in mapping.items()}


def resolved_env_config(env_config: Mapping[str, Any]) -> Dict[str, Any]:
    """``env_config`` with its relative paths resolved where the script runs (Tune reads them in each trial's own
    directory): the datasets (`DATASET_KEYS`) by `absolute_data_path`, the reward models' directories as a list of
    model specs (`resolved_path`)."""
    from rllib_p3o.core.settings import MODEL_PATHS

    resolved = absolute_paths(env_config, DATASET_KEYS)
    models = resolved.get("reward_models")
    if isinstance(models, (list, tuple, dict)):
        resolved["reward_models"] = resolved_path(MODEL_PATHS, [models] if isinstance(models, dict) else list(models))
    return resolved


def resolved_offline_input(input_: Any) -> Any:
    """``offline_data(input_=...)`` with its relative paths made absolute where the script runs (Ray Data would read
    them in the trial's directory); a single URI kept as a one-item list, which RLlib hands to Ray Data as it is
    (RLlib would make a single string a ``pathlib.Path``, which turns ``s3://b/k`` into ``s3:/b/k``)."""
    if isinstance(input_, (str, os.PathLike)) and storage.is_uri(input_):
        return [os.fspath(input_)]
    if isinstance(input_, (str, os.PathLike)) and input_ != "sampler":  # RLlib's "no input"
        return absolute_data_path(input_)
    if isinstance(input_, list):
        return [absolute_data_path(item) for item in input_]
    return input_


def missing_path_problem(what: str, path: Any) -> Optional[str]:
    """What is wrong with a local data path that does not exist (``what`` names the setting), with the nearest names
    in its folder (a misspelling); None when it exists, or is a URI or no path (checked when it is opened)."""
    if not isinstance(path, (str, os.PathLike)) or storage.is_uri(path) or BY_NAME.match(os.fspath(path)):
        return None
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if os.path.exists(path):
        return None
    folder, name = os.path.split(path)
    if not os.path.isdir(folder):
        return f"{what}: no such file or directory: {path} (the folder {folder} does not exist either)"
    near = difflib.get_close_matches(name, sorted(os.listdir(folder)), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(os.path.join(folder, n)) for n in near)}?" if near else ""
    return f"{what}: no such file or directory: {path}{hint}"


def _could_be_hub_id(path: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if path.startswith(("/", ".", "~")) or path.count("/") > 1:
        return False
    if "/" in path and os.path.isdir(path.split("/", 1)[0]):
        return False  # "runs/model": a local directory that does not exist
    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


def _breakdown(roles: List[Tuple[Role, Dict[str, float]]], resource: str) -> str:
    """ "1 for the algorithm (num_cpus_for_main_process) + 1 for each of 2 learners (num_cpus_per_learner)"."""
    counts: Dict[Tuple[str, str, float], int] = {}
    for (who, settings), bundle in roles:
        amount = float(bundle.get(resource, 0) or 0)
        if amount:
            key = (who, settings[resource], amount)
            counts[key] = counts.get(key, 0) + 1
    return " + ".join(
        f"{_num(amount)} for {who} ({setting})"
        if who == MAIN_PROCESS[0]
        else f"{_num(amount)} for each of {n} {who} ({setting})"
        for (who, setting, amount), n in counts.items()
    )


def _num(x: float) -> str:
    return f"{x:g}"


# -- what a config's settings name: storage, datasets and reward functions, models, tokenizers, LoRA ------------------


def world_problems(config: Any, default_env: Any) -> Iterator[str]:
    """What the settings of ``config`` (a `P3OConfig`) name, checked before anything starts, in order: storage URIs
    and paths, the ``env_config`` keys, the datasets and reward functions, the model paths, the behavior models'
    tokenizers, chat datasets against the policy's template, prompt lengths, the LoRA spec. Yields a message per
    problem; the caller raises the first. Datasets given as objects are read into rows on the way
    (``config._materialize_datasets``) and the LoRA spec is resolved (``config.lora``). ``default_env``: P3O's
    own environment class (a user's may read ``env_config`` keys of its own)."""
    from rllib_p3o.core import lora as lora_specs
    from rllib_p3o.core.env_config import unknown_key_problem
    from rllib_p3o.core.sources import check_same_tokenizer
    from rllib_p3o.data.chat import ChatTemplateError
    from rllib_p3o.data.datasets import check_chat_dataset
    from rllib_p3o.data.rewards import make_reward_function
    from rllib_p3o.reward_models.server import reward_model_specs

    yield from storage_problems(config)
    yield from offline_input_problems(config)
    problem = unknown_key_problem(config.env_config or {}, own_environment=has_own_environment(config, default_env))
    if problem:
        yield problem
    try:
        config._materialize_datasets()
        make_reward_function(config.env_config or {})
    except (ValueError, ImportError, AttributeError) as e:
        yield f"env_config: {e}"
    try:
        check_model_path("model", config.policy_model)
        for i, spec in enumerate(config.behavior_models):
            check_model_path(f"behavior_models[{i}]['model']", spec.get("model"))
        for i, spec in enumerate(reward_model_specs(config.env_config or {})):  # (checked above)
            check_model_path(f"env_config['reward_models'][{i}]['model']", spec["model"])
        check_model_path("offline_rescore_model", config.offline_rescore_model)
    except ModelPathError as e:
        yield str(e)
    if config.behavior_models and not config.in_evaluation:
        check_same_tokenizer(
            config.policy_model, [s["model"] for s in config.behavior_models], config.trust_remote_code
        )
    if config.policy_model and not config.in_evaluation:
        try:
            check_chat_dataset(config.env_config or {}, config.policy_model, config.trust_remote_code)
        except ChatTemplateError as e:
            yield str(e)
        yield from prompt_length_problems(config)
    if config.lora is not None:
        try:
            spec = lora_specs.resolve(config.lora)
            config.lora = lora_specs.validate(spec, config.policy_model, config.trust_remote_code)
        except ValueError as e:
            yield f"lora: {e}"


def offline_input_problems(config: Any) -> Iterator[str]:
    """The local offline input's files whose schema lacks a required column (a recording without behavior log-probs,
    say), named before any trial starts: the trial would fail at its start, after Ray and Tune have started it
    (`rllib_p3o.data.trajectories.schema_problems`; the rows are checked by the run, which reads them). Inputs on an
    object store are left to the run, which reads them where it has their credentials."""
    from rllib_p3o.data.trajectories import OfflineDataError, schema_problems

    inputs = config.input_ if isinstance(config.input_, list) else [config.input_]
    if not config.is_offline or config.offline_skip_bad_rows or any(storage.is_uri(path) for path in inputs):
        return
    try:
        problems = schema_problems(inputs, require_behavior=not config.offline_rescore_model)
    except OfflineDataError as e:
        yield f"input_: {e}"
        return
    for problem in problems:
        yield f"input_: {problem}"


def prompt_length_problems(config: Any) -> Iterator[str]:
    """Under ``overlong_prompts="error"``: the first prompt longer than the model's context minus ``max_tokens``
    named (dataset, row, length, limit) before any engine starts (`rllib_p3o.data.prompt_fit`). Datasets a
    runner's environment produces (``multi_turn_env``, a custom env) and models off this machine are left to the
    runners."""
    from rllib_p3o.data import prompt_fit
    from rllib_p3o.data.datasets import DatasetError

    env_config = config.env_config or {}
    if env_config.get("multi_turn_env") or not os.path.isdir(str(config.policy_model)):
        return
    try:
        context = prompt_fit.model_context(config.policy_model, config.trust_remote_code, config.vllm_kwargs)
    except (OSError, ValueError, AttributeError):
        return  # a config without a context length: vLLM's own check stands
    if config.max_tokens >= context:
        yield (
            f"max_tokens={config.max_tokens} leaves no room for a prompt in the model's context of {context} tokens "
            f"({config.policy_model}): lower max_tokens."
        )
    if config.overlong_prompts != "error":
        return
    try:
        for key in ("dataset", "eval_dataset"):
            if env_config.get(key) is not None:
                prompt_fit.check_dataset_fits(
                    env_config[key], key, config.policy_model, config.trust_remote_code, context, config.max_tokens
                )
    except DatasetError as e:
        yield str(e)


def has_own_environment(config: Any, default_env: Any) -> bool:
    """Whether a user's environment class (RLlib's ``env`` other than ``default_env``, ``multi_turn_env``) may read
    ``env_config`` keys of its own, beside P3O's."""
    multi_turn = (config.env_config or {}).get("multi_turn_env")
    module = multi_turn.split(":")[0] if isinstance(multi_turn, str) else getattr(multi_turn, "__module__", "")
    return config.env is not default_env or (multi_turn is not None and not module.startswith("rllib_p3o."))


def storage_problems(config: Any) -> Iterator[str]:
    """Models load from a local directory or a hub id, never from a URI; data files go through pyarrow's
    filesystems (`rllib_p3o.core.storage`), whose URI schemes are checked here. The paths themselves are opened
    when the run starts (the recording directory is created then)."""
    models = [("model", config.policy_model), ("offline_rescore_model", config.offline_rescore_model)]
    models += [("behavior model", spec.get("model")) for spec in config.behavior_models]
    for what, path in models:
        if isinstance(path, (str, os.PathLike)) and storage.uri_scheme(path) not in ("", "file"):
            yield (
                f"{what}={os.fspath(path)!r} is a URI: vLLM and transformers load a model from a local directory "
                "(at the same path on every node) or a Hugging Face hub id. Copy the model to each node first."
            )
    env_config = config.env_config or {}
    paths = [("record_rollouts", config.record_rollouts)]
    paths += [(f"env_config['{key}']", env_config.get(key)) for key in ("dataset", "eval_dataset")]
    if config.is_offline:
        paths += [("input_", item) for item in (config.input_ if isinstance(config.input_, list) else [config.input_])]
    for what, path in paths:
        if isinstance(path, (str, os.PathLike)):
            try:
                storage.check_uri(path, what)
            except storage.StorageError as e:
                yield str(e)
            # Files read later, in a trial or a runner: a missing one is named here, before Ray starts.
            problem = missing_path_problem(what, path) if what != "record_rollouts" else None
            if problem:
                yield problem


def resolved_path(kind: str, value: Any) -> Any:
    """A setting's value with its relative paths resolved where the script runs, by the setting's declared ``path``
    kind (`rllib_p3o.core.settings`): a model directory made absolute when it exists here (a hub id is left as it is),
    a list of model specs each so, an output directory made absolute unless it is a URI, the keys of a dict keyed by
    input paths as ``offline_data(input_=...)``'s are."""
    from rllib_p3o.core.settings import INPUT_PATH_KEYS, MODEL_PATH, MODEL_PATHS, OUTPUT_PATH

    if kind == INPUT_PATH_KEYS and isinstance(value, dict):
        return {os.fspath(resolved_offline_input([key])[0]): answer for key, answer in value.items()}
    if kind == MODEL_PATH and isinstance(value, (str, os.PathLike)):
        return absolute_if_local(os.fspath(value))
    if kind == MODEL_PATHS and isinstance(value, list):
        return [
            {**spec, "model": absolute_if_local(spec["model"])} if isinstance(spec, dict) and "model" in spec else spec
            for spec in value
        ]
    if kind == OUTPUT_PATH and isinstance(value, (str, os.PathLike)) and not storage.is_uri(value):
        return os.path.abspath(value)  # an output directory: never inside a trial's directory
    return value
