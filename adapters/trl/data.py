"""The TRL training dataset: one row per task item, its prompt tagged with the item (:data:`TAG`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from collab_env.adapters.trl.envs import env_builder, other_policies, trained_player
from collab_env.errors import ConfigError, require
from collab_env.rollout import advance
from collab_env.types import template_chat

#: The key of the first prompt message that names the task item: ``{"index": i, "seed": s}``.
TAG = "collab_env"


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
        from collab_env._json import loads

        tag = loads(tag, "the prompt's task tag")
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

    build = env_builder(env_id_or_factory, split, env_kwargs)
    env = build()
    player = trained_player(env, player)
    others = other_policies(env, player, policies)
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
        chat = template_chat(run.obs[player].to_chat())  # TRL renders it with the template
        chat[0][TAG] = json.dumps({"index": i, "seed": s})
        return {"prompt": chat, "index": i, "seed": s}

    try:
        return [run_sync(first_prompt(i)) for i in range(n)]
    finally:
        env.close()  # a served env's session ends here


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
