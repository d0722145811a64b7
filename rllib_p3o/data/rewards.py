"""The reward contract: ``env_config["reward_fn"]`` (or TRL's ``reward_funcs``), one function or several with
``reward_weights``, called on whole batches with TRL's signature.

``reward_fn(prompts, completions, **columns) -> list[float | None]``: for conversational prompts ``completions`` are
message lists (``[{"role": "assistant", "content": text}]``), as TRL passes them; for string prompts, texts. A
function may be given as ``"module:function"`` (`rllib_p3o.core.callables`). See `RewardFunction` for weights and
None. The driver builds one to validate the config; each runner builds its own to score.
"""

from __future__ import annotations

import inspect
import logging
import math
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from rllib_p3o.core.callables import function_name, resolve_callable
from rllib_p3o.data.chat import is_conversational
from rllib_p3o.data.datasets import Row
from rllib_p3o.reward_models import server as reward_models

logger = logging.getLogger(__name__)

RewardFnSpec = Union[str, Callable]
# The env_config keys that name the reward function(s): ours, and TRL's.
REWARD_FN_KEYS = ("reward_fn", "reward_funcs")


class RewardFunctionError(RuntimeError):
    """The user's reward function raised or returned an invalid value; the message names it and the prompt."""


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
    advantage is 0 (`rllib_p3o.core.batch_stats.group_advantages`), as in TRL. A function that raises, returns NaN or
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
                " (then one per reward model)"
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
        string prompt, its text. The row's other columns come as keyword lists, and ``completion_ids`` (the
        generated token ids) where known, to functions that take it or ``**kwargs``. A function whose parameters name
        ``completions`` is called with keywords, as TRL calls it (``def f(completions, **kwargs)`` works); others
        get ``prompts`` and ``completions`` by position.
        """
        columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
        as_given = [_as_trl_completion(p, c) for p, c in zip(prompts, completions)]
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
        except reward_models.RewardModelError:
            raise  # it names the reward model and what to do
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
    """The `RewardFunction` an ``env_config`` describes (``reward_fn``/``reward_funcs``, then one function per
    ``reward_models`` entry, `rllib_p3o.reward_models.server`; ``reward_weights`` one per function in that order), or
    None."""
    spec = reward_spec(env_config)
    models = reward_models.clients(env_config)
    if spec is None and not models:
        if env_config.get("reward_weights") is not None:
            raise ValueError("env_config has reward_weights but no reward_fn or reward_models.")
        return None
    fns = [] if spec is None else list(spec) if isinstance(spec, (list, tuple)) else [spec]
    return RewardFunction([*fns, *models], env_config.get("reward_weights"))
