"""How a runner turns prompt groups into episodes on its engines: single-turn completions, or multi-turn episodes.

Single turn (`single_turn_episodes`): each engine (the policy's, each behavior model's) generates its share of every
prompt group in one vLLM call; the reward function scores all completions in one call; one 1-step episode each.

Multi-turn (`MultiTurnRollouts`): every episode of a sample() call is played at once, one vLLM call per turn and
engine. Turn k of all active episodes of an engine is one ``llm.generate`` call (a `TokensPrompt` of each episode's
ids so far; vLLM's prefix cache keeps the shared history cheap), so an iteration costs about turns × one single-turn
call. Then every active episode's environment gets its `MultiTurnEnv.prepare_step` before any `step`, so that a
turn's slow environment work (`ToolEnv`'s tool calls, in worker processes) runs at once. Episodes that end leave the
batch. Each episode keeps its token sequence itself (`rllib_p3o.data.chat` for why):

    prompt ids | model turn 1 (engine ids) | env turn 1 (template ids) | model turn 2 | ... | model turn K

Limits (`rllib_p3o.runner.multiturn`): ``max_turns`` model turns, the config's ``max_tokens`` per turn, and
``max_total_tokens`` for the whole sequence; an episode cut by any of them is *truncated* (counted). An exception
from the user's environment is raised as `MultiTurnEnvError` naming the class and the prompt.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from rllib_p3o.core.columns import KEPT_OVERFLOW, KEPT_PAD, Infos, Record
from rllib_p3o.core.sources import source_id
from rllib_p3o.data import chat, prompt_fit
from rllib_p3o.data.episodes import Turn, completion_episode, multi_turn_episode
from rllib_p3o.data.prompt_schedule import Group, episode_seed
from rllib_p3o.runner.multiturn import MultiTurnEnv, MultiTurnEnvError, check_turn_result, close_env


class Engine(NamedTuple):
    """One engine's part of every prompt group."""

    source: str  # source name (`rllib_p3o.core.sources`)
    llm: Any  # vllm.LLM
    samples: int  # completions (episodes) per prompt
    overrides: Dict[str, Any]  # sampling parameters that differ from the config's
    lora_request: Any = None  # the policy's current adapter under LoRA (vllm.lora.request.LoRARequest)


def kept_sets(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]], requested: int, vocab: Optional[int] = None
) -> Optional[np.ndarray]:
    """Each sampled token's kept set under top-k/top-p, ``[tokens, W]`` int32 (`KEPT_PAD` after it), from vLLM's
    processed log-probs of a request that asked for ``requested`` candidates (``SamplingParams.logprobs``; 0 or
    None: no kept sets, None returned).

    With ``logprobs_mode="processed_logprobs"`` vLLM's candidates are the top ``requested`` tokens of the log-softmax
    of the logits after temperature and the top-k/top-p mask, which are -inf outside the kept set K
    (``vllm.v1.sample.sampler.Sampler.gather_logprobs``). So when ``|K| < requested`` the finite candidates are K
    exactly (the sampled token among them); when ``requested`` or more are finite K may hold more than was returned:
    the token is marked `KEPT_OVERFLOW` (the learner leaves it out of the loss), unless ``requested`` is the engine's
    whole vocabulary ``vocab``."""
    if not requested:
        return None
    whole = vocab is not None and requested >= vocab
    rows = []
    for position in logprobs:
        kept = [t for t, lp in position.items() if math.isfinite(lp.logprob)]
        rows.append(kept if len(kept) < requested or whole else [KEPT_OVERFLOW])
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(token_ids), width), KEPT_PAD, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _vocab(engine: "Engine") -> Optional[int]:
    """The vocabulary size of an engine's model (None: not a vLLM engine, e.g. a test's fake)."""
    config = getattr(getattr(engine.llm, "llm_engine", None), "model_config", None)
    return config.get_vocab_size() if config is not None else None


class _Completion(NamedTuple):
    """One generated completion, before it is scored and turned into an episode."""

    row: int  # index of its prompt row in this sample() call
    prompt_ids: List[int]
    completion_ids: List[int]
    behavior_logprobs: List[float]
    finish_reason: Optional[str]
    text: str
    source: str
    params: Any  # vllm.SamplingParams
    kept_ids: Optional[np.ndarray] = None  # top-k/top-p: each token's kept set (`kept_sets`)
    # In-flight weight updates: each token's weights version, where the completion spans several (else None).
    versions: Optional[np.ndarray] = None


def single_turn_episodes(
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    groups: Sequence[Group],
    engines: Sequence[Engine],
    *,
    sampling_params: Callable[..., Any],
    score: Callable[..., Any],
    names: Sequence[str],
    weights_seq_no: int,
    logprobs_mode: str,
) -> Tuple[List, float]:
    """One 1-step episode per completion of each group (module docstring); returns them and the generate seconds.

    ``score(prompts, completions, rows, completion_ids)`` gives the rewards (`rllib_p3o.data.rewards.Rewards`), one
    column per reward function of ``names``.

    Engine k samples group g with seed ``g.seed + k``: any runner samples the same completions for a group.
    """
    from vllm.inputs import TokensPrompt

    prompt_ids = [prompt_fit.row_prompt_ids(r, lambda p: chat.prompt_token_ids(tokenizer, p)) for r in rows]
    requests = [TokensPrompt(prompt_token_ids=p) for p in prompt_ids]
    completions: List[_Completion] = []
    t_gen = 0.0
    for k, engine in enumerate(engines):
        params = [sampling_params(g.seed + k, n=engine.samples, **engine.overrides) for g in groups]
        t0 = time.perf_counter()
        outputs = engine.llm.generate(requests, params, use_tqdm=False, lora_request=engine.lora_request)
        t_gen += time.perf_counter() - t0
        for i, (pids, out) in enumerate(zip(prompt_ids, outputs)):
            for comp in out.outputs:
                ids = list(comp.token_ids)
                logps = [lp[tid].logprob for tid, lp in zip(ids, comp.logprobs)]
                completions.append(
                    _Completion(
                        row=i,
                        prompt_ids=pids,
                        completion_ids=ids,
                        behavior_logprobs=logps,
                        finish_reason=comp.finish_reason,
                        text=tokenizer.decode(ids, skip_special_tokens=True),
                        source=engine.source,
                        params=params[i],
                        kept_ids=kept_sets(ids, comp.logprobs, params[i].logprobs, _vocab(engine)),
                    )
                )
    episodes = _scored_episodes(
        tokenizer, rows, groups, completions, score=score, names=names, weights_seq_no=weights_seq_no,
        logprobs_mode=logprobs_mode,
    )  # fmt: skip
    return episodes, t_gen


def inflight_episodes(
    tokenizer: Any,
    finished: Sequence[Tuple[Group, Any]],
    rows: Mapping[Group, Mapping[str, Any]],
    engine: Engine,
    *,
    sampling_params: Callable[[Group], Any],
    score: Callable[..., Any],
    names: Sequence[str],
    weights_seq_no: int,
    logprobs_mode: str,
) -> List:
    """Episodes of prompt groups an `rllib_p3o.runner.inflight.InflightEngine` finished (``(group, RequestOutput)``,
    each the group's ``n`` completions, submitted with ``sampling_params(group)``): as `single_turn_episodes`' for
    one engine, with each token's weights version (`rllib_p3o.runner.inflight.token_versions`, ``weights_seq_no``
    where vLLM labelled none). An episode's row version is its oldest token's; the per-token versions ride along only
    where a completion spans several."""
    from rllib_p3o.runner.inflight import token_versions

    groups = [g for g, _ in finished]
    group_rows = [rows[g] for g in groups]
    completions: List[_Completion] = []
    for i, (group, output) in enumerate(finished):
        prompt_ids = list(output.prompt_token_ids)
        params = sampling_params(group)
        for comp in output.outputs:
            ids = list(comp.token_ids)
            versions = token_versions(comp, weights_seq_no)
            completions.append(
                _Completion(
                    row=i,
                    prompt_ids=prompt_ids,
                    completion_ids=ids,
                    behavior_logprobs=[lp[tid].logprob for tid, lp in zip(ids, comp.logprobs)],
                    finish_reason=comp.finish_reason,
                    text=tokenizer.decode(ids, skip_special_tokens=True),
                    source=engine.source,
                    params=params,
                    kept_ids=kept_sets(ids, comp.logprobs, params.logprobs, _vocab(engine)),
                    versions=versions,
                )
            )
    return _scored_episodes(
        tokenizer, group_rows, groups, completions, score=score, names=names, weights_seq_no=weights_seq_no,
        logprobs_mode=logprobs_mode,
    )  # fmt: skip


def _scored_episodes(
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    groups: Sequence[Group],
    completions: Sequence[_Completion],
    *,
    score: Callable[..., Any],
    names: Sequence[str],
    weights_seq_no: int,
    logprobs_mode: str,
) -> List:
    """The reward function's scores of ``completions`` (one call) and one 1-step episode each."""
    scored_rows = [rows[c.row] for c in completions]
    rewards = score(
        [r["prompt"] for r in scored_rows],
        [c.text for c in completions],
        scored_rows,
        [c.completion_ids for c in completions],
    )
    names = list(names)
    episodes = [
        completion_episode(
            prompt_ids=c.prompt_ids,
            completion_ids=c.completion_ids,
            behavior_logprobs=c.behavior_logprobs,
            reward=float(reward),
            weights_seq_no=int(c.versions.min()) if c.versions is not None and len(c.versions) else weights_seq_no,
            group_id=groups[c.row].group_id,
            source_id=source_id(c.source),
            kept_ids=c.kept_ids,
            extras=_version_extras(c.versions),
            infos={
                Infos.PROMPT: chat.prompt_text(tokenizer, rows[c.row]["prompt"]),
                Infos.COMPLETION: c.text,
                Infos.FINISH_REASON: c.finish_reason,
                Infos.SOURCE: c.source,
                Infos.TEMPERATURE: c.params.temperature,
                Infos.TOP_P: c.params.top_p,
                Infos.LOGPROBS_MODE: logprobs_mode,
                Infos.REWARDS: dict(zip(names, by_function.tolist())),
            },
        )
        for c, reward, by_function in zip(completions, rewards.total, rewards.by_function)
    ]
    return episodes


def _version_extras(versions: Optional[np.ndarray]) -> Optional[Dict[str, np.ndarray]]:
    """A completion's per-token versions as episode extras, where it spans more than one (else the row's own)."""
    if versions is None or len(versions) == 0 or int(versions.min()) == int(versions.max()):
        return None
    return {Record.POLICY_VERSION: versions}


@dataclass
class _Live:
    """One episode being played."""

    env: MultiTurnEnv
    group: int  # index of its prompt group in this sample() call
    row: Mapping[str, Any]
    prompt: Any  # what reset() returned
    prompt_ids: List[int]
    ids: List[int]  # the whole sequence so far
    turns: List[Turn] = field(default_factory=list)
    finish_reason: Optional[str] = None
    terminated: bool = False
    truncated: bool = False
    done: bool = False
    seed: int = 0


class MultiTurnRollouts:
    """Plays multi-turn episodes on a runner's engines (module docstring). One instance per runner.

    ``make_env`` builds one environment per episode; ``sampling_params(seed, **overrides)`` gives vLLM sampling
    parameters (the runner's, with its stop tokens: a model turn ends at EOS or at one of them).
    """

    def __init__(
        self,
        *,
        tokenizer: Any,
        make_env: Callable[[], MultiTurnEnv],
        max_turns: int,
        max_tokens: int,
        max_total_tokens: int,
        sampling_params: Callable[..., Any],
    ):
        self.tokenizer = tokenizer
        self.make_env = make_env
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.max_total_tokens = max_total_tokens
        self.sampling_params = sampling_params
        self.templated = chat.has_chat_template(tokenizer)

    def play_groups(
        self,
        rows: Sequence[Mapping[str, Any]],
        groups: Sequence[Group],
        engines: Sequence[Engine],
        *,
        weights_seq_no: int,
        logprobs_mode: str,
    ) -> Tuple[List, float]:
        """Every engine plays its share of each group (engine k: seeds from ``g.seed + k``); returns the episodes and
        the seconds it took."""
        t0 = time.perf_counter()
        episodes = []
        for k, engine in enumerate(engines):
            episodes += self.play(
                rows,
                [g.seed + k for g in groups],
                engine,
                weights_seq_no=weights_seq_no,
                group_ids=[g.group_id for g in groups],
                source_id=source_id(engine.source),
                logprobs_mode=logprobs_mode,
            )
        return episodes, time.perf_counter() - t0

    def play(
        self,
        rows: Sequence[Mapping[str, Any]],
        seeds: Sequence[int],
        engine: Engine,
        *,
        weights_seq_no: int,
        group_ids: Sequence[int],
        source_id: int,
        logprobs_mode: str,
    ) -> List[Any]:
        """Every episode of ``engine`` (``engine.samples`` per row) to its end; returns RLlib episodes."""
        live: List[_Live] = []
        try:
            return self._play(live, rows, seeds, engine, weights_seq_no, group_ids, source_id, logprobs_mode)
        finally:  # every environment's session ends with the call, whatever ended its episode
            for e in live:
                close_env(e.env)

    def _play(
        self,
        live: List[_Live],
        rows: Sequence[Mapping[str, Any]],
        seeds: Sequence[int],
        engine: Engine,
        weights_seq_no: int,
        group_ids: Sequence[int],
        source_id: int,
        logprobs_mode: str,
    ) -> List[Any]:
        self._start_episodes(live, rows, seeds, engine.samples)
        params_used = self._play_turns(live, engine)
        return [
            self._finished_episode(e, engine, params_used, weights_seq_no, group_ids[e.group], source_id, logprobs_mode)
            for e in live
            if e.turns  # none: the prompt alone filled max_total_tokens, nothing to train on
        ]

    def _start_episodes(
        self, live: List[_Live], rows: Sequence[Mapping[str, Any]], seeds: Sequence[int], samples: int
    ) -> None:
        """Reset one environment per episode (``samples`` per row) and add the episode to ``live`` (as soon as it
        exists, so that `play` closes it whatever happens next)."""
        for g, row in enumerate(rows):
            for j in range(samples):
                env = self.make_env()
                prompt = self._call(env, "reset", row, row)
                if chat.is_conversational(prompt) and not self.templated:
                    chat.check_chat_template(self.tokenizer, "the policy")
                ids = chat.prompt_token_ids(self.tokenizer, prompt)
                live.append(
                    _Live(
                        env=env,
                        group=g,
                        row=row,
                        prompt=prompt,
                        prompt_ids=list(ids),
                        ids=list(ids),
                        seed=episode_seed(seeds[g], j),
                    )
                )

    def _play_turns(self, live: List[_Live], engine: Engine) -> Any:
        """Turns of every episode not done yet, one vLLM call per turn, until all have ended or ``max_turns``;
        returns the sampling parameters of the last call (None: no call)."""
        params_used = None
        overrides = dict(engine.overrides)
        max_tokens = int(overrides.pop("max_tokens", self.max_tokens))  # a behavior model's own, per turn
        for turn in range(self.max_turns):
            requests, params = self._turn_requests([e for e in live if not e.done], turn, max_tokens, overrides)
            if not requests:
                break
            self._play_turn(engine, requests, params, last_turn=turn == self.max_turns - 1)
            params_used = params[0]
        return params_used

    def _turn_requests(
        self, active: List[_Live], turn: int, max_tokens: int, overrides: Dict[str, Any]
    ) -> Tuple[List[Tuple[_Live, Any]], List[Any]]:
        """The vLLM request (the episode's ids so far) and sampling parameters of each active episode's next model
        turn; an episode without token budget left ends here, truncated."""
        from vllm.inputs import TokensPrompt

        requests, params = [], []
        for e in active:
            budget = min(max_tokens, self.max_total_tokens - len(e.ids))
            if budget <= 0:
                e.truncated = e.done = True
                continue
            requests.append((e, TokensPrompt(prompt_token_ids=list(e.ids))))
            params.append(self.sampling_params((e.seed + turn) % (2**31), n=1, max_tokens=budget, **overrides))
        return requests, params

    def _play_turn(self, engine: Engine, requests: List[Tuple[_Live, Any]], params: List[Any], last_turn: bool) -> None:
        """One turn of the requesting episodes: one vLLM call for their model turns, then the environments' turns.
        Every episode's model turn first, each environment told of it (`MultiTurnEnv.prepare_step`: tool calls
        start), then the environments' answers: the turn's tool calls run at once."""
        outputs = engine.llm.generate(
            [r for _, r in requests], params, use_tqdm=False, lora_request=engine.lora_request
        )
        turns = [
            self._model_turn(e, out.outputs[0], p.logprobs, _vocab(engine))
            for (e, _), out, p in zip(requests, outputs, params)
        ]
        for (e, _), out, model_turn in zip(requests, outputs, turns):
            self._env_turn(e, out.outputs[0], model_turn, last_turn=last_turn)

    def _finished_episode(
        self,
        e: _Live,
        engine: Engine,
        params_used: Any,
        weights_seq_no: int,
        group_id: int,
        source_id: int,
        logprobs_mode: str,
    ) -> Any:
        """A played episode as an RLlib episode (`rllib_p3o.data.episodes.multi_turn_episode`), its texts, sampling
        parameters, turn counts and the environment's metrics and rewards in the infos."""
        info = {
            Infos.PROMPT: chat.prompt_text(self.tokenizer, e.prompt),
            Infos.COMPLETION: self.tokenizer.decode(e.ids[len(e.prompt_ids) :], skip_special_tokens=False),
            Infos.FINISH_REASON: e.finish_reason,
            Infos.SOURCE: engine.source,
            Infos.TEMPERATURE: getattr(params_used, "temperature", None),
            Infos.TOP_P: getattr(params_used, "top_p", None),
            Infos.LOGPROBS_MODE: logprobs_mode,
            Infos.TURNS: len(e.turns),
            Infos.TRUNCATED: bool(e.truncated and not e.terminated),
            **e.env.metrics(),
        }
        by_function = e.env.rewards_by_function()
        if by_function:
            info[Infos.REWARDS] = dict(by_function)
        return multi_turn_episode(
            prompt_ids=e.prompt_ids,
            turns=e.turns,
            terminated=e.terminated,
            weights_seq_no=weights_seq_no,
            group_id=group_id,
            source_id=source_id,
            infos=info,
        )

    def _model_turn(
        self, e: _Live, completion: Any, requested: Optional[int] = None, vocab: Optional[int] = None
    ) -> Tuple[Any, ...]:
        """Append a model turn to the episode and hand its text to the environment's `prepare_step`; returns the
        turn's ids, their behavior log-probs, its text and its kept sets (`kept_sets`; None: untruncated)."""
        action = list(completion.token_ids)
        logps = [lp[t].logprob for t, lp in zip(action, completion.logprobs)]
        e.ids += action
        e.finish_reason = completion.finish_reason
        text = self.tokenizer.decode(action, skip_special_tokens=True)
        self._call(e.env, "prepare_step", {"role": "assistant", "content": text}, e.row)
        return action, logps, text, kept_sets(action, completion.logprobs, requested, vocab)

    def _env_turn(self, e: _Live, completion: Any, model_turn: Tuple[Any, ...], last_turn: bool) -> None:
        """Let the environment answer the model turn and append its turn (or end the episode)."""
        action, logps, text, kept = model_turn
        result = check_turn_result(self._call(e.env, "step", {"role": "assistant", "content": text}, e.row), e.env)
        e.terminated = bool(result.terminated)
        e.truncated = bool(result.truncated) or (
            not e.terminated and (completion.finish_reason == "length" or last_turn)
        )
        env_ids: List[int] = []
        if not (e.terminated or e.truncated):
            env_ids = self._env_ids(e.env, result.messages, action[-1] if action else None)
            if len(e.ids) + len(env_ids) >= self.max_total_tokens:
                e.truncated, env_ids = True, []
        e.turns.append(
            Turn(action_ids=action, behavior_logprobs=logps, reward=result.reward, env_ids=env_ids, kept_ids=kept)
        )
        e.ids += env_ids
        e.done = e.terminated or e.truncated

    def _env_ids(self, env: MultiTurnEnv, messages: Any, after_token: Optional[int]) -> List[int]:
        if isinstance(messages, str):
            return chat.text_turn_ids(self.tokenizer, messages)
        if self.templated:
            return chat.env_turn_ids(self.tokenizer, messages, after_token)
        return chat.text_turn_ids(self.tokenizer, env.render_text(list(messages)))

    @staticmethod
    def _call(env: MultiTurnEnv, method: str, arg: Any, row: Mapping[str, Any]) -> Any:
        try:
            return getattr(env, method)(arg)
        except MultiTurnEnvError:
            raise
        except Exception as e:
            raise MultiTurnEnvError(
                f"{type(env).__name__}.{method} raised {type(e).__name__}: {e} (prompt {row.get('prompt')!r:.200})"
            ) from e


def turn_metrics(episodes: Sequence[Any]) -> Dict[str, float]:
    """Per-episode means of a sample's multi-turn episodes: turns, truncations and the environments' counters."""
    infos = [ep.get_infos(-1) for ep in episodes]
    if not infos:
        return {}
    keys = {k for i in infos for k, v in i.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    keys -= {Infos.TEMPERATURE, Infos.TOP_P}
    out = {k: sum(float(i.get(k, 0.0)) for i in infos) / len(infos) for k in keys}
    out[Infos.TRUNCATED] = sum(bool(i.get(Infos.TRUNCATED)) for i in infos) / len(infos)
    return out
