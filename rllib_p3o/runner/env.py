"""The text environment: one episode = one prompt → one completion → one reward (single turn).

Design. An LLM rollout is not stepped token by token through gymnasium: the inference engine generates whole
completions for a batch of prompts at once. So an episode has exactly one step: ``reset()`` returns a prompt
(observation, a string), ``step(completion)`` (action, a string) returns the verifier's reward and
``terminated=True``. Token ids and behavior log-probs live in the RLlib episode built by the EnvRunner, not in
the gym spaces, which are `gymnasium.spaces.Text` placeholders. The EnvRunner reads `TextEnv.rows` (the driver's
schedule picks the rows) and scores with `TextEnv.score`, so the reward function sees whole batches, as TRL's does.

``env_config``:
    ``dataset``: a ``.parquet``/``.jsonl``/``.json`` path, a list of dicts, a Hugging Face ``datasets.Dataset``, a
        Ray Data ``ray.data.Dataset`` or ``"module:function"`` (a function returning one of these); each row has at
        least ``prompt``: a string, or a list of chat messages rendered with the policy tokenizer's chat template
        (`rllib_p3o.data.chat`); other columns (e.g. ``answer``) are passed to the reward function as keyword lists.
        Dataset objects are turned into rows once, on the driver (`materialize_dataset`), in their own order.
    ``reward_fn``: one reward function or a list of them (TRL's ``reward_funcs``; ``"module:function"`` strings
        work too): ``reward_fn(prompts, completions, **columns) -> list[float | None]``, TRL's signature. For
        conversational prompts ``completions`` are message lists (``[{"role": "assistant", "content": text}]``), as
        TRL passes them; for string prompts, texts. See `RewardFunction` for weights and None.
    ``reward_weights``: optional, one weight per reward function (TRL's ``reward_weights``; default all 1.0).
    ``reward_funcs``: TRL's name, accepted for ``reward_fn`` (give one of the two).
    ``multi_turn_env``: optional, a `rllib_p3o.runner.multiturn.MultiTurnEnv` class: episodes of several turns (see there
        for ``max_turns``, ``max_total_tokens``); ``reward_fn`` is then optional.
    ``stop_tokens``: optional token strings that end a completion (or a model turn) besides EOS.
    ``eval_dataset``: optional held-out rows (same formats) for greedy evaluation.
    ``seed``: shuffling seed (default 0).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import logging
import math
import os
import re
import socket
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

import gymnasium as gym
import numpy as np

from rllib_p3o.core import storage
from rllib_p3o.data.chat import check_chat_template, is_conversational, message_problem

logger = logging.getLogger(__name__)

Row = Dict[str, Any]
# A path, rows, a Hugging Face `datasets.Dataset`, a `ray.data.Dataset` or "module:function" returning one of these.
DatasetSpec = Union[str, os.PathLike, Sequence[Mapping[str, Any]], Any]
RewardFnSpec = Union[str, Callable]
# The env_config keys that name the reward function(s): ours, and TRL's.
REWARD_FN_KEYS = ("reward_fn", "reward_funcs")
_BY_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class DatasetError(ValueError):
    """A prompt dataset is missing, empty or malformed; the message names the file, row and column."""


class RewardFunctionError(RuntimeError):
    """The user's reward function raised or returned an invalid value; the message names it and the prompt."""


def _object_kind(spec: Any) -> Optional[str]:
    """ "huggingface" or "ray" for the dataset objects `materialize_dataset` turns into rows, else None."""
    module = type(spec).__module__ or ""
    if module.startswith("datasets.") and hasattr(spec, "column_names"):
        return "huggingface"
    if module.startswith("ray.data.") and hasattr(spec, "to_arrow_refs"):
        return "ray"
    return None


def _ray_dataset_rows(ds: Any) -> List[Row]:
    """The rows of a ``ray.data.Dataset`` in the dataset's own order (``preserve_order``): every process that reads the
    rows must see the same order, since the prompt schedule (`rllib_p3o.data.prompt_schedule`) picks rows by index and
    a restored run must pick the same ones."""
    import pyarrow as pa
    import ray

    options = ds.context.execution_options
    preserve = options.preserve_order
    options.preserve_order = True
    try:
        tables = ray.get(ds.to_arrow_refs())
    finally:
        options.preserve_order = preserve
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables, promote_options="permissive").to_pylist() if tables else []


def materialize_dataset(spec: DatasetSpec, name: str = "dataset") -> DatasetSpec:
    """``spec`` with dataset objects turned into a list of row dicts: a Hugging Face ``datasets.Dataset`` (or
    ``IterableDataset``) and a ``ray.data.Dataset`` (read once, in order), and ``"module:function"`` (called, and its
    result turned into rows likewise). Paths and lists are returned as they are: the runners read those themselves.

    Runs on the driver, at config time, so that a Ray dataset executes outside any actor's reserved CPUs and every
    runner gets the same rows.
    """
    if isinstance(spec, str) and _BY_NAME.match(spec) and not os.path.exists(spec):
        try:
            fn = resolve_callable(spec, what=name)
        except (ImportError, AttributeError) as e:
            raise DatasetError(f"{name}: cannot import {spec!r}: {e}") from e
        try:
            spec = fn()
        except Exception as e:
            raise DatasetError(f"{name}: {spec} raised {type(e).__name__}: {e}") from e
        if isinstance(spec, str) and _BY_NAME.match(spec):
            raise DatasetError(f"{name}: the function returned another name, {spec!r}; return rows or a path")
        return materialize_dataset(spec, name)
    kind = _object_kind(spec)
    if kind == "huggingface" and type(spec).__name__ in ("DatasetDict", "IterableDatasetDict"):
        raise DatasetError(
            f"{name}: a DatasetDict holds several splits ({', '.join(spec)}); pass one, e.g. dataset['train']"
        )
    if kind == "huggingface":
        return [dict(r) for r in (spec.to_list() if hasattr(spec, "to_list") else spec)]
    if kind == "ray":
        return _ray_dataset_rows(spec)
    return spec


def read_prompt_rows(spec: DatasetSpec, name: str = "dataset") -> tuple:
    """``(rows, where)``: the raw rows of a prompt dataset (any `DatasetSpec`; a file is a local path or a URI,
    `rllib_p3o.core.storage`) and a name for messages (the file's path), unchecked. `DatasetError` when the file is missing, unreadable or empty."""
    spec = materialize_dataset(spec, name)
    if isinstance(spec, (str, os.PathLike)):
        try:
            location = storage.locate(spec)
            found, is_dir = location.exists(), location.is_dir()
        except storage.StorageError as e:
            raise DatasetError(f"{name}: {e}") from e
        path = where = str(location)
        if not found:
            raise DatasetError(f"{name}: file not found: {path}")
        if path.endswith(".parquet") or is_dir:
            import pyarrow.parquet as pq

            try:
                rows = pq.read_table(location.path, filesystem=location.filesystem).to_pylist()
            except Exception as e:
                raise DatasetError(f"{name}: cannot read Parquet {path}: {e}") from e
        elif path.endswith(".jsonl"):
            rows = []
            for i, line in enumerate(location.read_bytes().decode("utf-8").splitlines()):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise DatasetError(f"{name}: {path} line {i + 1} is not valid JSON: {e}") from e
        elif path.endswith(".json"):
            try:
                rows = json.loads(location.read_bytes().decode("utf-8"))
            except json.JSONDecodeError as e:
                raise DatasetError(f"{name}: {path} is not valid JSON: {e}") from e
            if not isinstance(rows, list):
                raise DatasetError(f"{name}: {path} must hold a JSON list of rows, got a {type(rows).__name__}")
        else:
            raise DatasetError(f"{name}: unsupported file type {path} (use .parquet, .jsonl or .json)")
    else:
        rows, where = list(spec), f"{name} (in-memory list)"
    if not rows:
        raise DatasetError(f"{where}: the dataset is empty")
    return rows, where


def prompt_row_problem(row: Any) -> Optional[str]:
    """What is wrong with one prompt row (``"row N" + this`` names it), or None when it is valid."""
    if not isinstance(row, Mapping):
        return f"is a {type(row).__name__}, expected a mapping with a 'prompt'"
    if "prompt" not in row:
        return f"has no 'prompt' column (columns: {sorted(row)})"
    prompt = row["prompt"]
    if is_conversational(prompt):
        problem = message_problem(prompt)
        return f"column 'prompt': {problem}" if problem else None
    if not isinstance(prompt, str) or not prompt:
        return f"column 'prompt' must be a non-empty string or a list of chat messages, got {prompt!r:.200}"
    return None


def load_prompt_dataset(spec: DatasetSpec, name: str = "dataset") -> List[Row]:
    """Rows of a prompt dataset (any `DatasetSpec`), validated: the first bad row raises `DatasetError` naming the
    file, the row and the column."""
    rows, where = read_prompt_rows(spec, name)
    for i, r in enumerate(rows):
        problem = prompt_row_problem(r)
        if problem:
            raise DatasetError(f"{where}: row {i} {problem}")
    return [dict(r) for r in rows]


def has_conversational_prompts(rows: Sequence[Mapping[str, Any]]) -> bool:
    return any(is_conversational(r.get("prompt")) for r in rows)


def dataset_is_conversational(spec: DatasetSpec) -> bool:
    """Whether a prompt dataset's prompts are chat messages, read cheaply (Parquet: the schema; JSONL: the first
    row) for config validation; the full check happens when the runners load the rows."""
    if not isinstance(spec, (str, os.PathLike)):
        return has_conversational_prompts([r for r in spec if isinstance(r, Mapping)])
    try:
        location = storage.locate(spec)
        path = str(location)
        if path.endswith(".parquet") or location.is_dir():
            import pyarrow as pa
            import pyarrow.dataset as ds

            dataset = ds.dataset(location.path, format="parquet", filesystem=location.filesystem)
            field = dataset.schema.field("prompt")
            return pa.types.is_list(field.type) or pa.types.is_large_list(field.type)
        if path.endswith(".jsonl"):
            with location.filesystem.open_input_stream(location.path) as f:
                head = b""
                while b"\n" not in head.lstrip() and (chunk := f.read(1 << 16)):
                    head += chunk
            first = next((line for line in head.decode("utf-8", "replace").splitlines() if line.strip()), "{}")
            return is_conversational(json.loads(first).get("prompt"))
    except (OSError, KeyError, ValueError):
        return False  # a missing or malformed file is reported, with its row, when it is loaded
    return False


def check_chat_dataset(env_config: Mapping[str, Any], model: str, trust_remote_code: bool = False) -> None:
    """`rllib_p3o.data.chat.ChatTemplateError` naming ``model`` when the prompt dataset is conversational and the model's
    tokenizer has no chat template (at config validation, before any actor starts)."""
    dataset = env_config.get("dataset")
    if dataset is None or not dataset_is_conversational(dataset):
        return
    from transformers import AutoTokenizer

    check_chat_template(AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code), model)


class CallableImportError(ImportError):
    """A function or class that the config names (``"module:function"``, or pickled by reference to its module) cannot
    be imported in the process that needs it, typically a runner process; the message says how to make it
    importable there."""


def make_importable_hint(module: str) -> str:
    """How to make ``module`` importable in Ray's worker processes (for `CallableImportError` messages)."""
    top = module.split(".")[0]
    return (
        f"Runner processes import {module!r} by name, so it must be importable on every node: install it, put its "
        f'folder on PYTHONPATH before Ray starts, or let Ray ship it: ray.init(runtime_env={{"py_modules": [{top}]}}) '
        f'(the imported module, or its folder\'s path), or ray.init(runtime_env={{"working_dir": "."}}) for the '
        "folder you run from."
    )


def resolve_callable(fn: Union[str, Callable], what: str = "reward_fn") -> Callable:
    """A callable, or ``"package.module:function"`` imported by name (handy in Tune/CLI configs); ``what`` names the
    setting in errors. `CallableImportError` when the module or the name cannot be imported here."""
    if callable(fn):
        return fn
    if isinstance(fn, str) and ":" in fn:
        module, attr = fn.split(":", 1)
        where = f"in this process (pid {os.getpid()} on {socket.gethostname()})"
        try:
            imported = importlib.import_module(module)
        except ImportError as e:
            raise CallableImportError(
                f"env_config[{what!r}] = {fn!r}: cannot import module {module!r} {where}: {type(e).__name__}: {e}. "
                + make_importable_hint(module),
                name=module,
            ) from e
        try:
            return functools.reduce(getattr, attr.split("."), imported)
        except AttributeError:
            raise CallableImportError(
                f"env_config[{what!r}] = {fn!r}: module {module!r} ({getattr(imported, '__file__', '?')}) has no "
                f"attribute {attr!r} {where}.",
                name=module,
            ) from None
    raise ValueError(f"{what} must be a callable or 'module:function', got {fn!r}")


def function_name(fn: Callable) -> str:
    """A reward function's name in metrics and tables, as TRL names it: ``__name__`` (through ``functools.partial``),
    else the class name of a callable object."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def reward_spec(env_config: Mapping[str, Any]) -> Optional[RewardFnSpec | List[RewardFnSpec]]:
    """The reward function(s) an ``env_config`` names (``reward_fn``, or TRL's ``reward_funcs``), or None."""
    given = [k for k in REWARD_FN_KEYS if env_config.get(k) is not None]
    if len(given) > 1:
        raise ValueError("env_config has both 'reward_fn' and 'reward_funcs': give one (they mean the same).")
    return env_config[given[0]] if given else None


class Rewards(NamedTuple):
    """A batch's rewards: the weighted sum (NaN where every function returned None) and each function's values
    (NaN where it returned None), ``[completions, functions]``."""

    total: np.ndarray
    by_function: np.ndarray


class RewardFunction:
    """One or several TRL-style batched reward functions, with weights; checks what they return.

    ``reward = Σ_k w_k · r_k`` over the functions that scored the completion, TRL's ``reward_funcs`` and
    ``reward_weights``: a function returns one value per completion, or None where it does not apply (e.g. a math
    verifier on a coding prompt), which counts as 0 in the sum (TRL's ``nansum``). A completion that no function
    scored is *unscorable*: its reward is NaN, it is left out of its group's mean and standard deviation, and its
    advantage is 0 (`rllib_p3o.core.objectives.group_advantages`), as in TRL. A function that raises, returns NaN or
    infinity, a non-number or the wrong number of values is an error naming it.
    """

    def __init__(self, fn: Union[RewardFnSpec, Sequence[RewardFnSpec]], weights: Optional[Sequence[float]] = None):
        fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
        if not fns:
            raise ValueError("reward_fn: an empty list of reward functions")
        self.fns = [resolve_callable(f) for f in fns]
        if weights is None:
            weights = [1.0] * len(self.fns)
        weights = [float(w) for w in weights]
        if len(weights) != len(self.fns):
            raise ValueError(
                f"reward_weights has {len(weights)} weights for {len(self.fns)} reward functions; give one per function"
            )
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"reward_weights must be finite numbers, got {weights}")
        self.weights = np.asarray(weights, dtype=np.float64)
        self.names = _unique([function_name(f) for f in self.fns])
        self._by_keyword = [_call_style(f) for f in self.fns]
        self.name = ", ".join(getattr(f, "__qualname__", None) or repr(f) for f in self.fns)
        self._warned_unscorable = False

    def __call__(self, prompts: List[Any], completions: List[Any], rows: List[Row]) -> np.ndarray:
        """The weighted rewards of ``completions`` (see `score`)."""
        return self.score(prompts, completions, rows).total

    def score(
        self,
        prompts: List[Any],
        completions: List[Any],
        rows: List[Row],
        completion_ids: Optional[List[List[int]]] = None,
    ) -> Rewards:
        """Rewards of ``completions``: texts, or message lists (a multi-turn episode's turns after the prompt).

        Each function gets ``prompts`` as they are and the completions as TRL passes them: for a conversational
        prompt (a message list) the completion as messages, ``[{"role": "assistant", "content": text}]``; for a
        string prompt, its text. The row's other columns come as keyword lists; for conversational prompts also
        ``completion_messages`` (the same messages; the name of earlier versions, kept); and ``completion_ids`` (the
        generated token ids) where known, to functions that take it or ``**kwargs``. A function whose parameters name
        ``completions`` is called with keywords, as TRL calls it (``def f(completions, **kwargs)`` works); others
        get ``prompts`` and ``completions`` by position.
        """
        columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
        as_given = [_as_trl_completion(p, c) for p, c in zip(prompts, completions)]
        if any(is_conversational(p) for p in prompts):
            columns["completion_messages"] = [c if not isinstance(c, str) else _messages(c) for c in as_given]
        values = np.stack(
            [
                self._call(k, prompts, as_given, {**columns, **self._ids_for(k, completion_ids)})
                for k in range(len(self.fns))
            ],
            axis=1,
        )
        scored = ~np.isnan(values)
        total = np.where(scored, values * self.weights, 0.0).sum(axis=1)
        unscorable = ~scored.any(axis=1)
        total[unscorable] = np.nan
        if unscorable.any() and not self._warned_unscorable:
            i = int(np.flatnonzero(unscorable)[0])
            logger.warning(
                "every reward function (%s) returned None for prompt %r and completion %r: such completions get "
                "no reward and advantage 0 (this warning is shown once).",
                ", ".join(self.names),
                prompts[i],
                completions[i],
            )
            self._warned_unscorable = True
        return Rewards(total.astype(np.float32), values.astype(np.float32))

    def _ids_for(self, k: int, completion_ids: Optional[List[List[int]]]) -> Dict[str, Any]:
        takes_ids = self._by_keyword[k] is not None and self._by_keyword[k][1]
        return {"completion_ids": [list(map(int, i)) for i in completion_ids]} if completion_ids and takes_ids else {}

    def _call(self, k: int, prompts: List[Any], completions: List[Any], columns: Dict) -> np.ndarray:
        fn, name, style = self.fns[k], self.names[k], self._by_keyword[k]
        try:
            if style is not None and style[0]:
                out = fn(prompts=prompts, completions=completions, **columns)
            else:
                out = fn(prompts, completions, **columns)
        except Exception as e:
            raise RewardFunctionError(
                f"reward function {name} raised {type(e).__name__}: {e} "
                f"(batch of {len(prompts)}, first prompt {prompts[0]!r:.200})"
            ) from e
        try:
            values = [np.nan if v is None else float(v) for v in out]
        except (TypeError, ValueError) as e:
            raise RewardFunctionError(
                f"reward function {name} must return a list of floats (or None where it does not apply), "
                f"got {out!r:.200}"
            ) from e
        if len(values) != len(prompts):
            raise RewardFunctionError(
                f"reward function {name} returned {len(values)} rewards for {len(prompts)} completions "
                f"(first prompt {prompts[0]!r:.200})"
            )
        for p, c, v, raw in zip(prompts, completions, values, out):
            if raw is not None and not math.isfinite(v):
                raise RewardFunctionError(
                    f"reward function {name} returned {v} for prompt {p!r:.200} and completion {c!r:.200} "
                    "(return None where a function does not apply)"
                )
        return np.asarray(values, dtype=np.float64)


def _call_style(fn: Callable) -> Optional[tuple]:
    """``(by keyword, takes completion_ids)`` of a reward function, from its signature (None when it has none):
    keywords when a parameter is named ``completions`` or when it takes ``**kwargs`` only, as TRL's functions do."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    names = {p.name for p in params}
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
    by_keyword = "completions" in names or (var_keyword and not positional)
    return by_keyword, "completion_ids" in names or var_keyword


def _messages(text: str) -> List[Dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _as_trl_completion(prompt: Any, completion: Any) -> Any:
    """A completion as TRL hands it to reward functions: messages for a conversational prompt, else text."""
    if isinstance(completion, str):
        return _messages(completion) if is_conversational(prompt) else completion
    return list(completion)


def _unique(names: List[str]) -> List[str]:
    """Names made unique by a suffix (``f``, ``f_2``, ...), so that each function's metrics have their own key."""
    seen: Dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}_{seen[n]}")
    return out


def make_reward_function(env_config: Mapping[str, Any]) -> Optional[RewardFunction]:
    """The `RewardFunction` an ``env_config`` describes (``reward_fn``/``reward_funcs``, ``reward_weights``), or None."""
    spec = reward_spec(env_config)
    if spec is None:
        if env_config.get("reward_weights") is not None:
            raise ValueError("env_config has reward_weights but no reward_fn.")
        return None
    return RewardFunction(spec, env_config.get("reward_weights"))


class TextEnv(gym.Env):
    """Single-turn text environment: ``reset() -> prompt``, ``step(completion) -> reward, terminated=True``."""

    metadata = {"render_modes": []}

    @staticmethod
    def observation_space_default() -> gym.Space:
        return gym.spaces.Text(max_length=1 << 20)

    @staticmethod
    def action_space_default() -> gym.Space:
        return gym.spaces.Text(max_length=1 << 20)

    def __init__(self, config: Optional[Mapping[str, Any]] = None):
        config = dict(config or {})
        if "dataset" not in config:
            raise DatasetError("TextEnv needs env_config['dataset'] (a Parquet/JSONL path or a list of dicts).")
        if reward_spec(config) is None and not config.get("multi_turn_env"):
            raise ValueError("TextEnv needs env_config['reward_fn'] (TRL signature: prompts, completions, **columns).")
        self.rows = load_prompt_dataset(config["dataset"])
        self.eval_rows = (
            load_prompt_dataset(config["eval_dataset"], "eval_dataset")
            if config.get("eval_dataset") is not None
            else []
        )
        # A multi-turn environment may give its own rewards (`rllib_p3o.runner.multiturn`).
        self.reward = make_reward_function(config)
        # Every runner holds all rows: which prompt a group samples is the driver's choice (`rllib_p3o.data.prompt_schedule`).
        # The gym API below (reset/step, used outside this package's runners) draws its own order.
        self._rng = np.random.default_rng([int(config.get("seed", 0)), int(config.get("worker_index", 0))])
        self._order: List[int] = []
        self._current: Optional[Row] = None
        self.observation_space = self.observation_space_default()
        self.action_space = self.action_space_default()

    def next_rows(self, k: int) -> List[Row]:
        """The next ``k`` rows of a reshuffled-every-epoch pass over the dataset (the gym API's order)."""
        out = []
        while len(out) < k:
            if not self._order:
                self._order = list(self._rng.permutation(len(self.rows)))
            out.append(self.rows[self._order.pop()])
        return out

    def score(self, prompts: List[Any], completions: List[str], rows: List[Row]) -> np.ndarray:
        """The (weighted) reward of each completion; NaN where no reward function scored it."""
        return self.reward(prompts, completions, rows)

    def score_by_function(
        self,
        prompts: List[Any],
        completions: List[str],
        rows: List[Row],
        completion_ids: Optional[List[List[int]]] = None,
    ) -> Rewards:
        """The rewards and each reward function's values (`RewardFunction.score`)."""
        return self.reward.score(prompts, completions, rows, completion_ids)

    # gymnasium API (one step per episode) ------------------------------------------------------------------------

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng, self._order = np.random.default_rng(seed), []
        self._current = self.next_rows(1)[0]
        return self._current["prompt"], {"row": self._current}

    def step(self, action: str):
        if self._current is None:
            raise RuntimeError("TextEnv.step() called before reset().")
        row, self._current = self._current, None
        reward = float(self.score([row["prompt"]], [action], [row])[0])
        return row["prompt"], reward, True, False, {"row": row}
