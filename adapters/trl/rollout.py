"""TRL's ``rollout_func``: whole episodes through the driver, and their conversion to TRL's output."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collab_env.adapters.trl.data import item_of
from collab_env.adapters.trl.envs import env_builder, other_policies, trained_player
from collab_env.adapters.trl.generation import (
    TrainerGenerator,
    TranscriptPolicy,
    VLLMGenerationGenerator,
)
from collab_env.errors import ConfigError
from collab_env.policy import SamplingParams
from collab_env.rollout import arun_episode, token_transcript
from collab_env.types import Episode


def scored_moves(episode: Episode, player: str, name: str = "mr") -> list[dict[str, Any]]:
    """``{"step", **infos[player][name]}`` of every move of ``player`` that the scorer ``name``
    (the multiturn-aware reward) scored in ``episode`` (``Episode.info["scores"]``), without the
    sampled futures' text."""
    return [{"step": s["step"], **{k: v for k, v in s[name].items() if k != "futures"}}
            for s in episode.info.get("scores", []) if s["player"] == player and s.get(name) is not None]


def episode_output(episodes: Sequence[Episode], player: str) -> dict[str, list[Any]]:
    """TRL's ``rollout_func`` output for ``episodes``: ``prompt_ids``, ``completion_ids``,
    ``logprobs`` and ``env_mask`` from :func:`~collab_env.rollout.token_transcript`, plus
    ``episode_reward``, ``reward_components``, ``mr``, ``end_reason``, ``num_turns``, ``index``
    and ``seed`` per episode, and the turn-level credit: ``turn_rewards`` (each move's credit,
    :func:`~collab_env.rollout.turn_rewards`) and ``turn_ids`` (per completion token, the move that
    generated it, -1 between moves), which :class:`~collab_env.adapters.trl.credit.TurnCreditGRPOTrainer`
    turns into per-token advantages."""
    out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                "episode_reward", "reward_components", "mr", "end_reason",
                                                "num_turns", "index", "seed", "turn_rewards", "turn_ids")}
    for ep in episodes:
        tt = token_transcript(ep, player)
        out["prompt_ids"].append(tt.prompt_ids)
        out["completion_ids"].append(tt.response_ids)
        out["logprobs"].append(tt.logprobs)
        out["env_mask"].append(tt.mask)
        out["episode_reward"].append(float(ep.returns[player]))
        out["reward_components"].append(dict(ep.components.get(player, {})))
        out["mr"].append(scored_moves(ep, player))
        out["end_reason"].append(ep.end_reason)
        out["num_turns"].append(tt.turns)
        out["index"].append(ep.index)
        out["seed"].append(ep.seed)
        out["turn_rewards"].append(list(tt.turn_rewards))
        out["turn_ids"].append(list(tt.turn_ids))
    return out


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
    _lines_for: Any = field(default=None, repr=False)

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        from collab_env._async import run_sync

        self._add_run_lines(trainer)
        items = [item_of(p) for p in prompts]
        while len(self.envs) < len(prompts):
            self.envs.append(self._new_env())
        player = self.player or ""  # set by _new_env once an env exists; unused when there is no prompt
        model = trainer.model
        was_training = bool(getattr(model, "training", False))
        try:
            with self._generator(trainer) as generator:
                episodes = run_sync(self._play(items, generator, player))
        finally:
            if was_training:
                model.train()
        self.last_episodes = episodes
        return episode_output(episodes, player)

    def close(self) -> None:
        """Close the envs kept for the batches (a served env's sessions end here)."""
        envs, self.envs = self.envs, []
        for env in envs:
            env.close()

    def _add_run_lines(self, trainer: Any) -> None:
        """Give ``trainer`` the run's progress and closing lines (:class:`~collab_env.adapters.trl.lines.RunLines`),
        once per trainer."""
        if self._lines_for is trainer or not hasattr(trainer, "add_callback"):
            return
        from collab_env.adapters.trl.lines import add_run_lines

        self._lines_for = trainer
        env_id = getattr(getattr(self.envs[0], "spec", None), "id", None) if self.envs else None
        add_run_lines(trainer, " ".join([*([str(env_id)] if env_id else []), self.player or ""]).strip())

    def _new_env(self) -> Any:
        env = self.build_env()
        if self.player is None:
            self.player = trained_player(env, None)
        else:
            trained_player(env, self.player)
        return env

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
            self._hf.reset_prefix_cache()  # TRL stepped the weights since the last call: no stale KV
            yield TrainerGenerator(self._hf, tokenizer, params)

    async def _play(self, items: Sequence[tuple[int, int]], generator: TrainerGenerator,
                    player: str) -> list[Episode]:
        async def one(env: Any, index: int, seed: int) -> Episode:
            # The trained model plays the episode; a multiturn-aware reward's futures play it too
            # (TranscriptPolicy.fork: the same generator without this episode's token history).
            policies = {**other_policies(env, player, self.policies), player: TranscriptPolicy(generator)}
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
            A multiturn-aware reward rolls its futures with the trainer's model.
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
    build = env_builder(env_id_or_factory, split, env_kwargs)
    fn = RolloutFunc(build, player=player, policies=policies, max_turn_tokens=max_turn_tokens,
                     max_batch_size=max_batch_size)
    fn.envs.append(fn._new_env())  # fail now on a bad env or player, not at the first step
    return fn
