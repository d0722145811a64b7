"""The text environment: one episode = one prompt → one completion → one reward (single turn).

Design. An LLM rollout is not stepped token by token through gymnasium: the inference engine generates whole
completions for a batch of prompts at once. So an episode has exactly one step: ``reset()`` returns a prompt
(observation, a string), ``step(completion)`` (action, a string) returns the verifier's reward and
``terminated=True``. Token ids and behavior log-probs live in the RLlib episode built by the EnvRunner, not in
the gym spaces, which are `gymnasium.spaces.Text` placeholders. The EnvRunner reads `TextEnv.rows` (the driver's
schedule picks the rows) and scores with `TextEnv.score`, so the reward function sees whole batches, as TRL's does.

``env_config``:
    ``dataset``: a ``.parquet``/``.jsonl``/``.json`` path or a list of dicts, each with at least ``prompt``: a
        string, or a list of chat messages rendered with the policy tokenizer's chat template (`rllib_p3o.data.chat`);
        other columns (e.g. ``answer``) are passed to the reward function as keyword lists.
    ``reward_fn``: ``reward_fn(prompts: list[str], completions: list[str], **columns) -> list[float]`` (TRL's
        signature), or ``"module:function"``. For conversational prompts it also gets ``completion_messages``.
    ``multi_turn_env``: optional, a `rllib_p3o.runner.multiturn.MultiTurnEnv` class: episodes of several turns (see there
        for ``max_turns``, ``max_total_tokens``); ``reward_fn`` is then optional.
    ``stop_tokens``: optional token strings that end a completion (or a model turn) besides EOS.
    ``eval_dataset``: optional held-out rows (same formats) for greedy evaluation.
    ``seed``: shuffling seed (default 0).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import socket
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import gymnasium as gym
import numpy as np

from rllib_p3o.data.chat import check_chat_template, is_conversational, message_problem

Row = Dict[str, Any]
DatasetSpec = Union[str, os.PathLike, Sequence[Mapping[str, Any]]]


class DatasetError(ValueError):
    """A prompt dataset is missing, empty or malformed; the message names the file, row and column."""


class RewardFunctionError(RuntimeError):
    """The user's reward function raised or returned an invalid value; the message names it and the prompt."""


def load_prompt_dataset(spec: DatasetSpec, name: str = "dataset") -> List[Row]:
    """Rows of a prompt dataset from a Parquet/JSONL/JSON file or a list of dicts, validated."""
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        if not os.path.exists(path):
            raise DatasetError(f"{name}: file not found: {path}")
        if path.endswith(".parquet") or os.path.isdir(path):
            import pyarrow.parquet as pq

            try:
                rows = pq.read_table(path).to_pylist()
            except Exception as e:
                raise DatasetError(f"{name}: cannot read Parquet {path}: {e}") from e
        elif path.endswith(".jsonl"):
            rows = []
            with open(path) as f:
                for i, line in enumerate(f):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as e:
                            raise DatasetError(f"{name}: {path} line {i + 1} is not valid JSON: {e}") from e
        elif path.endswith(".json"):
            with open(path) as f:
                rows = json.load(f)
        else:
            raise DatasetError(f"{name}: unsupported file type {path} (use .parquet, .jsonl or .json)")
        where = path
    else:
        rows, where = [dict(r) for r in spec], f"{name} (in-memory list)"
    if not rows:
        raise DatasetError(f"{where}: the dataset is empty")
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise DatasetError(f"{where}: row {i} is a {type(r).__name__}, expected a mapping with a 'prompt'")
        if "prompt" not in r:
            raise DatasetError(f"{where}: row {i} has no 'prompt' column (columns: {sorted(r)})")
        prompt = r["prompt"]
        if is_conversational(prompt):
            problem = message_problem(prompt)
            if problem:
                raise DatasetError(f"{where}: row {i} column 'prompt': {problem}")
        elif not isinstance(prompt, str) or not prompt:
            raise DatasetError(
                f"{where}: row {i} column 'prompt' must be a non-empty string or a list of chat "
                f"messages, got {prompt!r:.200}"
            )
    return [dict(r) for r in rows]


def has_conversational_prompts(rows: Sequence[Mapping[str, Any]]) -> bool:
    return any(is_conversational(r.get("prompt")) for r in rows)


def dataset_is_conversational(spec: DatasetSpec) -> bool:
    """Whether a prompt dataset's prompts are chat messages, read cheaply (Parquet: the schema; JSONL: the first
    row) for config validation; the full check happens when the runners load the rows."""
    if not isinstance(spec, (str, os.PathLike)):
        return has_conversational_prompts([r for r in spec if isinstance(r, Mapping)])
    path = os.fspath(spec)
    try:
        if path.endswith(".parquet") or os.path.isdir(path):
            import pyarrow as pa
            import pyarrow.dataset as ds

            field = ds.dataset(path, format="parquet").schema.field("prompt")
            return pa.types.is_list(field.type) or pa.types.is_large_list(field.type)
        if path.endswith(".jsonl"):
            with open(path) as f:
                first = next((line for line in f if line.strip()), "{}")
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
            return getattr(imported, attr)
        except AttributeError:
            raise CallableImportError(
                f"env_config[{what!r}] = {fn!r}: module {module!r} ({getattr(imported, '__file__', '?')}) has no "
                f"attribute {attr!r} {where}.",
                name=module,
            ) from None
    raise ValueError(f"{what} must be a callable or 'module:function', got {fn!r}")


class RewardFunction:
    """Calls a TRL-style batched reward function and checks what it returns."""

    def __init__(self, fn: Union[str, Callable]):
        self.fn = resolve_callable(fn)
        self.name = getattr(self.fn, "__qualname__", None) or repr(self.fn)

    def __call__(self, prompts: List[Any], completions: List[str], rows: List[Row]) -> np.ndarray:
        """Rewards of ``completions`` (texts). Conversational prompts (message lists) are passed as they are, and the
        completions also as messages, ``completion_messages=[[{"role": "assistant", "content": text}], ...]``, as
        TRL passes them to reward functions of conversational datasets."""
        columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
        if any(is_conversational(p) for p in prompts):
            columns["completion_messages"] = [[{"role": "assistant", "content": c}] for c in completions]
        try:
            out = self.fn(prompts, completions, **columns)
        except Exception as e:
            raise RewardFunctionError(
                f"reward function {self.name} raised {type(e).__name__}: {e} "
                f"(batch of {len(prompts)}, first prompt {prompts[0]!r})"
            ) from e
        try:
            values = [float(v) for v in out]
        except (TypeError, ValueError) as e:
            raise RewardFunctionError(
                f"reward function {self.name} must return a list of floats, got {out!r:.200}"
            ) from e
        if len(values) != len(prompts):
            raise RewardFunctionError(
                f"reward function {self.name} returned {len(values)} rewards for {len(prompts)} completions "
                f"(first prompt {prompts[0]!r})"
            )
        for p, c, v in zip(prompts, completions, values):
            if not math.isfinite(v):
                raise RewardFunctionError(
                    f"reward function {self.name} returned {v} for prompt {p!r} and completion {c!r}"
                )
        return np.asarray(values, dtype=np.float32)


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
        if "reward_fn" not in config and not config.get("multi_turn_env"):
            raise ValueError("TextEnv needs env_config['reward_fn'] (TRL signature: prompts, completions, **columns).")
        self.rows = load_prompt_dataset(config["dataset"])
        self.eval_rows = (
            load_prompt_dataset(config["eval_dataset"], "eval_dataset")
            if config.get("eval_dataset") is not None
            else []
        )
        # A multi-turn environment may give its own rewards (`rllib_p3o.runner.multiturn`).
        self.reward = RewardFunction(config["reward_fn"]) if "reward_fn" in config else None
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

    def score(self, prompts: List[str], completions: List[str], rows: List[Row]) -> np.ndarray:
        return self.reward(prompts, completions, rows)

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
