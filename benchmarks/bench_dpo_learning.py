"""DPO learns a preference: the preferred behaviour rises on the tiny model (seconds on CPU).

Two runs on the tiny random chat model of ``collab_env/testing/tiny_model.py`` (or ``--model``):

* **online** (:class:`~collab_env.adapters.dpo.OnlineDPOTrainer`): ``hidden-facts-easy`` whose
  assistant reward is the multiturn-aware reward with window 0 and the single metric
  ``token_amount`` at weight -1 (the ``collabllm`` sum rule, so a reply's reward is minus its
  word count). For each training item the policy samples ``--candidates`` replies, the env ranks
  them, the shortest against the longest is a DPO pair. Reported: the evaluation reward (minus
  words per reply, sampled at the training temperature over ``--eval-items`` items) and the reply
  length in tokens, before and after.
* **offline** (:class:`~collab_env.adapters.dpo.DPOTrainer`): CollabLLM-style pairs where the
  chosen reply asks a clarifying question and the rejected one guesses; reported: held-out
  implicit-reward accuracy and the chosen-minus-rejected log-prob margin, before and after.

    python benchmarks/bench_dpo_learning.py --out /tmp/bench_dpo

Writes ``<out>/online/metrics.jsonl`` (+ ``curves.png``), ``<out>/offline/...`` and prints a JSON
summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _short_is_better():
    import collab_env
    from collab_env.rewards.mr import MultiturnAwareReward

    return MultiturnAwareReward(collab_env.make("hidden-facts-easy"), max_user_turns=0,
                                weights={"token_amount": -1.0}, aggregation="collabllm")


def _offline_pairs(n: int, offset: int) -> list[dict]:
    topics = ["the sum", "the capital", "the colour", "the weight", "the answer", "the size", "the box", "the ball"]
    rows = []
    for i in range(offset, offset + n):
        t = topics[i % len(topics)]
        prompt = [{"role": "user", "content": f"Tell me {t} of object {i}."}]
        rows.append({"prompt": prompt,
                     "chosen": [{"role": "assistant", "content": f"Could you tell me more about {t}?"}],
                     "rejected": [{"role": "assistant", "content": f"It is {i * 7 % 13}."}]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="'tiny', 'embedded' or a model folder")
    p.add_argument("--items", type=int, default=24, help="online training items")
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--eval-items", type=int, default=16)
    p.add_argument("--pairs", type=int, default=16, help="offline training pairs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_dpo_output")
    args = p.parse_args(argv)

    from collab_env.adapters.dpo import DPOConfig, DPOTrainer, OnlineDPOConfig, OnlineDPOTrainer

    def load():
        if args.model != "tiny":
            return args.model, None
        from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model

        return load_tiny_chat_model(build_tiny_chat_model(Path(tempfile.mkdtemp()) / "tiny", seed=args.seed))

    summary: dict = {"model": args.model}
    # -- online ----------------------------------------------------------------------------------
    model, tok = load()
    cfg = OnlineDPOConfig(num_candidates=args.candidates, max_new_tokens=args.max_new_tokens, max_steps=args.items,
                          per_device_train_batch_size=2, learning_rate=args.learning_rate, beta=0.1,
                          eval_interval=4, eval_num_samples=args.eval_items, eval_batch_size=args.eval_items,
                          eval_greedy=False, max_length=2048, seed=args.seed, output_dir=f"{args.out}/online")
    trainer = OnlineDPOTrainer(agent_model=model, tokenizer=tok, env=_short_is_better(),
                               eval_env=_short_is_better(), args=cfg)
    t0 = time.time()
    before = trainer.evaluate()
    last = trainer.train()
    after = trainer.evaluate()
    summary["online"] = {
        "eval_reward_before": before["eval/reward_mean"], "eval_reward_after": after["eval/reward_mean"],
        "reply_tokens_before": before["eval/completion_length"], "reply_tokens_after": after["eval/completion_length"],
        "preference_updates": trainer.state.optimizer_steps, "last_train": last, "seconds": round(time.time() - t0, 1),
    }
    # -- offline ---------------------------------------------------------------------------------
    model, tok = load()
    dcfg = DPOConfig(learning_rate=args.learning_rate, beta=0.1, num_train_epochs=3, per_device_train_batch_size=4,
                     eval_interval=0, eval_num_samples=16, eval_batch_size=8, seed=args.seed,
                     output_dir=f"{args.out}/offline")
    dpo = DPOTrainer(agent_model=model, tokenizer=tok, train_dataset=_offline_pairs(args.pairs, 0),
                     eval_dataset=_offline_pairs(8, 1000), args=dcfg)
    t0 = time.time()
    b = dpo.evaluate()
    dpo.train()
    e = dpo.evaluate()
    summary["offline"] = {
        "heldout_reward_accuracy_before": b["eval/reward_accuracy"], "heldout_reward_accuracy_after": e["eval/reward_accuracy"],
        "heldout_logp_margin_before": b["eval/chosen_logp"] - b["eval/rejected_logp"],
        "heldout_logp_margin_after": e["eval/chosen_logp"] - e["eval/rejected_logp"],
        "heldout_loss_before": b["eval/loss"], "heldout_loss_after": e["eval/loss"],
        "seconds": round(time.time() - t0, 1),
    }
    print(json.dumps(summary, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
