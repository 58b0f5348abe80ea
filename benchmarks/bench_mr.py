"""Cost of one multiturn-aware reward: 3 futures rolled concurrently vs the same futures in turn.

One CollabLLM-style math item (written to a temporary file in the dataset's schema), the embedded
SmolLM2-135M-Instruct as the assistant, the user simulator (greedy, plain-text replies) and the
interactivity judge (prefilled replies), the verl recipe's window (2 user turns, 3 assistant
turns); math accuracy by rule.

* **concurrent**: ``MultiturnAwareReward.score_reply``: the futures advance together, so the
  model serves each stage of all futures in one batched ``generate`` call, then all judge calls
  of all futures at once.
* **sequential**: the same futures (same seeds: sampling is seeded per row, so batching does not
  change a single token) rolled and scored one after the other.

Both runs use the same policy objects in the same process, one after the other; the script
checks that they produced identical futures and rewards, and prints the model calls
(``generate`` calls), tokens and wall time of each and their ratio.

Usage: python benchmarks/bench_mr.py [--rollouts 3] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import collab_env
from collab_env.rewards.mr import default_reward

ROW = {
    "prompt": [{"role": "user", "content": "Can you help me with a sum of some numbers?"}],
    "completion": "Sure, which numbers?",
    "conv_id": 0,
    "score": 0.5,
    "single_turn_prompt": "What is the sum of the first five odd numbers?",
    "single_turn_completion": "25",
    "single_turn_metadata": {},
    "turn_id": 1,
    "sessions": [[{"role": "assistant", "content": "Which numbers do you mean?"},
                  {"role": "user", "content": "The first five odd numbers."},
                  {"role": "assistant", "content": "1 + 3 + 5 + 7 + 9 = \\boxed{25}."}]],
    "rewards": {},
}


def _stats(policy) -> dict[str, float]:
    s = policy.stats
    return {"generate_calls": s.generate_calls, "requests": s.batched_requests,
            "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens}


def _diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


async def run(args) -> None:
    from collab_env.agents.embedded import EmbeddedPolicy
    from collab_env.agents.users import LLMUserSimulator

    tmp = Path(tempfile.mkdtemp())
    (tmp / "rows.jsonl").write_text(json.dumps(ROW) + "\n")
    model = EmbeddedPolicy(max_batch_size=32)
    user = LLMUserSimulator(model, reply_format="plain",
                            sampling={"temperature": 0.0, "max_new_tokens": args.max_new_tokens})
    sampling = {"assistant": {"temperature": 1.0, "max_new_tokens": args.max_new_tokens}}
    base = collab_env.make("collabllm-math-hard", data_files=str(tmp / "rows.jsonl"))
    # As in tests/rewards/test_mr_embedded.py: math accuracy by rule (the 135M model copies the accuracy
    # judge's template), interactivity by the judge (paper rubric, prefilled reply).
    env = default_reward(base, judge=model, user=user, policy=model, num_rollouts=args.rollouts,
                         weights={"accuracy_rule": 1.0, "interactivity": 1.0, "token_amount": -1e-4},
                         rubric="paper", sampling=sampling, judge_kwargs={"max_new_tokens": 40, "max_retries": 1})
    await env.areset(seed=11, options={"index": 0})
    reply = "Happy to help. Which numbers would you like to add?"
    # Take the reply with the base env, then score its futures both ways from the same state.
    state = env.unwrapped.episode
    start, step = len(state.messages), state.step
    await env.env.astep({"assistant": reply})

    await model.act([base.observe("assistant")], max_new_tokens=2)  # warm-up, not timed
    s0, t0 = _stats(model), time.perf_counter()
    conc, extra = await env.score_reply(start=start, step=step)
    t_conc, c_conc = time.perf_counter() - t0, _diff(_stats(model), s0)

    s0, t0 = _stats(model), time.perf_counter()
    seq_convs, seq_rewards = [], []
    for r in range(args.rollouts):
        out = await env.roll_future(env.env.clone(), r, step)
        conv, fault = out["conversation"], out["fault"]
        assert fault is None, fault
        one = await env.metric_set.score([conv], state.item, start=start, player="assistant")
        seq_convs.append(conv)
        seq_rewards.append(one.values)
    t_seq, c_seq = time.perf_counter() - t0, _diff(_stats(model), s0)

    futures = extra["futures"]
    same = all(f == [m.to_dict() for m in c.messages[start:]] for f, c in zip(futures, seq_convs, strict=True))
    same_values = all(
        conc.values[m][i] == seq_rewards[i][m][0] for m in conc.values for i in range(args.rollouts)
    ) if len(conc.scored) == args.rollouts else False
    print(f"MR of one reply: {args.rollouts} rollouts, window 2 user / 3 assistant turns, "
          f"weights {env.weights}, aggregation {env.aggregation}")
    print(f"reward {conc.reward:+.4f}; per metric mean: "
          + ", ".join(f"{m}={v['mean']:.3f}" for m, v in conc.summary(env.weights).items())
          + f"; faults {len(conc.faults)}")
    print(f"identical futures: {same}; identical metric values: {same_values}")
    for name, t, c in (("concurrent", t_conc, c_conc), ("sequential", t_seq, c_seq)):
        print(f"{name:>10}: {t:7.2f} s  model calls (generate) {c['generate_calls']:4.0f}  requests "
              f"{c['requests']:4.0f}  prompt tokens {c['prompt_tokens']:6.0f}  completion tokens "
              f"{c['completion_tokens']:5.0f}")
    print(f"sequential / concurrent wall time: {t_seq / t_conc:.2f}x; "
          f"generate calls {c_seq['generate_calls'] / max(c_conc['generate_calls'], 1):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
