"""Generate new multiturn datasets: candidate replies ranked by the multiturn-aware reward.

The collabllm package builds its training data by simulation: at every assistant turn of a
conversation with a user simulator, sample several candidate replies, score each by its
multiturn-aware reward (MR: sampled future conversations, scored by the metrics), continue the
conversation with the best one, and record every candidate with its score. This module does the
same on any environment wrapped in :class:`~collab_env.rewards.mr.MultiturnAwareReward` and with
any backend (a local model, vLLM, an API model through litellm)::

    env = collab_env.make("collabllm-math-hard", data_files="math.parquet", mode="eval",
                          reward="mr", reward_kwargs={"judge": "litellm:openai/gpt-4o-mini",
                                                      "user": "litellm:openai/gpt-4o-mini",
                                                      "return_futures": True})
    rows = build_multiturn_dataset(env, {"assistant": "vllm:Qwen/Qwen2.5-7B-Instruct",
                                         "user": env.scorer.named["user"]},
                                   items=range(100), num_candidates=3)

Each candidate is scored on its own clone of the env: the episode driver plays the candidate as
the rewarded player's move and runs the reward's scorer with ``policies``, so the futures'
assistant is the policy that sampled the candidates. The conversation continues *from the best
candidate's clone*, so no reward is computed twice.

Output: one row per candidate in the CollabLLM schema (:mod:`collab_env.tasks.collabllm`), so
:func:`~collab_env.tasks.collabllm_modes.build_sft_dataset` (the best conversation per
``conv_id``) and :func:`~collab_env.tasks.collabllm_modes.build_dpo_dataset` (best vs worst
candidate of a prefix) work on it directly:

=========================  ====================================================================
``prompt``                 the conversation as the assistant saw it before the reply (chat
                           messages; hidden messages never included)
``completion``             the candidate reply
``score``                  its MR
``conv_id`` / ``turn_id``  the conversation (the item index) / the assistant turn (1-based)
``single_turn_prompt``     the task item's hidden goal (for the user simulator; never in prompt)
``single_turn_completion`` the item's reference answer (``single_turn_completion`` or
                           ``answer``), ``""`` when it has none
``single_turn_metadata``   the other JSON-friendly fields of the item
``sessions``               the sampled futures of the candidate (message lists; empty unless the
                           MR wrapper was built with ``return_futures=True``)
``rewards``                per-metric mean over the futures
``chosen``                 whether the conversation continued with this candidate
=========================  ====================================================================

Failures are never silent: a candidate whose MR cannot be computed (every future faulted) is
recorded with ``score=None`` and an ``error``, is never chosen, and is counted in the returned
statistics; a turn where no candidate could be scored ends that conversation (counted too).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

from collab_env.errors import CollabEnvError, ConfigError, PolicyError

__all__ = ["abuild_multiturn_dataset", "build_multiturn_dataset"]

_ITEM_TEXT_KEYS = ("single_turn_prompt", "single_turn_completion", "answer")


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _item_fields(item: Mapping[str, Any]) -> dict[str, Any]:
    reference = item.get("single_turn_completion", item.get("answer", ""))
    meta = {k: _jsonable(v) for k, v in item.items()
            if k not in _ITEM_TEXT_KEYS and k not in ("prompt", "sessions", "completion", "rewards")}
    return {"single_turn_prompt": str(item.get("single_turn_prompt", "")),
            "single_turn_completion": "" if reference is None else str(reference),
            "single_turn_metadata": meta}


async def abuild_multiturn_dataset(
    env: Any,
    policies: Mapping[str, Any],
    items: Iterable[int],
    *,
    num_candidates: int = 3,
    max_assistant_turns: int | None = None,
    seed: int = 0,
    sampling: Mapping[str, Any] | None = None,
    reset_options: Mapping[str, Any] | None = None,
    concurrency: int = 4,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Simulate one conversation per item and rank every assistant turn's candidates by MR.

    Args:
        env: An env whose outer reward wrapper is a
            :class:`~collab_env.rewards.mr.MultiturnAwareReward` (its scorer names the rewarded
            player).
        policies: Player -> policy for the conversation itself: the rewarded player's policy
            samples the candidates and plays their futures, the others (the user simulator)
            answer.
        items: Item indices (``reset(options={"index": i})``).
        num_candidates: Candidate replies per assistant turn (>= 2 to rank).
        max_assistant_turns: Stop a conversation after this many assistant turns (``None``:
            when the env ends it).
        seed: Base seed of the resets and of the candidates' sampling.
        sampling: Sampling keywords for the candidates (e.g. temperature 1.0).
        reset_options: Extra reset options (e.g. ``{"mode": "eval"}``).
        concurrency: Conversations simulated at once.

    Returns:
        ``(rows, stats)``: the rows described in the module docstring and counters
        (``conversations``, ``turns``, ``candidates``, ``failed_candidates``,
        ``abandoned_turns``).
    """
    from collab_env.policy import resolve_policy
    from collab_env.rollout import advance
    from collab_env.rollout.driver import split_scorers

    mr = [s for s in split_scorers(env)[1] if s.name == "mr"]
    player = mr[0].player if mr else None
    if player is None:
        raise ConfigError(
            "build_multiturn_dataset ranks candidates by the multiturn-aware reward: pass an env "
            "wrapped in MultiturnAwareReward (e.g. collab_env.make(id, reward='mr', ...))."
        )
    if isinstance(num_candidates, bool) or not isinstance(num_candidates, int) or num_candidates < 2:
        raise ConfigError(f"num_candidates must be an int >= 2 (ranking needs two), got {num_candidates!r}.")
    if player not in policies:
        raise ConfigError(f"policies must include {player!r}, whose candidates are ranked.")
    resolved = {p: resolve_policy(v) for p, v in policies.items()}
    stats = dict.fromkeys(("conversations", "turns", "candidates", "failed_candidates", "abandoned_turns"), 0)
    sem = asyncio.Semaphore(concurrency)

    async def conversation(k: int, index: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        async with sem:
            cur = env.clone()
            obs, infos = await cur.areset(seed=seed + k, options={**dict(reset_options or {}), "index": index})
            fields = _item_fields(cur.episode.item)
            turn, step = 0, 0
            while cur.agents:
                # The other players (the user simulator) answer until the rewarded player is on
                # turn: the episode driver (a policy that gives up ends the conversation).
                run = await advance(cur, resolved, obs=obs, infos=infos, until=(player,),
                                    seed=functools.partial(operator.add, seed + 1000 * k + step))
                step += len(run.steps)
                obs, infos = run.obs, run.infos
                if run.done:
                    break
                on_turn = list(cur.on_turn)
                if len(on_turn) > 1:
                    raise ConfigError(f"players {on_turn} move together; ranking one player's candidates "
                                      "needs turns where it moves alone.")
                if max_assistant_turns is not None and turn >= max_assistant_turns:
                    break
                turn += 1
                prompt = [m for m in obs[player].to_chat()]
                cands = await asyncio.gather(*(
                    resolved[player].act([obs[player]],
                                         **{**dict(sampling or {}), "seed": seed + 7919 * k + 97 * turn + j})
                    for j in range(num_candidates)))
                texts = [c[0].text for c in cands]
                forks = [cur.clone() for _ in texts]

                async def score(fork, text, obs, infos):
                    # the driver plays the candidate and runs the reward's scorer with ``resolved``
                    try:
                        run = await advance(fork, resolved, obs=obs, infos=infos, actions={player: text},
                                            max_steps=1)
                    except (CollabEnvError, PolicyError) as exc:
                        return None, f"{type(exc).__name__}: {exc}"[:500]
                    done = run.steps[0]
                    return (run.obs, done.rewards, done.terminations, done.truncations, run.infos), None

                outs = await asyncio.gather(*(score(f, t, obs, infos) for f, t in zip(forks, texts, strict=True)))
                scores = [None if out is None else float(out[1][player]) for out, _ in outs]
                finite = {j: s for j, s in enumerate(scores) if s is not None and math.isfinite(s)}
                valid = list(finite)
                best = max(valid, key=finite.__getitem__) if valid else None
                stats["turns"] += 1
                stats["candidates"] += len(texts)
                stats["failed_candidates"] += len(texts) - len(valid)
                for j, (text, (out, err)) in enumerate(zip(texts, outs, strict=True)):
                    mr = out[4][player].get("mr", {}) if out is not None else {}
                    rows.append({
                        "prompt": prompt, "completion": text, "score": scores[j],
                        "conv_id": int(index), "turn_id": turn, **fields,
                        "sessions": [f for f in mr.get("futures") or [] if f is not None],
                        "rewards": {m: v["mean"] for m, v in mr.get("metrics", {}).items()},
                        "chosen": j == best, **({"error": err} if err else {}),
                    })
                if best is None:
                    stats["abandoned_turns"] += 1
                    break
                cur = forks[best]
                obs, _, _, _, infos = outs[best][0]
                step += 1
            stats["conversations"] += 1
        return rows

    results = await asyncio.gather(*(conversation(k, i) for k, i in enumerate(items)))
    return [r for rows in results for r in rows], stats


def build_multiturn_dataset(env: Any, policies: Mapping[str, Any], items: Iterable[int], **kwargs: Any):
    """Synchronous :func:`abuild_multiturn_dataset`; returns ``(rows, stats)``."""
    from collab_env._async import run_sync

    return run_sync(abuild_multiturn_dataset(env, policies, list(items), **kwargs))
