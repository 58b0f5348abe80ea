"""Record/replay cache: keys, hits, replay misses, concurrent writers, a replayed evaluation."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import pickle
import sqlite3

import pytest

import collab_env
from collab_env.agents.cache import CachedPolicy, ResponseCache, request_key
from collab_env.agents.users import LLMUserSimulator
from collab_env.errors import CacheMissError, CollabEnvError, ConfigError
from collab_env.rollout import run_episode
from collab_env.tasks.hidden_facts import AskThenAnswer
from collab_env.types import FAULT, Completion, Conversation, Message

SIGNAL = "[[TERMINATE CHAT]]"


class CountingLLM:
    """Replies ``f(prompt)`` (default: an echo with a call number) and counts its calls."""

    def __init__(self, fn=None, name="fake-model"):
        self.fn = fn
        self.calls = 0
        self.requests = 0
        self.name = name

    async def act(self, observations, **sampling):
        self.calls += 1
        out = []
        for o in observations:
            self.requests += 1
            text = self.fn("\n".join(m.content for m in o)) if self.fn else f"reply#{self.requests} to {o[-1].content}"
            out.append(Completion(text=text, token_ids=(1, 2), finish_reason="stop",
                                  usage={"model_calls": 1, "prompt_tokens": 7}, meta={"seed": sampling.get("seed")}))
        return out


class MustNotBeCalled:
    name = "offline"

    async def act(self, observations, **sampling):
        raise AssertionError("the backend was called during replay")


def obs(text: str, author: str = "user") -> Conversation:
    return Conversation((Message(role="system", content="sys"), Message(role="user", content=text, author=author)))


def run(coro):
    return asyncio.run(coro)


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------
def test_key_is_stable_and_content_addressed():
    k = request_key("m", obs("hi"), {"seed": 1})
    assert k == request_key("m", obs("hi"), {"seed": 1})
    assert len(k) == 64
    # Only (role, content) of the messages count: who authored them does not.
    assert k == request_key("m", obs("hi", author="someone"), {"seed": 1})
    # Defaults filled in: explicit default sampling is the same request.
    assert request_key("m", obs("hi"), {}) == request_key("m", obs("hi"), {"temperature": 1.0, "top_p": 1.0})
    different = [
        request_key("other", obs("hi"), {"seed": 1}),
        request_key("m", obs("hi!"), {"seed": 1}),
        request_key("m", obs("hi"), {"seed": 2}),  # same prompt, another seed: a distinct request
        request_key("m", obs("hi"), {"seed": 1, "temperature": 0}),
    ]
    assert len(set(different + [k])) == 5


# ---------------------------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------------------------
def test_record_miss_then_hit(tmp_path):
    backend = CountingLLM()
    cache = ResponseCache(tmp_path / "c.sqlite", mode="record")
    pol = CachedPolicy(backend, cache)
    first = run(pol.act([obs("a"), obs("b")], seed=0))
    assert backend.calls == 1 and backend.requests == 2 and len(cache) == 2
    again = run(pol.act([obs("b"), obs("a"), obs("c")], seed=0))
    assert backend.calls == 2 and backend.requests == 3  # only "c" went to the backend
    assert again[:2] == [first[1], first[0]]
    assert cache.stats == {"hits": 2, "misses": 3, "writes": 3}
    # Another seed is another request.
    run(pol.act([obs("a")], seed=1))
    assert backend.requests == 4


def test_replay_hits_and_miss_error(tmp_path):
    path = tmp_path / "c.sqlite"
    recorded = run(CachedPolicy(CountingLLM(), ResponseCache(path), name_for_key="fake-model").act([obs("a")], seed=5))
    replay = CachedPolicy(MustNotBeCalled(), ResponseCache(path, mode="replay"), name_for_key="fake-model")
    assert run(replay.act([obs("a")], seed=5)) == recorded
    with pytest.raises(CacheMissError) as err:
        run(replay.act([obs("a")], seed=6))
    msg = str(err.value)
    key = request_key("fake-model", obs("a"), {"seed": 6})
    assert key in msg and "mode='record'" in msg
    assert isinstance(err.value, CollabEnvError)
    with pytest.raises(ConfigError, match="record it first"):
        ResponseCache(tmp_path / "missing.sqlite", mode="replay")


def test_off_passes_through(tmp_path):
    backend = CountingLLM()
    pol = CachedPolicy(backend, tmp_path / "c.sqlite", mode="off")
    run(pol.act([obs("a")]))
    run(pol.act([obs("a")]))
    assert backend.calls == 2 and not (tmp_path / "c.sqlite").exists()


def test_faults_are_not_stored(tmp_path):
    class Faulty:
        name = "faulty"

        async def act(self, observations, **kw):
            return [Completion(text="", finish_reason=FAULT, meta={"fault": "rate limit"}) for _ in observations]

    cache = ResponseCache(tmp_path / "c.sqlite")
    [c] = run(CachedPolicy(Faulty(), cache).act([obs("a")]))
    assert c.is_fault and len(cache) == 0


def test_stored_record_and_pickling(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    run(CachedPolicy(CountingLLM(), cache).act([obs("a")], seed=1))
    row = sqlite3.connect(tmp_path / "c.sqlite").execute("SELECT model, request, completion FROM responses").fetchone()
    assert row[0] == "fake-model"
    assert json.loads(row[1])["messages"] == [["system", "sys"], ["user", "a"]]
    assert json.loads(row[2])["token_ids"] == [1, 2]
    assert sqlite3.connect(tmp_path / "c.sqlite").execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    clone = pickle.loads(pickle.dumps(cache))
    assert len(clone) == 1 and clone.mode == "record"


def test_default_key_name(tmp_path):
    class Api(CountingLLM):
        model = "gpt-x"

    class Local(CountingLLM):
        model = object()  # e.g. a torch module: never part of a key

    cache = ResponseCache(tmp_path / "c.sqlite")
    assert CachedPolicy(Api(), cache).name_for_key == "gpt-x"
    local = CachedPolicy(Local(name="hf:tiny"), cache)
    assert local.name_for_key == "hf:tiny" and local.name == "cached(hf:tiny)"


def test_bad_arguments(tmp_path):
    with pytest.raises(ConfigError):
        ResponseCache(tmp_path / "c.sqlite", mode="write")
    with pytest.raises(ConfigError, match="conflicts"):
        CachedPolicy(CountingLLM(), ResponseCache(tmp_path / "c.sqlite"), mode="replay")


# ---------------------------------------------------------------------------------------------
# Several processes writing at once
# ---------------------------------------------------------------------------------------------
def _writer(path: str, worker: int, n: int) -> None:
    cache = ResponseCache(path, mode="record", busy_timeout_s=60)
    for i in range(n):
        # Half the keys are private to this worker, half are shared by all workers (races).
        text = f"w{worker}-{i}" if i % 2 else f"shared-{i}"
        key = request_key("m", obs(text), {})
        cache.put(key, {"model": "m"}, Completion(text=f"{text} by {worker}"))
        assert cache.get(key) is not None
    cache.close()


def test_concurrent_writers(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    ResponseCache(path).close()  # create the schema once, as a run would
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 50)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    cache = ResponseCache(path, mode="replay")
    assert len(cache) == 4 * 25 + 25  # private keys + shared keys stored once
    for i in range(0, 50, 2):
        got = cache.get(request_key("m", obs(f"shared-{i}"), {}))
        assert got is not None and got.text.startswith(f"shared-{i} by ")
    for w in range(4):
        for i in range(1, 50, 2):
            assert cache.get(request_key("m", obs(f"w{w}-{i}"), {})).text == f"w{w}-{i} by {w}"


# ---------------------------------------------------------------------------------------------
# A recorded evaluation replays to identical episodes with no model call
# ---------------------------------------------------------------------------------------------
def _user_reply(prompt: str) -> str:
    chat = prompt.split("## The conversation so far", 1)[-1]
    if "\\boxed" in chat:
        return json.dumps({"current_answer": "done", "thought": "t", "response": f"Thanks! {SIGNAL}"})
    facts = [ln[2:] for ln in prompt.splitlines() if ln.startswith("- ") and any(c.isdigit() for c in ln)]
    # The first reply of every episode is broken JSON: the recorded run exercises retries too.
    if "could not be read" not in prompt and chat.count("**Assistant**") == 1:
        return "{'thought': broken"
    return json.dumps({"current_answer": "", "thought": "tell them", "response": " ".join(facts)})


def _episodes(cache_path, mode, backend):
    user = LLMUserSimulator(CachedPolicy(backend, ResponseCache(cache_path, mode=mode), name_for_key="fake-user-llm"))
    out = []
    for seed in range(4):
        env = collab_env.make("hidden-facts-hard")
        out.append(run_episode(env, {"assistant": AskThenAnswer(), "user": user}, seed=seed).to_dict())
        env.close()
    return out


def test_recorded_evaluation_replays_identically(tmp_path):
    path = tmp_path / "eval.sqlite"
    backend = CountingLLM(_user_reply)
    recorded = _episodes(path, "record", backend)
    assert backend.requests >= 8  # each episode: one broken reply, then its retry, then more
    assert all(ep["end_reason"] == "answered" for ep in recorded)
    replayed = _episodes(path, "replay", MustNotBeCalled())
    assert replayed == recorded
    # Recording again hits the cache for every request.
    again = CountingLLM(_user_reply)
    assert _episodes(path, "record", again) == recorded and again.calls == 0


# ---------------------------------------------------------------------------------------------
# Scoring continuations (log-prob judges): recorded, replayed bit for bit, mirrored
# ---------------------------------------------------------------------------------------------
class ScriptedScorer:
    """A scoring backend whose log-probs are a function of (prompt, continuation); counts calls."""

    name = "scripted-scorer"

    def __init__(self):
        self.calls = 0
        self.rows = 0

    async def act(self, observations, **sampling):
        raise AssertionError("a scoring test must not generate")

    async def score_continuations(self, observations, continuations):
        self.calls += 1
        self.rows += len(observations)
        # Floats whose shortest repr has 17 digits: exactness of the round-trip is visible.
        return [tuple(-(len(o[-1].content) + k) / 3.0 - 0.1 for k, _ in enumerate(conts))
                for o, conts in zip(observations, continuations, strict=True)]


def test_cached_policy_scores_exactly_when_its_backend_can(tmp_path):
    from collab_env.agents.base import can_score_continuations

    scorer = CachedPolicy(ScriptedScorer(), tmp_path / "a.sqlite")
    assert can_score_continuations(scorer) and scorer.scores_continuations
    plain = CachedPolicy(CountingLLM(), tmp_path / "b.sqlite")
    assert not can_score_continuations(plain)
    with pytest.raises(ConfigError, match="cannot score continuations"):
        run(plain.score_continuations([obs("a")], [["x"]]))
    # A backend that has the method but cannot use it (vLLM with LoRA) is mirrored too.
    lora = ScriptedScorer()
    lora.scores_continuations = False
    assert not can_score_continuations(CachedPolicy(lora, tmp_path / "c.sqlite"))
    # scoring=True needs a backend that scores, except in replay mode (never called there).
    with pytest.raises(ConfigError, match="scoring=True"):
        CachedPolicy(CountingLLM(), tmp_path / "b.sqlite", scoring=True)


def test_scores_are_recorded_per_observation_and_replayed_exactly(tmp_path):
    from collab_env.agents.base import add_prefill

    path = tmp_path / "s.sqlite"
    backend = ScriptedScorer()
    rec = CachedPolicy(backend, ResponseCache(path, "record"), name_for_key="m")
    conts = [["yes", "no"], ["a", "b", "c"]]
    got = run(rec.score_continuations([obs("hello"), obs("hi")], conts))
    assert got == [(-5 / 3.0 - 0.1, -6 / 3.0 - 0.1), (-2 / 3.0 - 0.1, -3 / 3.0 - 0.1, -4 / 3.0 - 0.1)]
    assert backend.calls == 1 and rec.cache.num_scores() == 2 and len(rec.cache) == 0
    # A hit and a miss in one call: only the miss reaches the backend.
    again = run(rec.score_continuations([obs("hi"), obs("new")], [["a", "b", "c"], ["z"]]))
    assert again[0] == got[1] and backend.calls == 2 and backend.rows == 3
    # The key covers the continuations and whether the last message is a prefill.
    run(rec.score_continuations([obs("hi")], [["a", "b"]]))
    pre = add_prefill(obs("hi"), "hi", "judge")
    run(rec.score_continuations([pre, obs("hi").append(Message(role="assistant", content="hi"))], [["a"], ["a"]]))
    assert backend.calls == 4 and rec.cache.num_scores() == 6

    rep = CachedPolicy(MustNotBeCalled(), ResponseCache(path, "replay"), name_for_key="m", scoring=True)
    replayed = run(rep.score_continuations([obs("hello"), obs("hi")], conts))
    assert [[x.hex() for x in row] for row in replayed] == [[x.hex() for x in row] for row in got]
    with pytest.raises(CacheMissError, match="no scores for 1 scoring request"):
        run(rep.score_continuations([obs("hello")], [["yes", "maybe"]]))
    with pytest.raises(CacheMissError):
        run(rep.score_continuations([obs("never scored")], [["yes", "no"]]))


def test_damaged_scores_are_an_error_naming_the_key(tmp_path):
    path = tmp_path / "s.sqlite"
    rec = CachedPolicy(ScriptedScorer(), ResponseCache(path, "record"), name_for_key="m")
    run(rec.score_continuations([obs("x")], [["a", "b"]]))
    rec.cache.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE scores SET scores = '[1.0]'")
    rep = CachedPolicy(MustNotBeCalled(), ResponseCache(path, "replay"), name_for_key="m", scoring=True)
    with pytest.raises(ConfigError, match="damaged"):
        run(rep.score_continuations([obs("x")], [["a", "b"]]))


def test_a_cache_file_without_the_scores_table_still_replays_and_gains_it(tmp_path):
    path = tmp_path / "old.sqlite"
    # A file as recorded before scores were cached: only the responses table.
    ResponseCache(path, "record").put(request_key("m", obs("q"), {}), {"model": "m"},
                                      Completion(text="old answer", finish_reason="stop"))
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE scores")
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["responses"]
    rep = CachedPolicy(MustNotBeCalled(), ResponseCache(path, "replay"), name_for_key="m", scoring=True)
    assert run(rep.act([obs("q")]))[0].text == "old answer"
    with pytest.raises(CacheMissError):
        run(rep.score_continuations([obs("q")], [["a"]]))
    assert rep.cache.num_scores() == 0


@pytest.fixture
def tiny_policy(tiny_dir):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from collab_env.agents.hf import HFPolicy
    from collab_env.testing.tiny_model import load_tiny_chat_model

    model, tok = load_tiny_chat_model(tiny_dir)
    return HFPolicy(model, tok, device="cpu", name="tiny")


def test_tiny_model_scores_record_then_replay_bit_for_bit(tiny_policy, tmp_path):
    from collab_env.agents.base import add_prefill, can_score_continuations

    path = tmp_path / "hf.sqlite"
    observations = [obs("The capital of France?"), add_prefill(obs("2+2?"), '{"score": ', "judge")]
    conts = [["Paris", " Rome", "\n"], ["true}", "false}"]]
    direct = run(tiny_policy.score_continuations(observations, conts))
    rec = CachedPolicy(tiny_policy, ResponseCache(path, "record"))
    assert rec.name_for_key == "tiny" and can_score_continuations(rec)
    recorded = run(rec.score_continuations(observations, conts))
    # The recording is the backend's own output (the same forward passes, the same floats).
    assert recorded == direct and all(x < 0 for row in recorded for x in row)
    calls = tiny_policy.stats.scoring_calls
    assert calls == 2
    rep = CachedPolicy(tiny_policy, ResponseCache(path, "replay"))
    replayed = run(rep.score_continuations(observations, conts))
    assert tiny_policy.stats.scoring_calls == calls  # no backend call in replay
    assert [[x.hex() for x in r] for r in replayed] == [[x.hex() for x in r] for r in recorded]
    with pytest.raises(CacheMissError):
        run(rep.score_continuations([obs("The capital of Italy?")], [["Rome"]]))


def test_cached_tiny_judge_scores_by_logprobs_and_replays_the_same_verdict(tiny_policy, tmp_path):
    from collab_env.agents.judges import LLMJudge

    path = tmp_path / "judge.sqlite"

    def judge(backend):
        return LLMJudge(backend, prompt_template='Is this correct? {text}\nReply {{"score": true|false}}',
                        score_type=bool, score_range=None)

    rec_judge = judge(CachedPolicy(tiny_policy, ResponseCache(path, "record")))
    assert rec_judge.uses_logprobs
    recorded = run(rec_judge.score(text="2+2=4"))
    assert recorded.meta["method"] == "logprob" and tiny_policy.stats.generate_calls == 0
    probs = recorded.meta["probabilities"]["score"]
    assert set(probs) == {"true", "false"} and abs(sum(probs.values()) - 1) < 1e-9  # normalised
    calls = tiny_policy.stats.scoring_calls
    # Replay behind a stand-in that cannot score: scoring=True keeps the log-prob method.
    rep_judge = judge(CachedPolicy(MustNotBeCalled(), ResponseCache(path, "replay"), name_for_key="tiny",
                                   scoring=True))
    assert rep_judge.uses_logprobs
    replayed = run(rep_judge.score(text="2+2=4"))
    assert replayed.score == recorded.score and replayed.meta == recorded.meta
    assert tiny_policy.stats.scoring_calls == calls
    with pytest.raises(CacheMissError):
        run(rep_judge.score(text="2+2=5"))
