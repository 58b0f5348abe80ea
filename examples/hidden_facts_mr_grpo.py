"""CollabLLM-style training on the built-in collaboration suite, on CPU.

The assistant of ``hidden-facts-easy`` is trained with GRPO on the **multiturn-aware reward**:
each sampled reply is scored by ``num_rollouts`` short futures in which the scripted user
answers and the policy being trained plays the later assistant turns (the episode driver hands
the reward the policy it plays with). It is the CollabLLM recipe with the API user simulator and judge replaced
by the suite's scripted user and rules, so it runs offline in minutes.

    python examples/hidden_facts_mr_grpo.py                 # embedded SmolLM2-135M-Instruct
    AGENT_MODEL=/path/to/model ITEMS=16 python examples/hidden_facts_mr_grpo.py

Logs and curves land in ``collab_env_output/hidden-facts-mr/``.

The reward (:func:`mr_env`), and why it is not the recipe's ``accuracy - 1e-3 * tokens``
    A 135M model almost never boxes the exact total, so with the recipe's weights the accuracy
    term is 0 for every sample and the only signal left is the token penalty: the learner
    shortens its replies until they are the end-of-sequence token alone (measured: mean length 1
    token by item ~45 of 60), and under the ``"verl"`` rule an empty reply even scores 0, above
    every real reply. Here a reply is scored by (weights in :data:`WEIGHTS`)

    * ``accuracy_rule`` (1.0): the exact ``\\boxed{}`` total somewhere in the future;
    * ``facts_revealed`` (0.5): the share of the facts withheld from the opening that the user
      states in the future, i.e. that the assistant asked the right question about
      (:func:`facts_revealed`);
    * ``empty_reply`` (-1.0): the rewarded reply has no visible text (:func:`empty_reply`);
    * ``token_amount`` (-1e-3 per word of the reply and its future, the recipe's penalty);

    aggregated by the ``"collabllm"`` rule (the collabllm package's: the mean over futures of the
    weighted sum), under which an empty reply is scored like any text, so its -1 counts, instead
    of the ``"verl"`` rule's flat 0. An empty or evasive reply is then the worst move, a question
    that makes the user reveal a fact is better than a guess, and the exact answer is best.
    Training logs the collapse statistics (``collapse/completion_length``, ``collapse/empty_share``,
    ``collapse/duplicate_share``) and warns (``CollapseWarning``) when the mean reply falls
    below :data:`MIN_REPLY_TOKENS` visible tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import collab_env
from collab_env.rewards.metrics import MetricResult, register_metric
from collab_env.rewards.mr import MultiturnAwareReward
from collab_env.types import Conversation

MAX_NEW_TOKENS = int(os.environ.get("MAX_NEW_TOKENS", "48"))

#: Mean visible tokens per training reply below which the collapse monitor warns.
MIN_REPLY_TOKENS = 8.0

#: The reward's metric weights (module docstring).
WEIGHTS = {"accuracy_rule": 1.0, "facts_revealed": 0.5, "empty_reply": -1.0, "token_amount": -1e-3}


def facts_revealed(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                   **ctx: Any) -> MetricResult:
    """Share of the hidden-facts item's withheld facts (``hidden``) that a user message from
    ``start`` on states (the scripted user states a fact by its exact sentence, and only when
    asked about it); 0.0 for an item without withheld facts."""
    hidden = [f for f in item.get("facts", ()) if f.get("hidden")]
    if not hidden:
        return MetricResult(0.0, {"hidden": 0})
    said = " ".join(m.content for m in conversation[start:] if m.role == "user" and m.author == "user")
    told = [f["sentence"] for f in hidden if f["sentence"] in said]
    return MetricResult(len(told) / len(hidden), {"hidden": len(hidden), "revealed": told})


def empty_reply(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                **ctx: Any) -> MetricResult:
    """1.0 when the rewarded reply (the message at ``start``) has no visible text, else 0.0."""
    reply = conversation[start].content if start < len(conversation) else ""
    return MetricResult(float(not reply.strip()), {})


def register_metrics() -> None:
    """Register :func:`facts_revealed` and :func:`empty_reply` (idempotent)."""
    register_metric("facts_revealed", facts_revealed, overwrite=True,
                    description="share of the withheld hidden-facts facts the user states in the future")
    register_metric("empty_reply", empty_reply, overwrite=True,
                    description="1 when the rewarded reply has no visible text")


def mr_env(split: str, env_id: str = "hidden-facts-easy", num_rollouts: int = 2,
           weights: Mapping[str, float] | None = None, aggregation: str = "collabllm",
           assistant: Any = None, max_user_turns: int = 2) -> MultiturnAwareReward:
    """The training env: ``env_id``'s ``split`` under the multiturn-aware reward above
    (``assistant``: the future assistant turns' policy when the env is stepped directly; played
    by a learner, the learner's own model;
    ``max_user_turns=1`` ends every future at the user's answer to the reply: no future
    assistant turn is generated, so it is cheaper, but only the facts a reply elicits (and an
    answer boxed in the reply itself) earn credit)."""
    register_metrics()
    return MultiturnAwareReward(
        collab_env.make(env_id, split=split),
        # the user keeps the spec's scripted HiddenFactsUser
        policies={} if assistant is None else {"assistant": assistant},
        weights=dict(weights or WEIGHTS),
        aggregation=aggregation,  # "collabllm": an empty reply is scored (its -1 counts), not a flat 0
        num_rollouts=num_rollouts,
        # The window: the reply, the user's answer, the assistant's next turn (where it can box
        # the total once the user told the fact), the user's reply to it.
        max_user_turns=max_user_turns,
        max_assistant_turns=2,
        # No sampling= here: the driver hands the reward the learner's policy with its sampling
        # settings (temperature, max_new_tokens), so the futures sample as the training rollouts do.
    )


def collapse_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per training log line, the collapse statistics; with their min / last over the run."""
    lines = [r for r in records if "collapse/completion_length" in r]
    lengths = [r["collapse/completion_length"] for r in lines]
    return {
        "completion_length_per_log": [round(x, 2) for x in lengths],
        "completion_length_min": min(lengths) if lengths else None,
        "completion_length_last10_mean": (sum(lengths[-10:]) / len(lengths[-10:])) if lengths else None,
        "empty_share_max": max((r["collapse/empty_share"] for r in lines), default=None),
        "duplicate_share_max": max((r["collapse/duplicate_share"] for r in lines), default=None),
        "flagged_lines": sum(1 for r in lines if r.get("collapse/flagged")),
    }


if __name__ == "__main__":
    from collab_env.adapters.common.collapse import CollapseThresholds
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

    config = MAGRPOConfig(
        num_agents=1,
        num_turns=1,
        num_generations=4,
        max_new_tokens=MAX_NEW_TOKENS,
        max_steps=int(os.environ.get("ITEMS", "4")),
        learning_rate=1e-5,
        eval_interval=0,
        eval_num_samples=4,
        logging_steps=1,
        output_dir="collab_env_output/hidden-facts-mr",
    )
    trainer = MAGRPOTrainer(
        agent_model=os.environ.get("AGENT_MODEL", "embedded"),
        env=mr_env("train"),
        eval_env=collab_env.make("hidden-facts-easy", split="test"),  # plain task reward
        args=config,
    )
    trainer.collapse_thresholds = CollapseThresholds(min_length=MIN_REPLY_TOKENS)
    before = trainer.evaluate(num_eval_samples=4)
    last = trainer.train()  # the last logged training metrics: turn_1/reward_mean is the mean MR
    after = trainer.evaluate(num_eval_samples=4)
    print(json.dumps({"eval_before": before, "last_training_log": last, "eval_after": after,
                      "collapse": collapse_summary(trainer.logger.records)}, indent=2))
