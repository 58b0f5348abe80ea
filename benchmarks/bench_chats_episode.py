"""Record one full ``math-chat`` / ``humaneval-chat`` episode with the embedded model as both the
assistant and the user (the LLM user simulator), then replay it from the record/replay cache
with no model and check that the two episodes are bit-identical.

Usage (the lead's full run on a quiet machine uses the same command; it takes a few minutes)::

    python -m benchmarks.bench_chats_episode --env math-chat --seed 0
    python -m benchmarks.bench_chats_episode --env humaneval-chat --seed 0

Writes ``benchmarks/results/chats_{math,humaneval}_episode.json`` (the transcript, the episode
with every completion, the conversation reward and its components, timings) and the cache file
``benchmarks/results/chats_{math,humaneval}_cache.sqlite`` that ``tests/tasks/test_chats.py``
replays offline.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
#: The assistant's sampling in the recorded episode (part of every cache key).
ASSISTANT_SAMPLING = {"temperature": 0.7, "max_new_tokens": 192}


def play(env_id: str, seed: int, cache_path: Path, mode: str):
    """One episode of ``env_id`` (conversation reward) with both players behind the cache."""
    import collab_env
    from collab_env.agents import CachedPolicy, ResponseCache
    from collab_env.policy import FixedTextPolicy
    from collab_env.rollout import run_episode
    from collab_env.tasks.chats import EmbeddedChatUser, shared_backend

    from benchmarks.bench_chats_baselines import judge_free

    cache = ResponseCache(cache_path, mode)
    # Replay needs no model: a stand-in backend that is never called, under the same key name.
    backend = shared_backend("embedded") if mode == "record" else FixedTextPolicy("")
    policy = CachedPolicy(backend, cache, name_for_key="embedded")
    env = collab_env.make(env_id, reward="conversation", **judge_free(env_id))
    try:
        # recorded before issue 43 on the unfenced simulator prompt: replayed as recorded
        return run_episode(env, {"assistant": policy, "user": EmbeddedChatUser(backend=policy, fence_transcript=False)},
                           seed=seed, sampling={"assistant": dict(ASSISTANT_SAMPLING)})
    finally:
        cache.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", choices=("math-chat", "humaneval-chat"), required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    short = args.env.split("-")[0]
    cache_path = RESULTS / f"chats_{short}_cache.sqlite"
    out = RESULTS / f"chats_{short}_episode.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "cache.sqlite"
        t0 = time.perf_counter()
        recorded = play(args.env, args.seed, work, "record")
        t1 = time.perf_counter()
        replayed = play(args.env, args.seed, work, "replay")
        t2 = time.perf_counter()
        a = json.dumps(recorded.to_dict(), sort_keys=True)
        b = json.dumps(replayed.to_dict(), sort_keys=True)
        shutil.copyfile(work, cache_path)
    info = recorded.info
    result = {
        "env_id": recorded.env_id,
        "seed": args.seed,
        "command": f"python -m benchmarks.bench_chats_episode --env {args.env} --seed {args.seed}",
        "assistant": "embedded (SmolLM2-135M-Instruct), sampling " + json.dumps(ASSISTANT_SAMPLING),
        "user": "chat-llm-user (LLMUserSimulator on the embedded model, plain replies)",
        "bit_identical_replay": a == b,
        "record_s": round(t1 - t0, 2),
        "replay_s": round(t2 - t1, 2),
        "end_reason": recorded.end_reason,
        "conversation_reward": recorded.returns.get("assistant"),
        "components": recorded.components.get("assistant"),
        "transcript": [{"player": m.author, "role": m.role, "text": m.content}
                       for m in recorded.conversation if m.role != "system"],
        "episode": json.loads(a),
        "info_keys": sorted(info),
    }
    out.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    print(json.dumps({k: result[k] for k in ("env_id", "bit_identical_replay", "record_s", "replay_s",
                                              "end_reason", "conversation_reward", "components")}))
    return 0 if a == b else 1


if __name__ == "__main__":
    sys.exit(main())
