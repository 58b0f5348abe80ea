"""Train on collab_env envs with TRL's ``GRPOTrainer`` (installed as ``collab_env.adapters.trl``).

Two routes, both thin layers over the one episode driver (:func:`collab_env.rollout.arun_episode`
and :func:`~collab_env.rollout.advance`):

``rollout_func`` (multi-turn GRPO on whole episodes)::

    from trl import GRPOConfig, GRPOTrainer
    from collab_env.adapters import trl as ce_trl

    trainer = GRPOTrainer(model, reward_funcs=ce_trl.episode_reward,
                          train_dataset=ce_trl.dataset("hidden-facts", n=64),
                          rollout_func=ce_trl.rollout_func("hidden-facts"),
                          args=GRPOConfig(num_generations=4, max_completion_length=128))

    TRL 1.16 calls ``rollout_func(prompts, trainer)`` with the prompts of the batch, each already
    repeated ``num_generations`` times. For every prompt received the function plays one episode
    (all of a batch concurrently, so the trained model's calls are batched) with the trainer's
    model as the trained player and every other player through its own policy, and returns one
    sequence per prompt: ``prompt_ids`` (the player's first prompt), ``completion_ids`` (its
    turns and everything between them), ``logprobs`` and ``env_mask`` (1 on the tokens the model
    wrote, 0 on user and env tokens: TRL's loss mask), from
    :func:`collab_env.rollout.token_transcript`. Extra keys reach the reward functions as
    keywords: ``episode_reward`` (the trained player's return), ``reward_components``,
    ``mr`` (the multiturn-aware reward's details of each rewarded turn, ``[]`` without one),
    ``end_reason``, ``num_turns``, ``index`` and ``seed``. :func:`episode_reward` is a ready reward
    function that returns ``episode_reward``.

    TRL passes ``rollout_func`` only the prompts, not the other dataset columns. So the dataset
    built by :func:`dataset` tags the first message of each prompt with the item it came from
    (key :data:`TAG`: ``{"index": i, "seed": s}``); the rollout function resets the env with that
    item and seed. A prompt without the tag is an error that names :func:`dataset`.

    Generation. The trained player's prompts are its exact token history (token in, token out):
    the first prompt is the chat template of its first observation; each later prompt is the
    previous prompt, the ids the model generated, the template's end-of-turn tokens and the
    other players' new messages rendered by the chat template. So the episode is one token
    sequence whose model tokens are exactly the generated ids (what ``env_mask`` marks), with no
    re-tokenisation of the model's own text. Without vLLM the model is the trainer's model,
    sampled with ``temperature``, ``top_p``, ``top_k`` and, per turn, ``max_completion_length``
    (or ``max_turn_tokens``) of the trainer's config; with ``use_vllm=True`` the trainer's
    ``vllm_generation.generate`` serves the token ids (TRL's own sampling settings apply). The
    vLLM route is tested here against a stand-in that serves a tiny model's tokens; real vLLM
    needs a GPU, and in TRL's server mode every process must make the same number of calls
    (episodes of one batch may differ in turns), so use it with one training process.

``environment_factory`` (TRL's tool route)::

    trainer = GRPOTrainer(model, train_dataset=ce_trl.dataset("hidden-facts", n=64),
                          environment_factory=ce_trl.environment_factory("hidden-facts"), ...)

    :class:`CollabToolEnv` is the env as a tool: ``reset(**row)`` starts the row's item;
    ``send_message(message)`` is the one tool (the player's move; it returns what the other
    players said until the player is on turn again); ``get_reward()`` is the player's return so
    far. It is the single-agent view (:class:`~collab_env.wrappers.single_agent.SingleAgentEnv`)
    behind TRL's tool calling, which needs a chat template that supports tools.

Importing this module needs ``trl`` (``pip install 'collab_env[trl]'``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collab_env.errors import ConfigError, PolicyError, require

require("trl", "trl", "collab_env.adapters.trl")

from collab_env.policy import SamplingParams, bind_learner, policies_for  # noqa: E402
from collab_env.rollout import advance, arun_episode, check_policies, token_transcript  # noqa: E402
from collab_env.types import Completion, Conversation, Episode  # noqa: E402
from collab_env.wrappers.base import EnvWrapper  # noqa: E402

__all__ = [
    "TAG",
    "rollout_func",
    "RolloutFunc",
    "episode_reward",
    "dataset",
    "dataset_rows",
    "item_of",
    "TrainerGenerator",
    "VLLMGenerationGenerator",
    "TranscriptPolicy",
    "ChatPolicy",
    "EpisodeRecorder",
    "episode_output",
    "CollabToolEnv",
    "environment_factory",
]

#: The key of the first prompt message that names the task item: ``{"index": i, "seed": s}``.
TAG = "collab_env"


# ---------------------------------------------------------------------------------------------
# Envs and items
# ---------------------------------------------------------------------------------------------
def _env_builder(env_id_or_factory: Any, split: str | None, env_kwargs: Mapping[str, Any] | None) -> Callable[[], Any]:
    """A zero-argument function that builds a fresh env."""
    kwargs = dict(env_kwargs or {})
    if isinstance(env_id_or_factory, str):
        import collab_env

        if split is not None:
            kwargs["split"] = split
        return functools.partial(collab_env.make, env_id_or_factory, **kwargs)
    if callable(env_id_or_factory):
        if split is not None or kwargs:
            raise ConfigError("split= and env_kwargs= apply to a registered env id; a factory builds its env "
                              "itself (pass them to it).")
        return env_id_or_factory
    raise ConfigError(f"env must be a registered env id or a zero-argument function that builds an env, "
                      f"got {type(env_id_or_factory).__name__}.")


def _trained_player(env: Any, player: str | None) -> str:
    trainable = [p for p in env.possible_agents if env.unwrapped.task.is_trainable(p)]
    if player is None:
        if len(trainable) != 1:
            raise ConfigError(f"this env has trainable players {trainable}: pass player= (one of them).")
        return trainable[0]
    if player not in env.possible_agents:
        raise ConfigError(f"player={player!r} is not a player of this env; players: {list(env.possible_agents)}.")
    return player


def _other_policies(env: Any, player: str, policies: Mapping[str, Any] | None) -> dict[str, Any]:
    chosen = policies_for(env.spec, policies)
    if player in (policies or {}):
        raise ConfigError(f"{player!r} is the trained player (played by the trainer's model); do not give it a "
                          "policy.")
    chosen.pop(player, None)
    return check_policies(env, chosen, [p for p in env.possible_agents if p != player])


def item_of(prompt: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """``(index, seed)`` of a prompt built by :func:`dataset` (read from its first message's
    :data:`TAG`).

    Raises:
        ConfigError: The prompt carries no tag (it was not built by :func:`dataset`).
    """
    tag = None
    if isinstance(prompt, Sequence) and not isinstance(prompt, str) and prompt:
        first = prompt[0]
        tag = first.get(TAG) if isinstance(first, Mapping) else None
    if isinstance(tag, str):
        tag = json.loads(tag)
    if not isinstance(tag, Mapping) or "index" not in tag or "seed" not in tag:
        raise ConfigError(
            "a prompt given to the rollout function does not say which task item it is (its first message has "
            f"no {TAG!r} key); build the training dataset with collab_env.adapters.trl.dataset(...)."
        )
    return int(tag["index"]), int(tag["seed"])


def dataset_rows(env_id_or_factory: Any, *, split: str | None = None, n: int | None = None, seed: int = 0,
                 player: str | None = None, policies: Mapping[str, Any] | None = None,
                 env_kwargs: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows of :func:`dataset` as a list of dicts (no ``datasets`` needed)."""
    from collab_env._async import run_sync

    build = _env_builder(env_id_or_factory, split, env_kwargs)
    env = build()
    player = _trained_player(env, player)
    others = _other_policies(env, player, policies)
    total = env.unwrapped.task.num_items()
    if n is None:
        if total is None:
            raise ConfigError("this env generates unlimited items: pass n= (rows to build).")
        n = total
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"n must be an int >= 1, got {n!r}.")
    if total is not None and n > total:
        raise ConfigError(f"n={n} but the split has {total} items.")

    async def first_prompt(i: int) -> dict[str, Any]:
        s = seed + i
        obs, infos = await env.areset(seed=s, options={"index": i})
        # Let the other players act until the trained player is on turn: the driver.
        run = await advance(env, others, obs=obs, infos=infos, until=(player,), seed=lambda k: s + k)
        if run.done:
            raise ConfigError(f"item {i}: the episode ended before {player!r} was on turn; nothing to train on.")
        chat = [dict(m) for m in run.obs[player].to_chat()]
        chat[0][TAG] = json.dumps({"index": i, "seed": s})
        return {"prompt": chat, "index": i, "seed": s}

    return [run_sync(first_prompt(i)) for i in range(n)]


def dataset(env_id_or_factory: Any, *, split: str | None = None, n: int | None = None, seed: int = 0,
            player: str | None = None, policies: Mapping[str, Any] | None = None,
            env_kwargs: Mapping[str, Any] | None = None):
    """A ``datasets.Dataset`` with one row per task item, for ``GRPOTrainer(train_dataset=...)``.

    Columns: ``prompt`` (the trained player's first observation as chat messages; the first
    message carries :data:`TAG`, ``'{"index": i, "seed": s}'``, which the rollout function reads),
    ``index`` and ``seed`` (reward functions receive them as keywords).

    Args:
        env_id_or_factory: A registered env id, or a zero-argument function that builds an env.
        split: The env's split (``split=`` of :func:`collab_env.make`).
        n: Rows (items ``0..n-1``); default: every item of the split (required for a generated
            suite).
        seed: Row ``i`` resets the env with seed ``seed + i``.
        player: The trained player (default: the env's only trainable player).
        policies: Player -> policy for the other players (default: the spec's defaults); they
            act before the trained player's first turn when it does not open the episode.
        env_kwargs: Keywords of :func:`collab_env.make` (``reward="mr"``, ``reward_kwargs``...).
    """
    datasets = require("datasets", "trl", "collab_env.adapters.trl.dataset")
    return datasets.Dataset.from_list(dataset_rows(env_id_or_factory, split=split, n=n, seed=seed, player=player,
                                                   policies=policies, env_kwargs=env_kwargs))


# ---------------------------------------------------------------------------------------------
# The trained model as a token generator
# ---------------------------------------------------------------------------------------------
class VLLMGenerationGenerator:
    """TRL's vLLM (``trainer.vllm_generation``) as a batched token generator: one
    ``generate(prompts=ids, images=None, num_generations=1)`` call per batch, TRL's sampling
    settings (``params`` other than the batch are not TRL's to change). The log-prob of each
    token is vLLM's (top-1 entry, the sampled token)."""

    flush = "idle"
    idle_passes = 64

    def __init__(self, vllm_generation: Any, tokenizer: Any, eos_token_ids: Sequence[int], *,
                 max_batch_size: int = 256, max_wait_ms: float = 50.0) -> None:
        self.vllm_generation = vllm_generation
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms
        self.name = "trl-vllm"

    def generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                       seeds: Sequence[int]) -> list[Completion]:
        """One completion per prompt from one vLLM call (blocking)."""
        _, ids, logprobs, _ = self.vllm_generation.generate(
            prompts=[list(p) for p in prompts], images=None, num_generations=1)
        if len(ids) != len(prompts):
            raise PolicyError(f"vLLM returned {len(ids)} completions for {len(prompts)} prompts.")
        out = []
        for p, c, lp in zip(prompts, ids, logprobs, strict=True):
            c = [int(t) for t in c]
            lps = [float("nan") if x is None else float(x[0] if isinstance(x, (list, tuple)) else x) for x in lp]
            done = bool(c) and c[-1] in self.eos_token_ids
            out.append(Completion(text=self.tokenizer.decode(c, skip_special_tokens=True), token_ids=c, logprobs=lps,
                                  prompt_token_ids=list(p), finish_reason="stop" if done else "length",
                                  usage={"model_calls": 1, "prompt_tokens": len(p), "completion_tokens": len(c)}))
        return out


class TrainerGenerator:
    """The trainer's model as a token generator with a micro-batching queue: the concurrent
    requests of every episode of a batch (and of the multiturn-aware reward's futures) are
    merged into one model call per round.

    Args:
        backend: What generates: an :class:`~collab_env.agents.hf.HFPolicy` over the trainer's
            model, or a :class:`VLLMGenerationGenerator`.
        tokenizer: The trainer's tokenizer (its chat template renders the observations).
        params: Sampling settings of the trained player's turns.
    """

    def __init__(self, backend: Any, tokenizer: Any, params: SamplingParams) -> None:
        from collab_env.agents.hf_batching import LoopBatchers

        self.backend = backend
        self.tokenizer = tokenizer
        self.params = params
        self.eos_token_ids = tuple(backend.eos_token_ids)
        self._queues = LoopBatchers(backend)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> Completion:
        """One completion of ``prompt_ids``; the row's seed comes from torch's global generator,
        so ``transformers.set_seed`` (TRL's ``seed``) makes runs repeatable."""
        import torch

        seed = int(torch.randint(0, 2**62, (1,)).item())
        return await self._queues.current().submit([int(t) for t in prompt_ids], params or self.params, seed)

    def prompt_ids(self, chat: Sequence[Mapping[str, Any]], *, generation_prompt: bool = True) -> list[int]:
        """The chat template's ids of ``chat`` (no special tokens added: the template writes them)."""
        return _render_ids(self.tokenizer, _render(self.tokenizer, chat, generation_prompt))


def _clean_chat(chat: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"]} for m in chat]


def _render(tokenizer: Any, chat: Sequence[Mapping[str, Any]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(_clean_chat(chat), tokenize=False, add_generation_prompt=generation_prompt)


def _render_ids(tokenizer: Any, text: str) -> list[int]:
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


class ChatPolicy:
    """A stateless :class:`~collab_env.policy.Policy` over a :class:`TrainerGenerator`: each
    observation rendered by the chat template (what the multiturn-aware reward's futures use
    when their assistant is :data:`~collab_env.policy.LEARNER`)."""

    def __init__(self, generator: TrainerGenerator) -> None:
        self.generator = generator
        self.name = f"trl-model({generator.backend.name})"

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        sampling.pop("seed", None)  # the row seeds come from the trainer's generator
        params = SamplingParams.from_kwargs(**{**_params_dict(self.generator.params), **sampling})
        return list(await asyncio.gather(*(self.generator.generate(self.generator.prompt_ids(o.to_chat()), params)
                                           for o in observations)))


def _params_dict(p: SamplingParams) -> dict[str, Any]:
    return {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "max_new_tokens": p.max_new_tokens,
            "stop": p.stop}


_SENTINEL = "\x1fCOLLAB_ENV_END_OF_TURN\x1f"


class TranscriptPolicy:
    """The trained player of ONE episode: its prompts are its exact token history.

    The first prompt is the chat template of the first observation. Each later prompt is the
    previous prompt + the generated ids + the template's end-of-turn tokens (those after the
    EOS the model wrote, all of them when it was cut at the token limit) + the chat template's
    rendering of the messages that arrived since. So every prompt extends the previous prompt
    and completion token for token, and :func:`~collab_env.rollout.token_transcript` of the
    episode is exact.

    Raises:
        ConfigError: An observation does not extend the previous one by the player's reply and
            new messages, or the chat template renders earlier turns differently once a later
            one is added (e.g. a template that drops past reasoning).
    """

    def __init__(self, generator: TrainerGenerator, params: SamplingParams | None = None) -> None:
        self.generator = generator
        self.params = params or generator.params
        self.name = f"trl-model({generator.backend.name})"
        self._chat: list[dict[str, Any]] | None = None
        self._ids: list[int] = []
        self._last: Completion | None = None

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        if len(observations) != 1:
            raise ConfigError("TranscriptPolicy plays one episode: one observation per call.")
        chat = _clean_chat(observations[0].to_chat())
        ids = self.generator.prompt_ids(chat) if self._chat is None else self._extend(chat)
        completion = await self.generator.generate(ids, self.params)
        if list(completion.prompt_token_ids or ids) != ids:
            raise PolicyError("the generator changed the prompt ids it was given.")
        self._chat, self._last = chat, completion
        self._ids = ids + list(completion.token_ids or ())
        return [completion]

    def _extend(self, chat: list[dict[str, Any]]) -> list[int]:
        prev, tok = self._chat, self.generator.tokenizer
        n = len(prev)
        if chat[:n] != prev or len(chat) <= n or chat[n]["role"] != "assistant":
            raise ConfigError("the trained player's new observation does not extend its previous one by its reply "
                              "(the env rewrote the conversation); this env cannot be trained as one sequence.")
        with_reply = _render(tok, chat[: n + 1], False)
        full = _render(tok, chat, True)
        if not full.startswith(with_reply):
            raise ConfigError("the chat template renders earlier turns differently once later ones are added; "
                              "the episode cannot be one token sequence (train turn by turn instead).")
        probe = _render(tok, [*prev, {"role": "assistant", "content": _SENTINEL}], False)
        if _SENTINEL not in probe:
            raise ConfigError("the chat template does not render the assistant's reply verbatim.")
        end_of_turn = probe[probe.index(_SENTINEL) + len(_SENTINEL):]
        generated = list(self._last.token_ids or ())
        if generated and generated[-1] in self.generator.eos_token_ids:
            eos_text = tok.decode([generated[-1]])
            if end_of_turn.startswith(eos_text):
                end_of_turn = end_of_turn[len(eos_text):]
        return self._ids + _render_ids(tok, end_of_turn + full[len(with_reply):])


# ---------------------------------------------------------------------------------------------
# Episodes -> TRL's output
# ---------------------------------------------------------------------------------------------
class EpisodeRecorder(EnvWrapper):
    """Keeps ``infos[player]["mr"]`` of every step where the multiturn-aware reward scored the
    player (with its ``step``), for the reward functions; changes nothing else."""

    def __init__(self, env: Any, player: str) -> None:
        super().__init__(env)
        self.player = player
        self.mr: list[dict[str, Any]] = []

    async def areset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        self.mr = []
        return await self.env.areset(seed=seed, options=options)

    async def astep(self, actions: Mapping[str, str]):
        step = self.env.unwrapped.episode.step
        out = await self.env.astep(actions)
        mr = out[4].get(self.player, {}).get("mr")
        if mr is not None:
            self.mr.append({"step": step, **{k: v for k, v in mr.items() if k != "futures"}})
        return out


def episode_output(episodes: Sequence[Episode], player: str, mr: Sequence[list[dict[str, Any]]] | None = None
                   ) -> dict[str, list[Any]]:
    """TRL's ``rollout_func`` output for ``episodes``: ``prompt_ids``, ``completion_ids``,
    ``logprobs`` and ``env_mask`` from :func:`~collab_env.rollout.token_transcript`, plus
    ``episode_reward``, ``reward_components``, ``mr``, ``end_reason``, ``num_turns``, ``index``
    and ``seed`` per episode."""
    out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                "episode_reward", "reward_components", "mr", "end_reason",
                                                "num_turns", "index", "seed")}
    for i, ep in enumerate(episodes):
        tt = token_transcript(ep, player)
        out["prompt_ids"].append(tt.prompt_ids)
        out["completion_ids"].append(tt.response_ids)
        out["logprobs"].append(tt.logprobs)
        out["env_mask"].append(tt.mask)
        out["episode_reward"].append(float(ep.returns[player]))
        out["reward_components"].append(dict(ep.components.get(player, {})))
        out["mr"].append(list(mr[i]) if mr is not None else [])
        out["end_reason"].append(ep.end_reason)
        out["num_turns"].append(tt.turns)
        out["index"].append(ep.index)
        out["seed"].append(ep.seed)
    return out


def episode_reward(completions: Sequence[Any], episode_reward: Sequence[float] | None = None, **kwargs: Any
                   ) -> list[float]:
    """A TRL reward function: the episode's return of the trained player (the ``episode_reward``
    key of :func:`rollout_func`'s output). Logs the mean of each reward component
    (``log_metric``) when TRL passes it.

    Raises:
        ConfigError: No ``episode_reward`` keyword (the trainer was not given :func:`rollout_func`).
    """
    if episode_reward is None:
        raise ConfigError("episode_reward reads the rewards that collab_env.adapters.trl.rollout_func returns; pass "
                          "rollout_func=rollout_func(...) to the GRPOTrainer.")
    if len(episode_reward) != len(completions):
        raise ConfigError(f"{len(episode_reward)} episode rewards for {len(completions)} completions.")
    log_metric, components = kwargs.get("log_metric"), kwargs.get("reward_components")
    if log_metric is not None and components:
        for name in sorted({k for c in components for k in c}):
            log_metric(f"reward/{name}", sum(float(c.get(name, 0.0)) for c in components) / len(components))
    return [float(r) for r in episode_reward]


@dataclass
class RolloutFunc:
    """The callable :func:`rollout_func` returns: ``(prompts, trainer) -> dict`` for TRL.

    Attributes:
        build_env: Builds a fresh env (one per concurrent episode; kept and reused).
        player: The trained player.
        policies: Player -> policy of the other players (as given; resolved per env).
        max_turn_tokens: Most tokens per turn of the trained player (default: the trainer's
            ``max_completion_length``).
        max_batch_size: Most sequences in one generation call of the trained model.
    """

    build_env: Callable[[], Any]
    player: str | None = None
    policies: Mapping[str, Any] | None = None
    max_turn_tokens: int | None = None
    max_batch_size: int = 64
    envs: list[Any] = field(default_factory=list, repr=False)
    last_episodes: list[Episode] = field(default_factory=list, repr=False)
    """The episodes of the latest call (for inspection)."""
    _hf: Any = field(default=None, repr=False)

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        from collab_env._async import run_sync

        items = [item_of(p) for p in prompts]
        while len(self.envs) < len(prompts):
            self.envs.append(self._new_env())
        player = self.player
        model = trainer.model
        was_training = bool(getattr(model, "training", False))
        try:
            with self._generator(trainer) as generator:
                episodes = run_sync(self._play(items, generator))
        finally:
            if was_training:
                model.train()
        self.last_episodes = episodes
        return episode_output(episodes, player, [self.envs[i].mr for i in range(len(episodes))])

    def _new_env(self) -> EpisodeRecorder:
        env = self.build_env()
        if self.player is None:
            self.player = _trained_player(env, None)
        else:
            _trained_player(env, self.player)
        return EpisodeRecorder(env, self.player)

    @contextlib.contextmanager
    def _generator(self, trainer: Any):
        args = trainer.args
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        params = SamplingParams(temperature=float(args.temperature), top_p=float(args.top_p),
                                top_k=(int(args.top_k) if args.top_k else None),
                                max_new_tokens=int(self.max_turn_tokens or args.max_completion_length))
        if getattr(trainer, "use_vllm", False):
            backend = VLLMGenerationGenerator(trainer.vllm_generation, tokenizer, trainer.eos_token_ids,
                                              max_batch_size=self.max_batch_size)
            yield TrainerGenerator(backend, tokenizer, params)
            return
        from trl.models import unwrap_model_for_generation

        from collab_env.agents.hf import HFPolicy

        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as model:
            if self._hf is None or self._hf.model is not model:
                self._hf = HFPolicy(model, tokenizer, flush="idle", max_batch_size=self.max_batch_size,
                                    name="trl-model")
            self._hf.model.eval()
            yield TrainerGenerator(self._hf, tokenizer, params)

    async def _play(self, items: Sequence[tuple[int, int]], generator: TrainerGenerator) -> list[Episode]:
        futures = ChatPolicy(generator)
        sampling = {self.player: _params_dict(generator.params)}

        async def one(env: EpisodeRecorder, index: int, seed: int) -> Episode:
            bind_learner(env, {self.player: futures}, sampling)  # MR futures played by the trained model
            policies = {**_other_policies(env, self.player, self.policies), self.player: TranscriptPolicy(generator)}
            # policy_seeds=False: the copies of one prompt must differ (the model's rows draw their
            # seeds from torch's generator); the env seed still fixes the item and its randomness.
            return await arun_episode(env, policies, seed=seed, index=index, policy_seeds=False)

        return list(await asyncio.gather(*(one(self.envs[i], idx, s) for i, (idx, s) in enumerate(items))))


def rollout_func(env_id_or_factory: Any, *, player: str | None = None, policies: Mapping[str, Any] | None = None,
                 split: str | None = None, env_kwargs: Mapping[str, Any] | None = None,
                 max_turn_tokens: int | None = None, max_batch_size: int = 64) -> RolloutFunc:
    """A TRL ``rollout_func`` that plays ``env_id_or_factory`` (see the module docstring).

    Args:
        env_id_or_factory: A registered env id, or a zero-argument function that builds an env
            (e.g. ``lambda: collab_env.make("hidden-facts-easy", reward="mr", reward_kwargs=...)``).
            A multiturn-aware reward whose assistant policy is ``"learner"`` rolls its futures
            with the trainer's model.
        player: The trained player (default: the env's only trainable player).
        policies: Player -> policy of the other players (default: the spec's defaults).
        split: The env's split (with an env id).
        env_kwargs: Keywords of :func:`collab_env.make` (with an env id).
        max_turn_tokens: Most tokens per turn of the trained player (default: the trainer's
            ``max_completion_length``).
        max_batch_size: Most sequences in one generation call.

    Returns:
        A :class:`RolloutFunc` (callable as ``(prompts, trainer) -> dict``).
    """
    if max_turn_tokens is not None and (isinstance(max_turn_tokens, bool) or not isinstance(max_turn_tokens, int)
                                        or max_turn_tokens < 1):
        raise ConfigError(f"max_turn_tokens must be an int >= 1 or None, got {max_turn_tokens!r}.")
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ConfigError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}.")
    build = _env_builder(env_id_or_factory, split, env_kwargs)
    fn = RolloutFunc(build, player=player, policies=policies, max_turn_tokens=max_turn_tokens,
                     max_batch_size=max_batch_size)
    fn.envs.append(fn._new_env())  # fail now on a bad env or player, not at the first step
    return fn


# ---------------------------------------------------------------------------------------------
# The tool route
# ---------------------------------------------------------------------------------------------
class CollabToolEnv:
    """A collab_env env for TRL's ``environment_factory``: the single-agent view as one tool.

    TRL builds a pool of instances, calls ``reset(**row)`` before each rollout, exposes the
    public methods other than ``reset`` and ``get_reward`` as tools, and calls ``get_reward()``
    once the rollout is done. Build it through :func:`environment_factory`.

    Args:
        build_env: Builds the env.
        player: The player the model plays (default: the env's only trainable player).
        policies: Player -> policy of the other players (default: the spec's defaults).
    """

    def __init__(self, build_env: Callable[[], Any], player: str | None = None,
                 policies: Mapping[str, Any] | None = None) -> None:
        from collab_env.wrappers.single_agent import SingleAgentEnv

        env = build_env()
        self._player = _trained_player(env, player)
        self._view = SingleAgentEnv(env, self._player, policies=policies)
        self._reward = 0.0
        self._done = True

    def reset(self, **row: Any) -> str | None:
        """Start the episode of a dataset row (its ``index`` and ``seed`` columns, or the
        :data:`TAG` of its prompt). Returns ``None`` when the row has a prompt (the player's first
        observation, built by :func:`dataset`), else the text of that observation's last
        message, which TRL appends to the prompt."""
        if "index" in row and "seed" in row:
            index, seed = int(row["index"]), int(row["seed"])
        else:
            index, seed = item_of(row.get("prompt") or [])
        obs, _ = self._view.reset(seed=seed, options={"index": index})
        self._reward, self._done = 0.0, not self._view.env.agents
        return None if row.get("prompt") else obs.to_chat()[-1]["content"]

    def send_message(self, message: str) -> str:
        """Send a message to the other participants of the conversation and read their replies.

        Args:
            message: The message to send.

        Returns:
            What the others said, one line per message, or a note that the conversation ended.
        """
        if self._done:
            raise ValueError("the conversation has ended; give your final answer.")
        _, reward, terminated, truncated, info = self._view.step(str(message))
        self._reward += float(reward)
        self._done = bool(terminated or truncated)
        lines = [f"{p}: {t}" for p, t in info.get("other_moves", [])]
        if self._done:
            lines.append("[the conversation has ended]")
        return "\n".join(lines)

    def get_reward(self) -> float:
        """The player's return so far (TRL's reward of the rollout)."""
        return self._reward


def environment_factory(env_id_or_factory: Any, *, player: str | None = None,
                        policies: Mapping[str, Any] | None = None, split: str | None = None,
                        env_kwargs: Mapping[str, Any] | None = None) -> Callable[[], CollabToolEnv]:
    """A zero-argument factory of :class:`CollabToolEnv` for ``GRPOTrainer(environment_factory=...)``
    (arguments as in :func:`rollout_func`)."""
    build = _env_builder(env_id_or_factory, split, env_kwargs)
    factory = functools.partial(CollabToolEnv, build, player, policies)
    factory()  # fail now on a bad env or player
    return factory
