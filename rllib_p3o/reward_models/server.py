"""Reward models served by Ray actors: ``env_config["reward_models"]``, scored beside the rule-based reward functions.

``reward_models=[{"model": path, "kind": "classifier", ...}]``: each entry is one model, loaded once in an actor of
its own (`RewardModelServer`, started by the driver with the entry's ``num_cpus``/``num_gpus``,
`rllib_p3o.reward_models.actors`). Each runner holds a `RewardModelClient` per entry: a reward function with TRL's
signature that sends a sampling step's whole batch to the actor in one call and waits at most ``timeout_s``. The
clients join the ``reward_fn`` functions in one `rllib_p3o.data.rewards.RewardFunction`, after them, so that
``reward_weights`` has one weight per function and then one per reward model, and each model's score is logged
under its name as every reward function's is (``p3o/rewards/<name>``).

A dead actor or one that does not answer in time is a `RewardModelError` that names the model and what to do.

Kinds:
- ``"classifier"``: a sequence classifier (``AutoModelForSequenceClassification``). The text it reads is the prompt
  followed by the completion: for conversational prompts the messages rendered with the reward model's own chat
  template (its tokenizer's), else the two strings joined. The score is the logit of ``label`` (an index or a name
  of the model's ``id2label``; default the last label, the only one of a one-logit reward model), or with
  ``score="sigmoid"`` its sigmoid, or with ``score="softmax"`` its probability among the labels.
- ``"judge"``: a generative model served by a vLLM engine in the actor, asked a yes/no question about each
  completion: ``template`` (default `JUDGE_TEMPLATE`) filled with ``{prompt}`` and ``{completion}`` (as text), sent
  through the judge's chat template as a user message when it has one. The score is the probability that the next
  token is ``yes`` rather than ``no`` (each must be one token of the judge's tokenizer): ``p(yes) / (p(yes) +
  p(no))``, from the engine's log-probs of exactly these two tokens, in [0, 1]. ``vllm_kwargs`` go to the engine.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from rllib_p3o.core import quiet
from rllib_p3o.core.cpu_threads import fitting_threads

# The key under which the driver gives the runners its actors' names (one per spec, in order); set by `P3O.setup`.
ACTORS_KEY = "reward_model_actors"
KINDS = ("classifier", "judge")
SCORES = ("logit", "sigmoid", "softmax")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Each spec key with its default (None: required, or read from the model).
SPEC_DEFAULTS: Dict[str, Any] = {
    "model": None,
    "kind": "classifier",
    "name": None,  # metric name; default the model directory's name
    "label": None,
    "score": "logit",
    "num_cpus": 1.0,
    "num_gpus": 0.0,
    "timeout_s": 120.0,  # one scoring call, queueing behind other runners' calls included
    "startup_timeout_s": 600.0,  # the actor's start: scheduling and loading the model
    "batch_size": 16,  # rows per forward pass inside the actor
    "max_length": None,  # tokens per text, truncated from the left (the completion's end is kept)
    "dtype": "auto",
    "trust_remote_code": False,
    # judge only
    "template": None,  # default JUDGE_TEMPLATE
    "yes": "yes",
    "no": "no",
    "vllm_kwargs": None,
}
CLASSIFIER_ONLY = ("label", "score")
JUDGE_ONLY = ("template", "yes", "no", "vllm_kwargs")
JUDGE_TEMPLATE = "Question: {prompt}\nAnswer: {completion}\nIs the answer correct? Reply yes or no."
# A CPU judge engine's KV cache (vLLM's default claims most of the host's memory).
CPU_JUDGE_KV_CACHE_BYTES = 256 << 20


class RewardModelError(RuntimeError):
    """A reward model's actor died, did not answer in time, or refused its inputs; the message names the model."""


def reward_model_specs(env_config: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """``env_config["reward_models"]`` checked and completed with the defaults (`SPEC_DEFAULTS`), or ``[]``.

    Raises ValueError naming the entry and the key: unknown keys, a missing ``model``, an unknown ``kind`` or
    ``score``, resources or timeouts that are not positive, and ``kind="judge"`` (`JUDGE_UNAVAILABLE`)."""
    given = env_config.get("reward_models")
    if given is None:
        return []
    if isinstance(given, Mapping):
        given = [given]
    if not isinstance(given, (list, tuple)):
        raise ValueError(f"reward_models must be a list of dicts ({{'model': path, ...}}), got {given!r:.200}")
    specs = []
    for i, entry in enumerate(given):
        where = f"reward_models[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a dict with 'model' (a path), got {entry!r:.200}")
        unknown = sorted(set(entry) - set(SPEC_DEFAULTS))
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {unknown}; a reward model takes {sorted(SPEC_DEFAULTS)}")
        spec = {**SPEC_DEFAULTS, **entry}
        if not spec["model"] or not isinstance(spec["model"], str):
            raise ValueError(f"{where} needs 'model': the path of a model directory")
        if spec["kind"] not in KINDS:
            raise ValueError(f"{where}['kind']={spec['kind']!r} is not one of {KINDS}")
        wrong = [k for k in (JUDGE_ONLY if spec["kind"] == "classifier" else CLASSIFIER_ONLY) if k in entry]
        if wrong:
            raise ValueError(f"{where}: {wrong} do not apply to kind={spec['kind']!r}")
        if spec["kind"] == "judge":
            template = spec["template"] or JUDGE_TEMPLATE
            if not isinstance(template, str) or "{completion}" not in template:
                raise ValueError(f"{where}['template'] must be a string with {{completion}} (and {{prompt}})")
            try:
                template.format(prompt="", completion="")
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(f"{where}['template'] takes only {{prompt}} and {{completion}}: {e!r}") from None
            spec["template"] = template
        if spec["score"] not in SCORES:
            raise ValueError(f"{where}['score']={spec['score']!r} is not one of {SCORES}")
        if spec["dtype"] not in DTYPES:
            raise ValueError(f"{where}['dtype']={spec['dtype']!r} is not one of {DTYPES}")
        for key in ("num_cpus", "num_gpus"):
            if not isinstance(spec[key], (int, float)) or spec[key] < 0:
                raise ValueError(f"{where}['{key}'] must be a number >= 0, got {spec[key]!r}")
        for key in ("timeout_s", "startup_timeout_s", "batch_size"):
            if not isinstance(spec[key], (int, float)) or not spec[key] > 0:
                raise ValueError(f"{where}['{key}'] must be a number > 0, got {spec[key]!r}")
        if spec["max_length"] is not None and (not isinstance(spec["max_length"], int) or spec["max_length"] < 1):
            raise ValueError(f"{where}['max_length'] must be a positive integer or None, got {spec['max_length']!r}")
        if spec["name"] is None:
            spec["name"] = re.sub(r"\W+", "_", os.path.basename(os.path.normpath(spec["model"]))) or "reward_model"
        specs.append(spec)
    return specs


class RewardModelClient:
    """A reward model as a reward function (TRL's signature): the batch goes to its actor in one call.

    ``actor_name``: the named actor the driver started for this spec (None outside a P3O run: calling it then is
    an error). The actor is looked up on the first call, in the runner's Ray job (the driver's namespace).
    """

    def __init__(self, spec: Mapping[str, Any], actor_name: Optional[str] = None):
        self.spec = dict(spec)
        self.actor_name = actor_name
        self.__name__ = self.__qualname__ = str(spec["name"])
        self._actor = None

    def _describe(self) -> str:
        return f"reward model {self.spec['name']!r} ({self.spec['kind']}, {self.spec['model']})"

    def _handle(self):
        import ray

        if self._actor is None:
            if self.actor_name is None:
                raise RewardModelError(
                    f"{self._describe()} has no actor: reward models are served by the actors P3O starts at setup "
                    "(env_config['reward_models'] in a P3OConfig); outside a P3O run, score with a reward function."
                )
            try:
                self._actor = ray.get_actor(self.actor_name)
            except ValueError as e:
                raise RewardModelError(
                    f"{self._describe()}: its actor {self.actor_name!r} is gone ({e}). It stops with the algorithm "
                    "that started it; a runner of another algorithm cannot use it."
                ) from e
        return self._actor

    def __call__(self, prompts: List[Any], completions: List[Any], **_: Any) -> List[float]:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        timeout = float(self.spec["timeout_s"])
        ref = self._handle().score.remote(list(prompts), list(completions))
        try:
            return ray.get(ref, timeout=timeout)
        except GetTimeoutError as e:
            ray.cancel(ref)
            raise RewardModelError(
                f"{self._describe()} did not score {len(prompts)} completions within timeout_s={timeout:g}. Its actor "
                "is alive but busy or slow (every runner's batch queues on it): raise its 'timeout_s', give it more "
                "'num_cpus' or a GPU ('num_gpus'), or start fewer runners."
            ) from e
        except RayActorError as e:
            raise RewardModelError(
                f"{self._describe()}: its actor died ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                "The run cannot score without it: look at the actor's log (out of memory is the usual cause: give "
                "it more memory or a smaller 'batch_size'), then restart from the latest checkpoint."
            ) from e


def clients(env_config: Mapping[str, Any]) -> List[RewardModelClient]:
    """A `RewardModelClient` per ``env_config["reward_models"]`` entry, bound to the driver's actors when the config
    names them (``ACTORS_KEY``, set by `P3O.setup`)."""
    specs = reward_model_specs(env_config)
    names = list(env_config.get(ACTORS_KEY) or [])
    if names and len(names) != len(specs):
        raise ValueError(f"env_config[{ACTORS_KEY!r}] names {len(names)} actors for {len(specs)} reward models")
    return [RewardModelClient(spec, names[i] if names else None) for i, spec in enumerate(specs)]


def reward_model_text(prompt: Any, completion: Any, tokenizer: Any) -> str:
    """What the reward model reads: prompt then completion, as one text (chat messages through the reward model's
    chat template when it has one, else each message's content on a line of its own)."""
    if isinstance(prompt, str) and isinstance(completion, str):
        return prompt + completion
    messages = [*_as_messages(prompt, "user"), *_as_messages(completion, "assistant")]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n".join(str(m.get("content", "")) for m in messages)


def _as_messages(part: Any, role: str) -> List[Mapping[str, Any]]:
    return [{"role": role, "content": part}] if isinstance(part, str) else list(part)


def judge_text(prompt: Any, completion: Any, template: str, tokenizer: Any) -> str:
    """The judge's input: ``template`` with the prompt and completion as text, as a user message through the judge's
    chat template (generation prompt added) when it has one."""
    question = template.format(prompt=_plain(prompt), completion=_plain(completion))
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
    return question


def _plain(part: Any) -> str:
    if isinstance(part, str):
        return part
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in part)


def single_token(tokenizer: Any, text: str, what: str) -> int:
    """The id of ``text`` as one token of ``tokenizer``, else `RewardModelError` naming ``what``."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise RewardModelError(
            f"{what}={text!r} is {len(ids)} tokens of the judge's tokenizer ({ids}); give a string that is one token"
        )
    return int(ids[0])


class RewardModelServer:
    """Runs in the reward model's actor: the model loaded once, batches scored (see the module's kinds)."""

    def __init__(self, spec: Mapping[str, Any]):
        import torch

        self.spec = dict(spec)
        threads = fitting_threads(math.ceil(self.spec["num_cpus"]))  # no more than the cores (`core.cpu_threads`)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
        if self.spec["kind"] == "judge":
            self._load_judge()
        else:
            self._load_classifier()

    def _load_judge(self) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this actor's process
        from transformers import AutoConfig, AutoTokenizer
        from vllm import LLM
        from vllm.platforms import current_platform

        spec = self.spec
        remote = bool(spec["trust_remote_code"])
        self.tokenizer = AutoTokenizer.from_pretrained(spec["model"], trust_remote_code=remote)
        name = spec["name"]
        self.answer_ids = [
            single_token(self.tokenizer, spec["yes"], f"reward model {name!r}: yes"),
            single_token(self.tokenizer, spec["no"], f"reward model {name!r}: no"),
        ]
        context = getattr(
            AutoConfig.from_pretrained(spec["model"], trust_remote_code=remote), "max_position_embeddings", None
        )
        self.max_length = (
            min(x for x in (spec["max_length"], context) if x) if (spec["max_length"] or context) else None
        )
        kwargs: Dict[str, Any] = dict(
            model=spec["model"],
            dtype=spec["dtype"],
            trust_remote_code=remote,
            seed=0,
            generation_config="vllm",
            max_model_len=self.max_length,
            use_tqdm_on_load=quiet.verbose(),  # the checkpoint-loading bar, unless RLLIB_P3O_VERBOSE
        )
        if current_platform.is_cpu():  # as the runners' engines (`rllib_p3o.runner.vllm_engine.make_engine`)
            kwargs.update(
                enforce_eager=True, kv_cache_memory_bytes=CPU_JUDGE_KV_CACHE_BYTES, enable_chunked_prefill=False
            )
        kwargs.update(spec["vllm_kwargs"] or {})
        self.llm = LLM(**kwargs)
        self.label, self.device = spec["yes"], "cuda" if spec["num_gpus"] > 0 else "cpu"
        self.num_labels = 2

    def _score_judge(self, prompts: Sequence[Any], completions: Sequence[Any]) -> List[float]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        yes, no = self.answer_ids
        requests = []
        for p, c in zip(prompts, completions):
            ids = self.tokenizer.encode(
                judge_text(p, c, self.spec["template"], self.tokenizer), add_special_tokens=False
            )
            if self.max_length is not None:
                ids = ids[-(self.max_length - 1) :]  # the question's end is kept
            requests.append(TokensPrompt(prompt_token_ids=ids))
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=[yes, no], detokenize=False)
        out = []
        for o in self.llm.generate(requests, params, use_tqdm=False):
            logprobs = o.outputs[0].logprobs[0]
            lp_yes, lp_no = logprobs[yes].logprob, logprobs[no].logprob
            out.append(1.0 / (1.0 + math.exp(lp_no - lp_yes)))
        return out

    def _load_classifier(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        remote = bool(self.spec["trust_remote_code"])
        self.tokenizer = AutoTokenizer.from_pretrained(self.spec["model"], trust_remote_code=remote)
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = self.spec["dtype"]
        self.model = AutoModelForSequenceClassification.from_pretrained(
            self.spec["model"],
            dtype=dtype if dtype == "auto" else getattr(torch, dtype),
            trust_remote_code=remote,
        ).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device = "cuda" if self.spec["num_gpus"] > 0 and torch.cuda.is_available() else "cpu"
        self.model.to(self.device)
        self.label = _label_index(self.spec["label"], self.model.config, self.spec["name"])
        self.num_labels = int(self.model.config.num_labels)
        limits = [self.spec["max_length"], getattr(self.model.config, "max_position_embeddings", None)]
        self.max_length = min(x for x in limits if x) if any(limits) else None

    def ready(self) -> Dict[str, Any]:
        """What was loaded: the label scored (a judge's: its yes) and the number of labels (the driver waits on this
        at start)."""
        return {"label": self.label, "num_labels": self.num_labels, "device": self.device}

    def score(self, prompts: Sequence[Any], completions: Sequence[Any]) -> List[float]:
        """One score per completion (see the module's kinds)."""
        import torch

        if len(prompts) != len(completions):
            raise RewardModelError(f"{len(prompts)} prompts for {len(completions)} completions")
        if self.spec["kind"] == "judge":
            return self._score_judge(prompts, completions)
        texts = [reward_model_text(p, c, self.tokenizer) for p, c in zip(prompts, completions)]
        out: List[float] = []
        size = int(self.spec["batch_size"])
        with torch.inference_mode():
            for start in range(0, len(texts), size):
                enc = self.tokenizer(
                    texts[start : start + size],
                    return_tensors="pt",
                    padding=True,
                    truncation=self.max_length is not None,
                    max_length=self.max_length,
                ).to(self.device)
                logits = self.model(**enc).logits.float()
                out.extend(_transform(logits, self.label, self.spec["score"]).tolist())
        return out


def _label_index(label: Any, config: Any, name: str) -> int:
    n = int(config.num_labels)
    if label is None:
        return n - 1
    if isinstance(label, str):
        by_name = {str(v): int(k) for k, v in (config.id2label or {}).items()}
        if label not in by_name:
            raise RewardModelError(f"reward model {name!r}: label {label!r} is not one of its labels {sorted(by_name)}")
        return by_name[label]
    if not isinstance(label, int) or not 0 <= label < n:
        raise RewardModelError(f"reward model {name!r}: label {label!r} is not an index below num_labels={n}")
    return label


def _transform(logits: Any, label: int, score: str) -> Any:
    import torch

    if score == "softmax":
        return torch.softmax(logits, dim=-1)[:, label]
    if score == "sigmoid":
        return torch.sigmoid(logits[:, label])
    return logits[:, label]
