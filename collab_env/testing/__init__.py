"""Test doubles and small real fixtures for tests, benchmarks and users' own tests.

The library's runtime code never imports this package; ``import collab_env`` does not load it.

* :mod:`collab_env.testing.tiny_model`: a tiny random chat model (byte-level BPE tokenizer with a
  ChatML template, 2-layer Qwen2) built locally in a fraction of a second (extra: ``hf``).
* :mod:`collab_env.testing.openai_server`: a fake OpenAI-compatible chat-completions server on
  127.0.0.1 with fault injection and API-key checks (needs ``aiohttp``; extra: ``testing``).
* :mod:`collab_env.testing.collabllm_fixtures`: small CollabLLM data files in the published
  schemas (plain and ``-large`` session layouts; jsonl, json, parquet, a local hub folder).
* :mod:`collab_env.testing.judge_conversations`: a judge double that reads the accuracy rubric by
  rule (the judge validity check's positive control; the rule-labelled conversations it is
  checked on are :mod:`collab_env.eval.judge_check`'s).
* :mod:`collab_env.testing.judge_injection`: judge-injection texts and a judge double that obeys
  any score claim found outside the prompt's fences (fence tests, the injection benchmark).
* :mod:`collab_env.testing.user_injection`: a user-simulator backend double that obeys any
  user-aimed instruction found outside the prompt's fences, leaking its whole goal (the user
  injection tests and ``benchmarks/bench_user_injection.py``).
"""
