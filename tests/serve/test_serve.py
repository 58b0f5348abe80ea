"""collab-env serve (issue 44): registered envs served over OpenEnv in a separate process, played
by the matching client; TRL's GRPO trains against them; bad input over the wire gets an error to
its client and leaves the server serving, with its sessions cleaned up."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

pytest.importorskip("openenv")

from collab_env.errors import ConfigError, ServedEnvError  # noqa: E402
from collab_env.serve import remote_env, served_url  # noqa: E402
from collab_env.serve.client import CollabEnvClient  # noqa: E402
from collab_env.testing.served import open_sessions, served  # noqa: E402

MAX_SESSIONS = 3
MAX_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def letters_url():
    """letter-requests-v0 (multi-turn, a dense per-turn reward) served with small limits."""
    with served("letter-requests-v0", "--max-sessions", str(MAX_SESSIONS), "--max-message-bytes",
                str(MAX_BYTES)) as url:
        yield url


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


# -- the protocol --------------------------------------------------------------------------------


def test_a_served_episode_is_the_seats_view_with_the_other_moves_reward_and_end(letters_url):
    schema = _get(letters_url + "/schema")
    info = schema["observation"]["collab_env"]
    assert info["env_id"] == "letter-requests-v0" and info["seat"] == "assistant" and info["role"] == "assistant"
    assert schema["observation"]["card"]["tests"]  # the env's card, on the schema route
    assert set(schema["action"]["properties"]) == {"message", "fork", "metadata"}
    with CollabEnvClient(letters_url) as client:
        first = client.reset(seed=3, index=1)
        obs = first.observation
        assert obs["index"] == 1 and not first.done and obs["messages"][-1]["role"] == "user"
        again = client.reset(seed=3, index=1).observation  # same item and seed: same opening
        assert again["messages"] == obs["messages"]
        rewards, steps, result = [], 0, first
        while not result.done:
            result = client.step("a reply that uses some letters " * 3)
            steps += 1
            rewards.append(result.reward)
            if not result.done:  # the user answered: its move is reported and in the view
                moves = result.observation["other_moves"]
                assert [m["player"] for m in moves] == ["user"]
                assert result.observation["messages"][-1]["content"] == moves[0]["text"]
        assert steps == 3 and result.observation["end_reason"] and all(0.0 <= r <= 1.0 for r in rewards)
        with pytest.raises(ServedEnvError, match="episode has ended"):
            client.step("one more")
    assert open_sessions(letters_url) == 0


def test_the_remote_env_plays_like_a_local_one_through_the_driver(letters_url):
    import collab_env
    from collab_env.policy import FixedTextPolicy
    from collab_env.rollout import run_episode

    env = remote_env(letters_url)
    try:
        assert env.possible_agents == ["assistant"] and env.task.num_items() == \
            collab_env.make("letter-requests-v0").unwrapped.task.num_items()
        remote = run_episode(env, {"assistant": FixedTextPolicy("abc def ghi " * 4)}, seed=5, index=2)
    finally:
        env.close()
    local_env = collab_env.make("letter-requests-v0")
    local = run_episode(local_env, {"assistant": FixedTextPolicy("abc def ghi " * 4),
                                    "user": local_env.spec.default_policies["user"]}, seed=5, index=2)
    # the same item, seed and moves: the same rewards and the same text the seat saw
    assert remote.returns["assistant"] == pytest.approx(local.returns["assistant"]) and remote.returns["assistant"] > 0
    assert [t.text for t in remote.turns] == [t.text for t in local.turns if t.player == "assistant"]
    assert remote.end_reason == local.end_reason
    assert [m.content for m in remote.conversation] == \
        [m.content for m in local.conversation.view("assistant")]
    assert open_sessions(letters_url) == 0


def test_served_url_recognises_urls_and_clients_only(letters_url):
    assert served_url(letters_url) == letters_url
    assert served_url("letter-requests") is None and served_url(len) is None
    client = CollabEnvClient(letters_url.replace("http://", "ws://"))
    assert served_url(client) == letters_url
    with pytest.raises(ConfigError, match="not 'user'"):
        remote_env(letters_url, player="user")


# -- bad input over the wire ---------------------------------------------------------------------


def test_bad_input_gets_an_error_and_the_server_keeps_serving(letters_url):
    from websockets.sync.client import connect

    with CollabEnvClient(letters_url) as client:
        with pytest.raises(ServedEnvError, match="no episode in progress"):
            client.step("before any reset")
        with pytest.raises(ServedEnvError, match=r"unknown keyword\(s\) \['bogus'\]"):
            client.reset(bogus=1)
        with pytest.raises(ServedEnvError, match="index must be an int"):
            client.reset(index="two")
        client.reset(seed=0)
        with pytest.raises(ServedEnvError, match=r"VALIDATION_ERROR.*extra: Extra inputs are not permitted"):
            client.step({"message": "hi", "extra": 1})
        with pytest.raises(ServedEnvError, match="VALIDATION_ERROR.*message: Field required"):
            client.step({"text": "hi"})
        assert client.step("still playing").reward is not None  # the session survived its errors
    # a message over --max-message-bytes: that connection is closed with 1009, nobody else's
    with CollabEnvClient(letters_url) as client:
        client.reset(seed=0)
        with pytest.raises(ServedEnvError, match="1009.*larger than the server's --max-message-bytes"):
            client.step("x" * (MAX_BYTES + 10))
    # a connection dropped mid-episode (no close message): its session is freed
    with connect(letters_url.replace("http://", "ws://") + "/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        assert json.loads(ws.recv(timeout=60))["type"] == "observation"
        ws.socket.close()
    assert open_sessions(letters_url) == 0
    with connect(letters_url.replace("http://", "ws://") + "/ws") as ws:  # not JSON at all
        ws.send("{not json")
        assert json.loads(ws.recv(timeout=60))["data"]["code"] == "INVALID_JSON"
    with CollabEnvClient(letters_url) as client:  # and the server still plays whole episodes
        assert not client.reset(seed=2).done
    assert open_sessions(letters_url) == 0


def test_a_flood_of_sessions_beyond_the_limit_is_refused_and_cleaned_up(letters_url):
    clients = [CollabEnvClient(letters_url) for _ in range(MAX_SESSIONS + 2)]
    try:
        for c in clients[:MAX_SESSIONS]:
            c.reset(seed=0)
        assert _get(letters_url + "/sessions") == {"active": MAX_SESSIONS, "max": MAX_SESSIONS}
        for c in clients[MAX_SESSIONS:]:
            with pytest.raises(ServedEnvError, match="CAPACITY_REACHED"):
                c.reset(seed=0)
        assert clients[0].step("the first sessions play on").reward is not None
    finally:
        for c in clients:
            c.close()
    assert open_sessions(letters_url) == 0
    with CollabEnvClient(letters_url) as client:
        assert not client.reset(seed=0).done


def test_serve_refuses_bad_options_in_one_line(capsys):
    from collab_env.cli import main

    for args, expect in ((["no-such-env"], "no-such-env"),
                         (["letter-requests", "--seat", "judge"], "seat 'judge' is not a player"),
                         (["letter-requests", "--judge", "litellm:openai/x"], "--judge and --reward-arg"),
                         (["letter-requests", "--max-sessions", "0"], "max_sessions must be an int >= 1"),
                         (["letter-requests", "--api-base", "user=http://127.0.0.1:9/v1"], "no --policy user=SPEC")):
        assert main(["serve", *args, "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("collab-env: error:") and expect in err and "Traceback" not in err, err


# -- TRL's GRPO against a served env -------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["length-ratio", "letter-requests-v0"])
def test_grpo_trains_against_a_served_env(env_id, tiny_dir, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    from collab_env.adapters import trl as ce_trl
    from collab_env.testing.tiny_model import load_tiny_chat_model

    with served(env_id) as url:
        torch.manual_seed(0)
        model, tok = load_tiny_chat_model(tiny_dir)
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=12, max_steps=2, logging_steps=1, report_to=[], use_cpu=True,
                          save_strategy="steps", save_steps=2, learning_rate=1e-2, seed=0)
        fn = ce_trl.rollout_func(url)
        rewards: list[float] = []

        def reward(completions, **kwargs):
            rewards.extend(kwargs["episode_reward"])
            return ce_trl.episode_reward(completions, **kwargs)

        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tok,
                              train_dataset=ce_trl.dataset(url, n=2), rollout_func=fn)
        trainer.train()
        episodes = fn.last_episodes
        assert episodes and all(ep.turns for ep in episodes) and len(rewards) == 4
        if env_id.startswith("letter-requests"):  # multi-turn: the trained seat played several turns
            assert max(len(ep.turns) for ep in episodes) > 1
        assert any(r > 0 for r in rewards), rewards  # a non-zero reward to learn from
        fn.close()
        assert open_sessions(url) == 0  # the server is left with no session
    changed = [k for k, v in trainer.model.named_parameters() if not torch.equal(v.detach().cpu(), before[k].cpu())]
    assert changed, "two GRPO steps against the served env left the parameters unchanged"
    ckpt = tmp_path / "out" / "checkpoint-2"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "trainer_state.json").is_file()


# -- the other routes that take env=URL ----------------------------------------------------------


def test_trls_tool_route_plays_a_served_env(letters_url):
    pytest.importorskip("trl")
    from collab_env.adapters import trl as ce_trl

    rows = ce_trl.dataset_rows(letters_url, n=1)
    tool_env = ce_trl.environment_factory(letters_url)()
    assert tool_env.reset(**rows[0]) is None  # the row's prompt is the seat's first observation
    reply = tool_env.send_message("abc def ghi " * 4)
    assert reply.startswith("user: ") and len(reply) > len("user: ")  # the server's user answered
    while "[the conversation has ended]" not in reply:
        reply = tool_env.send_message("abc def ghi " * 4)
    assert tool_env.get_reward() > 0
    tool_env._view.close()
    assert open_sessions(letters_url) == 0


def test_magrpo_trains_against_a_served_env_branching_on_the_server(tiny_dir, tmp_path):
    """The learners resolve env=URL in the one place (TaskSource): the served seat is the env.
    MAGRPO branches every episode (env.clone() after the reset and at every joint action): each
    branch is a copy made on the server (fork, then adopt), so it trains as on a local env, and
    every branch's session is closed once the trees are grown."""
    pytest.importorskip("torch")
    import torch

    import collab_env.adapters.magrpo as magrpo
    from collab_env.testing.tiny_model import load_tiny_chat_model

    model, tok = load_tiny_chat_model(tiny_dir)
    before = [p.detach().clone() for p in model.parameters()]
    args = magrpo.MAGRPOConfig(num_agents=1, num_turns=2, num_generations=2, max_new_tokens=12, max_steps=1,
                               eval_interval=0, eval_num_samples=1, logging_steps=1, learning_rate=1e-2,
                               output_dir=str(tmp_path / "out"), plot=False)
    with served("letter-requests-v0", "--max-sessions", "8") as url:
        trainer = magrpo.MAGRPOTrainer(agent_model=model, tokenizer=tok, env=url, args=args)
        assert trainer.task.players == ("assistant",) and type(trainer.task.train_env).__name__ == "RemoteEnv"
        trainer.train()
        assert trainer.state.env_step == 2 + 4  # 2 joint actions at turn 1, 2 x 2 at turn 2: 6 branches
        assert open_sessions(url) == 0
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.models[0].model.parameters(), strict=True))


def test_a_remote_env_branches_a_started_episode_on_the_server(letters_url):
    env = remote_env(letters_url)
    fresh = env.clone()  # before a reset a clone is a new session on the same server
    assert fresh is not env and fresh.task.client is not env.task.client
    obs, _ = fresh.reset(seed=0, options={"index": 1})
    fresh.step({"assistant": "abc def"})
    branch = fresh.clone()  # a copy made on the server, in a session of its own
    assert branch.task.client is not fresh.task.client
    assert [m.content for m in branch.episode.messages] == [m.content for m in fresh.episode.messages]
    a = fresh.step({"assistant": "one two three four five six"})
    b = branch.step({"assistant": "x"})
    assert a[1]["assistant"] != b[1]["assistant"]  # the two continue independently
    assert len(branch.episode.messages) == len(fresh.episode.messages)
    client = CollabEnvClient(letters_url)
    try:
        token = branch.task.fork()
        with pytest.raises(ServedEnvError, match="takes no seed"):
            client.reset(fork=token, seed=3)
        client.reset(fork=token)
        with pytest.raises(ServedEnvError, match="no parked episode has that fork token"):
            client.reset(fork=token)  # adopted once
        with pytest.raises(ServedEnvError, match="either a message or fork"):
            client.step({"message": "hi", "fork": True})
    finally:
        client.close()
    for e in (env, fresh, branch):
        e.close()
    assert open_sessions(letters_url) == 0


def test_mr_futures_play_the_trained_policy_at_the_sessions_api_base(monkeypatch, letters_url):
    """--reward mr with --policy SEAT=SPEC: each session's reset(api_base=URL) sends the futures'
    moves of the served seat to that endpoint (a real OpenAI-compatible server here); a session
    without it uses the spec as given, and api_base on a server without MR is refused."""
    pytest.importorskip("litellm")
    from collab_env.testing.openai_server import FakeOpenAIServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    weights = json.dumps({"accuracy_rule": 1.0, "token_amount": -0.01})
    with FakeOpenAIServer() as trained, served(
            "hidden-facts-easy", "--reward", "mr", "--policy", "assistant=litellm:openai/trained",
            "--reward-arg", f"weights={weights}", "--reward-arg", "num_rollouts=1",
            "--reward-arg", "max_user_turns=2", "--reward-arg", "max_assistant_turns=3") as url:
        with CollabEnvClient(url) as client:
            client.reset(seed=0, api_base=trained.url)
            result = client.step("How many apples are there?")
            assert "mr" in result.observation["reward_components"]
        assert [r.get("model") for r in trained.requests] == ["trained"], "the futures did not call the endpoint"
        assert open_sessions(url) == 0
    with CollabEnvClient(letters_url) as client:  # served without MR
        with pytest.raises(ServedEnvError, match="no --reward mr"):
            client.reset(api_base="http://127.0.0.1:9/v1")
