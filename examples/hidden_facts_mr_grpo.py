"""CollabLLM-style training on the built-in collaboration suite, on CPU.

The assistant of ``hidden-facts-easy`` is trained with GRPO on the **multiturn-aware reward**:
each sampled reply is scored by ``num_rollouts`` short futures in which the scripted user
answers and the policy being trained plays the later assistant turns (``LEARNER``: the trainer
binds its own policy), with the math answer checked by rule (``\\boxed{}`` against the hidden
total) and a token penalty, aggregated by the verl recipe's rule. It is the CollabLLM recipe with
the API user simulator and judge replaced by the suite's scripted user and a rule, so it runs
offline in minutes.

    python examples/hidden_facts_mr_grpo.py                 # embedded SmolLM2-135M-Instruct
    AGENT_MODEL=/path/to/model ITEMS=16 python examples/hidden_facts_mr_grpo.py

Logs and curves land in ``collab_env_output/hidden-facts-mr/``.
"""

import json
import os

import collab_env
from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
from collab_env.rewards.mr import LEARNER, MultiturnAwareReward

MAX_NEW_TOKENS = int(os.environ.get("MAX_NEW_TOKENS", "48"))


def mr_env(split: str) -> MultiturnAwareReward:
    return MultiturnAwareReward(
        collab_env.make("hidden-facts-easy", split=split),
        policies={"assistant": LEARNER},  # the user keeps the spec's scripted HiddenFactsUser
        weights={"accuracy_rule": 1.0, "token_amount": -1e-3},
        num_rollouts=2,
        # The recipe's window: reply, user's answer, assistant, user. The verl rule (default)
        # drops the last assistant turn, so the answer the accuracy metric reads comes before it.
        max_user_turns=2,
        max_assistant_turns=3,
        # No sampling= here: the trainer binds its policy with its own sampling settings
        # (temperature, max_new_tokens), so the futures sample as the training rollouts do.
    )


if __name__ == "__main__":
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
    before = trainer.evaluate(num_eval_samples=4)
    last = trainer.train()  # the last logged training metrics: turn_1/reward_mean is the mean MR
    after = trainer.evaluate(num_eval_samples=4)
    print(json.dumps({"eval_before": before, "last_training_log": last, "eval_after": after}, indent=2))
