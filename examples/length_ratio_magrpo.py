"""The CoMLRL guide's length-ratio example, run with collab_env's MAGRPO trainer.

What differs from the guide: the import line
(``from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer`` instead of
``from comlrl.trainers.reinforce import ...``), ``agent_model``, which points at the embedded
SmolLM2-135M-Instruct (offline, no hub) instead of ``"Qwen/Qwen2.5-0.5B"``, and
``max_new_tokens`` (64 instead of 128, for CPU). Set ``AGENT_MODEL=/path/to/model`` to use
another local model and ``MAX_NEW_TOKENS=128`` for the guide's length.

Run it with ``python examples/length_ratio_magrpo.py``: on CPU it trains end to end in a few
minutes (two agents, 8 training items, 4 generations each, evaluation before items 1 and 5).
The JSONL log and the curves land in ``collab_env_output/``; the final evaluation in
``eval-metrics.json``.
"""

import json
import math
import os
from pathlib import Path

from datasets import Dataset

from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer

tasks = Dataset.from_dict({
    "prompt": [
        "Describe a city in the clouds.",
        "Invent a new holiday.",
        "Write a bedtime story for a dragon.",
        "Explain how teleportation might work.",
        "Tell a story about dinosaurs.",
        "Describe a world without electricity.",
        "Create a superhero with a unique power.",
        "Write a scene where the moon talks.",
        "Invent a new type of fruit.",
        "Design a playground on Mars.",
    ],
    "target_min": [2.0] * 10,
    "target_max": [3.0] * 10,
})

split = tasks.train_test_split(test_size=0.2, seed=42)
train_dataset = split["train"]
eval_dataset = split["test"]


def brief_formatter(item):
    return f"Write a short response to this task:\n{item['prompt']}"


def detailed_formatter(item):
    return f"Write a detailed response to this task:\n{item['prompt']}"


formatters = [brief_formatter, detailed_formatter]


def reward_func(brief_completions, detailed_completions, *, batch_items):
    item = batch_items[0]
    rewards = []
    for brief, detailed in zip(brief_completions, detailed_completions):  # noqa: B905 (the guide's code)
        if not brief:
            rewards.append(0.0)
            continue
        ratio = len(detailed) / len(brief)
        distance = max(item["target_min"] - ratio, ratio - item["target_max"], 0.0)
        rewards.append(math.exp(-distance))
    return rewards


item = train_dataset[0]
assert item["prompt"] in brief_formatter(item)
assert reward_func(["Hi"], ["Hello"], batch_items=[item]) == [1.0]
assert reward_func([""], ["Hello"], batch_items=[item]) == [0.0]


def eval_logger(*, agent_completions_turns, batch_items, prompts):
    return [
        {
            f"turn_{turn + 1}/response_chars": sum(
                len(agent[row][turn]) for agent in agent_completions_turns
            ) / len(agent_completions_turns)
            for turn in range(len(agent_completions_turns[0][row]))
        }
        for row in range(len(batch_items))
    ]


def eval_aggregator(rows, *, num_turns):
    return {
        key: sum(row[key] for row in rows) / len(rows)
        for turn in range(num_turns)
        for key in [f"turn_{turn + 1}/response_chars"]
    } if rows else {}


if __name__ == "__main__":
    config = MAGRPOConfig(
        num_agents=2,
        num_turns=1,
        num_train_epochs=1,
        num_generations=4,
        # The guide uses 128; 64 keeps a CPU run within minutes (MAX_NEW_TOKENS=128 for the guide's).
        max_new_tokens=int(os.environ.get("MAX_NEW_TOKENS", "64")),
        eval_interval=4,
        eval_num_samples=len(eval_dataset),
        eval_batch_size=1,
        logging_steps=4,
    )

    trainer = MAGRPOTrainer(
        agent_model=os.environ.get("AGENT_MODEL", "embedded"),
        num_agents=2,
        formatters=formatters,
        reward_func=reward_func,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        args=config,
        eval_logger=eval_logger,
        eval_aggregator=eval_aggregator,
    )

    trainer.train()
    metrics = trainer.evaluate(num_eval_samples=len(eval_dataset))
    print(metrics)
    Path("eval-metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
