"""collab_env.adapters.trl: TRL's GRPOTrainer trains on collab_env envs through a rollout_func
(the one driver plays every episode), with an exact env_mask; the MR details reach the reward
functions; the vLLM route and the tool route (environment_factory)."""

import functools
import inspect
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
trl = pytest.importorskip("trl")

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import collab_env  # noqa: E402
from collab_env.adapters import trl as ce_trl  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.policy import FixedTextPolicy  # noqa: E402
from collab_env.registry import latest_spec  # noqa: E402

#: the id "hidden-facts" plays (its latest version), as the progress lines name it
HF = latest_spec("hidden-facts").id

MR_KWARGS = dict(reward="mr", reward_kwargs=dict(weights={"accuracy_rule": 1.0, "token_amount": -1e-2},
                                                num_rollouts=2, max_user_turns=1, max_assistant_turns=2))


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def _trainer(tiny_dir, tmp_path, env_id, reward_funcs, *, env_kwargs=None, n=2, steps=2):
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    model, tok = _tiny(tiny_dir)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=8, max_steps=steps, logging_steps=1, report_to=[], use_cpu=True,
                      save_strategy="no", learning_rate=1e-2, seed=0)
    fn = ce_trl.rollout_func(env_id, env_kwargs=env_kwargs)
    ds = ce_trl.dataset(env_id, n=n, env_kwargs=env_kwargs)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args, train_dataset=ds, processing_class=tok,
                          rollout_func=fn)
    return trainer, fn, ds, tok


class Recorder:
    """A reward function that records the keywords TRL passes and returns the episode reward."""

    __name__ = "recorder"

    def __init__(self):
        self.calls = []

    def __call__(self, completions, **kwargs):
        self.calls.append(kwargs)
        return ce_trl.episode_reward(completions, **kwargs)


# -- the dataset ---------------------------------------------------------------------------------


def test_dataset_rows_are_the_players_first_observation_tagged_with_item_and_seed():
    ds = ce_trl.dataset("hidden-facts", n=3, seed=10)
    assert ds.column_names == ["prompt", "index", "seed"] and len(ds) == 3
    env = collab_env.make("hidden-facts")
    for i, row in enumerate(ds):
        assert (row["index"], row["seed"]) == (i, 10 + i)
        assert ce_trl.item_of(row["prompt"]) == (i, 10 + i)
        obs, _ = env.reset(seed=10 + i, options={"index": i})  # the assistant opens: no one acts first
        assert [{"role": m["role"], "content": m["content"]} for m in row["prompt"]] == obs["assistant"].to_chat()
    with pytest.raises(ConfigError, match="unlimited"):
        ce_trl.dataset("hidden-facts")
    with pytest.raises(ConfigError, match=r"collab_env.adapters.trl.dataset"):
        ce_trl.item_of([{"role": "user", "content": "hi"}])


# -- GRPOTrainer runs --------------------------------------------------------------------------------


def test_grpo_trainer_runs_two_steps_on_hidden_facts(tiny_dir, tmp_path, capsys):
    rec = Recorder()
    trainer, fn, ds, _ = _trainer(tiny_dir, tmp_path, "hidden-facts", [rec])
    trainer.train()
    assert trainer.state.global_step == 2 and len(rec.calls) == 2
    # stderr is no terminal here: the run's lines, labelled with the env and the player, and the
    # closing line naming output_dir (rollout_func added the callback; nothing was passed for it)
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(" (")[0] for ln in err if ln.startswith(f"TRL {HF} assistant: ")] == [
        f"TRL {HF} assistant: 1/2 steps", f"TRL {HF} assistant: 2/2 steps"]
    closing = [ln for ln in err if ln.startswith(f"TRL {HF} assistant finished: 2 steps; reward first ")]
    assert len(closing) == 1 and f"output_dir {(tmp_path / 'out').resolve()}: no checkpoint yet" in closing[0]
    for kw in rec.calls:
        # one completion per prompt received: per_device_train_batch_size rows, 2 copies of 1 item
        assert len(kw["episode_reward"]) == 2 and kw["index"][0] == kw["index"][1]
        assert kw["mr"] == [[], []]  # no multiturn-aware reward in this env
        assert all(r in ("answered", "user_terminated", "max_steps") for r in kw["end_reason"])
    eps = fn.last_episodes
    assert [e.returns["assistant"] for e in eps] == rec.calls[-1]["episode_reward"]
    assert [e.index for e in eps] == rec.calls[-1]["index"] and [e.seed for e in eps] == rec.calls[-1]["seed"]
    # every episode went through the driver with the trainer's model as the assistant
    assert all(t.completion.token_ids for e in eps for t in e.turns if t.player == "assistant")


def test_grpo_trainer_runs_two_steps_on_an_mr_env_and_the_mr_details_reach_the_reward(tiny_dir, tmp_path):
    rec = Recorder()
    trainer, fn, ds, _ = _trainer(tiny_dir, tmp_path, "hidden-facts-easy", [rec], env_kwargs=MR_KWARGS)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 2
    # token_amount differs between the two copies, so the advantages are not zero and GRPO steps
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    for kw in rec.calls:
        for reward, mr, comps in zip(kw["episode_reward"], kw["mr"], kw["reward_components"], strict=True):
            assert mr, "every episode has at least one assistant turn scored by the MR"
            for turn in mr:
                assert turn["aggregation"] == "verl" and turn["num_rollouts"] == 2
                tok_amount = turn["metrics"]["token_amount"]
                # verl rule: clamp(weight * mean over futures); values are word counts
                expected = max(-1.0, min(1.0, -1e-2 * sum(tok_amount["values"]) / len(tok_amount["values"])))
                assert tok_amount["contribution"] == pytest.approx(expected, abs=1e-12)
            # the MR replaces the assistant's reward at every one of its turns; user steps give it 0
            # (same additions in the same order, so equal up to float rounding of a few terms)
            assert reward == pytest.approx(sum(t["reward"] for t in mr), abs=1e-9)
            assert comps["mr"] == pytest.approx(reward, abs=1e-9)


def test_tool_route_on_an_mr_env_scores_each_message_with_the_futures():
    """send_message is the assistant's reply: on an MR env get_reward() is the MR's return of the
    episode, equal to run_episode's with the same replies (the futures' seeds follow the step and
    the rollout, so both roll the same futures); an MR env without a future policy for the trained
    player is refused up front, since TRL does not hand its model to the tools."""
    from collab_env.rollout import run_episode

    with pytest.raises(ConfigError, match="need a policy for \\['assistant'\\].*tool route.*rollout_func"):
        ce_trl.environment_factory("hidden-facts-easy", env_kwargs=MR_KWARGS)
    reply = "Which quantity is missing? Tell me and I will add them up."
    row = ce_trl.dataset("hidden-facts-easy", n=3)[2]
    tool = ce_trl.environment_factory("hidden-facts-easy", env_kwargs=TOOL_MR_KWARGS)()
    assert tool.reset(**row) is None
    answers = []
    while True:
        try:
            answers.append(tool.send_message(reply))
        except ValueError:  # the conversation ended
            break
    assert answers[-1].endswith("[the conversation has ended]") and answers[0].startswith("user: ")
    ref = run_episode(collab_env.make("hidden-facts-easy", **TOOL_MR_KWARGS),
                      {"assistant": FixedTextPolicy(reply), "user": collab_env.spec("hidden-facts-easy").default_policies["user"]},
                      seed=row["seed"], index=row["index"])
    scored = [t for t in ref.turns if t.player == "assistant"]
    assert len(scored) == len(answers)
    assert tool.get_reward() == pytest.approx(ref.returns["assistant"], abs=1e-12)
    assert tool.get_reward() != 0.0  # token_amount charges every future's words


# -- token level ---------------------------------------------------------------------------------------


def _check_transcript(out, episodes, tok, i):
    """``env_mask`` is 1 exactly on the assistant's generated tokens (its completions, in order)
    and 0 on every token between them: the end-of-turn tokens and the user's messages."""
    ep = episodes[i]
    ids, mask, lps = out["completion_ids"][i], out["env_mask"][i], out["logprobs"][i]
    assert len(ids) == len(mask) == len(lps)
    turns = [t for t in ep.turns if t.player == "assistant"]
    users = [t for t in ep.turns if t.player == "user"]
    assert out["prompt_ids"][i] == list(turns[0].completion.prompt_token_ids)
    # the first prompt is the chat template of the assistant's first observation
    first_chat = [{"role": m["role"], "content": m["content"]} for m in ep.conversation.view("assistant").to_chat()]
    n_first = 2  # system prompt and the user's opening request
    expected_prompt = tok.apply_chat_template(first_chat[:n_first], tokenize=False, add_generation_prompt=True)
    assert tok.decode(out["prompt_ids"][i]) == expected_prompt
    # split the sequence into runs of equal mask
    runs, start = [], 0
    for k in range(1, len(mask) + 1):
        if k == len(mask) or mask[k] != mask[start]:
            runs.append((mask[start], ids[start:k], lps[start:k]))
            start = k
    model_runs = [r for r in runs if r[0] == 1]
    env_runs = [r for r in runs if r[0] == 0]
    assert mask[0] == 1 and mask[-1] == 1  # starts and ends with the model's own tokens
    assert [r[1] for r in model_runs] == [list(t.completion.token_ids) for t in turns]
    assert [r[2] for r in model_runs] == [list(t.completion.logprobs) for t in turns]
    assert all(lp == 0.0 for r in env_runs for lp in r[2])
    assert len(env_runs) == len(turns) - 1 == len(users[: len(turns) - 1])
    for turn, user, (_, between, _) in zip(turns, users, env_runs, strict=False):
        closed = turn.completion.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
        # ChatML by hand: close the assistant turn, the user's message, open the next turn
        expected = ("" if closed else "<|im_end|>") + f"\n<|im_start|>user\n{user.text}<|im_end|>\n<|im_start|>assistant\n"
        assert tok.decode(between) == expected


def test_env_mask_is_exactly_the_models_tokens(tiny_dir, tmp_path):
    trainer, fn, ds, tok = _trainer(tiny_dir, tmp_path, "hidden-facts", [ce_trl.episode_reward], n=2)
    prompts = [ds[0]["prompt"]] * 2 + [ds[1]["prompt"]] * 2
    out = fn(prompts, trainer)
    assert len(out["completion_ids"]) == 4
    multi = 0
    for i in range(4):
        _check_transcript(out, fn.last_episodes, tok, i)
        multi += len(fn.last_episodes[i].completions("assistant")) > 1
    assert multi > 0, "at least one episode has several assistant turns (so user tokens are masked)"
    trainer.model.train()
    fn(prompts[:2], trainer)  # generation switches to eval mode; the rollout switches back
    assert trainer.model.training, "the rollout leaves the model in training mode"


class FakeVLLMGeneration:
    """Stands in for ``trainer.vllm_generation``: ``generate(prompts=ids, images, num_generations)``
    served by the tiny model's tokens (vLLM's shapes: top-1 log-prob lists)."""

    def __init__(self, generator):
        self.generator = generator
        self.calls = []

    def generate(self, prompts, images, num_generations, profiler=None):
        assert images is None and num_generations == 1
        self.calls.append(len(prompts))
        outs = self.generator.generate_tokens(prompts, {"max_new_tokens": 6, "temperature": 1.0},
                                              list(range(len(prompts))))
        return (prompts, [list(c.token_ids) for c in outs], [[[lp] for lp in c.logprobs] for c in outs], None)


def test_vllm_route_batches_every_round_of_the_batch_in_one_call(tiny_dir, tmp_path):
    from collab_env.agents.hf_generator import HFGenerator

    trainer, fn, ds, tok = _trainer(tiny_dir, tmp_path, "hidden-facts", [ce_trl.episode_reward], n=2)
    fake = FakeVLLMGeneration(HFGenerator(trainer.model, tok))
    trainer.use_vllm, trainer.vllm_generation = True, fake
    prompts = [ds[0]["prompt"]] * 2 + [ds[1]["prompt"]] * 2
    out = fn(prompts, trainer)
    for i in range(4):
        _check_transcript(out, fn.last_episodes, tok, i)
    # round k asks once for every episode still running: the first call has all four
    assert fake.calls[0] == 4 and sum(fake.calls) == sum(len(e.completions("assistant")) for e in fn.last_episodes)


def test_errors(tiny_dir, tmp_path):
    trainer, fn, ds, _ = _trainer(tiny_dir, tmp_path, "hidden-facts", [ce_trl.episode_reward], n=1)
    with pytest.raises(ConfigError, match="dataset"):
        fn([[{"role": "user", "content": "hello"}]], trainer)
    with pytest.raises(ConfigError, match="rollout_func"):
        ce_trl.episode_reward(["x"])
    with pytest.raises(ConfigError, match="trained player"):
        ce_trl.rollout_func("hidden-facts", policies={"assistant": "x"})(list(ds["prompt"]), trainer)
    with pytest.raises(ConfigError, match="player="):
        ce_trl.rollout_func("hidden-facts", player="nobody")
    with pytest.raises(ConfigError, match="max_turn_tokens"):
        ce_trl.rollout_func("hidden-facts", max_turn_tokens=0)


# -- the tool route --------------------------------------------------------------------------------------


def test_environment_factory_plays_the_env_through_its_one_tool():
    factory = ce_trl.environment_factory("hidden-facts")
    env = factory()
    # what GRPOTrainer does with an instance: reset/get_reward are hooks, the rest are tools
    tools = [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
             if n not in ("reset", "get_reward") and not n.startswith("_")]
    assert tools == ["send_message"]
    row = ce_trl.dataset_rows("hidden-facts", n=1, seed=3)[0]
    assert env.reset(**row) is None  # the prompt already holds the first observation
    ref = collab_env.make("hidden-facts")
    ref.reset(seed=3, options={"index": 0})
    answer = ref.episode.item["answer"]
    reply = env.send_message("How many are there?")
    assert reply.startswith("user: ") and env.get_reward() == 0.0
    last = env.send_message(f"The total is \\boxed{{{answer}}}.")
    assert last.endswith("[the conversation has ended]")
    # answered at the second assistant turn: 1.0 minus the cost of one extra turn
    cost = ref.unwrapped.task.config.cost_per_turn
    assert env.get_reward() == pytest.approx(1.0 - cost, abs=1e-12)
    with pytest.raises(ValueError, match="ended"):
        env.send_message("again")
    # a row without index/seed columns: the prompt's tag says the item; no prompt: the text is returned
    assert env.reset(prompt=row["prompt"]) is None
    text = env.reset(index=0, seed=3)
    assert text == row["prompt"][-1]["content"]


# The tool route on an MR env: TRL keeps its model, so the futures have a policy of their own.
TOOL_MR_KWARGS = dict(reward="mr", reward_kwargs=dict(MR_KWARGS["reward_kwargs"],
                                                     policy=FixedTextPolicy("So the total is \\boxed{7}.")))


@pytest.mark.parametrize("env_id, env_kwargs", [("hidden-facts", None), ("hidden-facts-easy", TOOL_MR_KWARGS)],
                         ids=["plain", "mr"])
def test_grpo_trainer_trains_through_the_environment_factory(tiny_dir, tmp_path, env_id, env_kwargs):
    """GRPOTrainer(environment_factory=...) for 2 steps, on hidden-facts and on an MR-wrapped env: TRL
    resets the pooled envs with the dataset rows and its reward column of the env class is the envs'
    get_reward()."""
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    torch.manual_seed(0)
    model, tok = _tiny(tiny_dir)
    # TRL's tool route needs a template that renders tools and tool calls (supports_tool_calling) and
    # a known response parser for <tool_call> blocks (add_response_schema matches templates by text).
    # Qwen2.5's template, shipped with TRL, is ChatML like the tiny tokenizer's (<|im_start|>/<|im_end|>
    # are its special tokens); TRL swaps in its prefix-preserving training variant itself.
    tok.chat_template = qwen2_5_chat_template
    base = ce_trl.environment_factory(env_id, env_kwargs=env_kwargs)
    resets, messages = [], {}

    def factory():
        # record what TRL does to each instance; TRL reads `reset` and the tools off the instance
        env = base()
        reset, send = env.reset, env.send_message

        def recording_reset(**row):
            resets.append(row)
            messages[id(env)] = (row, [])
            return reset(**row)

        @functools.wraps(send)
        def recording_send(message: str) -> str:
            messages[id(env)][1].append(message)
            return send(message)

        env.reset, env.send_message = recording_reset, recording_send
        return env

    rewards_seen = []

    def envs_reward(completions, environments, index, seed, **kwargs):
        # no reward of its own (0): records what the envs hold when TRL scores the batch
        rewards_seen.append([(e.get_reward(), i, s, messages[id(e)]) for e, i, s in zip(environments, index, seed,
                                                                                           strict=True)])
        return [0.0] * len(completions)

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=8, max_steps=2, logging_steps=1, report_to=[], use_cpu=True,
                      save_strategy="no", learning_rate=1e-2, seed=0)
    ds = ce_trl.dataset(env_id, n=2)
    trainer = GRPOTrainer(model=model, reward_funcs=[envs_reward], args=args, train_dataset=ds, processing_class=tok,
                          environment_factory=factory)
    assert trainer.reward_func_names == ["envs_reward", "CollabToolEnv"]
    trainer.train()
    assert trainer.state.global_step == 2 and len(rewards_seen) == 2
    rows = {(r["index"], r["seed"]) for r in ds}
    # one reset per rollout (2 steps x 2 generations), each with a dataset row's columns
    assert len(resets) == 4 and all((r["index"], r["seed"]) in rows and r["prompt"] for r in resets)
    logged = [h for h in trainer.state.log_history if "rewards/CollabToolEnv/mean" in h]
    assert len(logged) == 2
    for batch, log in zip(rewards_seen, logged, strict=True):
        for reward, index, seed, (row, sent) in batch:
            # the env was reset with the row TRL scores it under
            assert (row["index"], row["seed"]) == (index, seed)
            # its reward is the episode's as it stood: replay the same tool calls on a fresh instance
            # (no call from the random model: the episode has not moved and the return is 0)
            ref = base()
            assert ref.reset(**row) is None
            for m in sent:
                try:
                    ref.send_message(m)
                except ValueError:  # a call after the end: TRL reports the error to the model
                    pass
            assert reward == ref.get_reward()
            if not sent:
                assert reward == 0.0
        # TRL's own column of the env class is get_reward() (float32 mean of two values, hence the tolerance)
        mean = sum(r for r, *_ in batch) / len(batch)
        assert log["rewards/CollabToolEnv/mean"] == pytest.approx(mean, abs=1e-6)
        assert log["reward"] == pytest.approx(mean, abs=1e-6)  # envs_reward adds 0
