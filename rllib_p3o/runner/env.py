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
    ``reward_models``: optional, reward models served by Ray actors (`rllib_p3o.reward_models.server`), scored after
        the reward functions (``reward_weights``: then one weight per reward model).
    ``multi_turn_env``: optional, a `rllib_p3o.runner.multiturn.MultiTurnEnv` class: episodes of several turns (see there
        for ``max_turns``, ``max_total_tokens``); ``reward_fn`` is then optional.
    ``stop_tokens``: optional token strings that end a completion (or a model turn) besides EOS.
    ``eval_dataset``: optional held-out rows (same formats) for greedy evaluation.
    ``seed``: shuffling seed (default 0).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

import gymnasium as gym
import numpy as np

from rllib_p3o.data import datasets, rewards


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
            raise datasets.DatasetError(
                "TextEnv needs env_config['dataset'] (a Parquet/JSONL path or a list of dicts)."
            )
        if rewards.reward_spec(config) is None and not config.get("multi_turn_env") and not config.get("reward_models"):
            raise ValueError(
                "TextEnv needs env_config['reward_fn'] (TRL signature: prompts, completions, **columns) or "
                "env_config['reward_models']."
            )
        self.rows = datasets.load_prompt_dataset(config["dataset"])
        self.eval_rows = (
            datasets.load_prompt_dataset(config["eval_dataset"], "eval_dataset")
            if config.get("eval_dataset") is not None
            else []
        )
        # A multi-turn environment may give its own rewards (`rllib_p3o.runner.multiturn`).
        self.reward = rewards.make_reward_function(config)
        # Every runner holds all rows: which prompt a group samples is the driver's choice (`rllib_p3o.data.prompt_schedule`).
        # The gym API below (reset/step, used outside this package's runners) draws its own order.
        self._rng = np.random.default_rng([int(config.get("seed", 0)), int(config.get("worker_index", 0))])
        self._order: List[int] = []
        self._current: Optional[datasets.Row] = None
        self.observation_space = self.observation_space_default()
        self.action_space = self.action_space_default()

    def next_rows(self, k: int) -> List[datasets.Row]:
        """The next ``k`` rows of a reshuffled-every-epoch pass over the dataset (the gym API's order)."""
        out = []
        while len(out) < k:
            if not self._order:
                self._order = list(self._rng.permutation(len(self.rows)))
            out.append(self.rows[self._order.pop()])
        return out

    def score(self, prompts: List[Any], completions: List[str], rows: List[datasets.Row]) -> np.ndarray:
        """The (weighted) reward of each completion; NaN where no reward function scored it."""
        return self.reward(prompts, completions, rows)

    def score_by_function(
        self,
        prompts: List[Any],
        completions: List[str],
        rows: List[datasets.Row],
        completion_ids: Optional[List[List[int]]] = None,
    ) -> rewards.Rewards:
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
