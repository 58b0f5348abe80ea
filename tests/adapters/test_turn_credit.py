"""Turn-level credit: each move of an episode credited by its own reward (the multiturn-aware
reward of that reply), as per-turn samples (collab_env.rollout.turn_samples) and as per-token
advantages on TRL (TurnCreditGRPOTrainer), checked token by token against the transcript."""

import math
import os

import pytest

from collab_env.adapters.common.turn_credit import token_advantages, turn_advantages
from collab_env.errors import ConfigError

# -- the grouping, by hand -----------------------------------------------------------------------


def test_turn_advantages_compare_each_move_with_the_same_move_of_the_group():
    # turn 0: 1, 0, 0 (mean 1/3); turn 1: 0, 1 (mean 1/2); the third episode made one move
    adv = turn_advantages([[1.0, 0.0], [0.0, 1.0], [0.0]])
    assert adv[0] == pytest.approx([2 / 3, -0.5]) and adv[1] == pytest.approx([-1 / 3, 0.5])
    assert adv[2] == pytest.approx([-1 / 3])
    # population std of turn 0: sqrt((4/9 + 1/9 + 1/9) / 3) = sqrt(2)/3; sample std: sqrt((6/9) / 2) = 1/sqrt(3)
    pop = turn_advantages([[1.0, 0.0], [0.0, 1.0], [0.0]], scale="population")
    assert pop[0][0] == pytest.approx((2 / 3) / (math.sqrt(2) / 3 + 1e-4))
    sample = turn_advantages([[1.0, 0.0], [0.0, 1.0], [0.0]], scale="sample")
    assert sample[0][0] == pytest.approx((2 / 3) / (1 / math.sqrt(3) + 1e-4))
    # turn 1 has two members: sample std = |0 - 1| / sqrt(2)
    assert sample[1][1] == pytest.approx(0.5 / (1 / math.sqrt(2) + 1e-4))


def test_a_move_no_other_episode_reached_gets_no_credit():
    assert turn_advantages([[1.0, 5.0, 9.0], [0.0]]) == [[0.5, 0.0, 0.0], [-0.5]]
    assert turn_advantages([[3.0]]) == [[0.0]] and turn_advantages([]) == []


def test_ties_give_zero_and_bad_input_is_refused():
    assert turn_advantages([[2.0, 1.0], [2.0, 1.0]], scale="sample") == [[0.0, 0.0], [0.0, 0.0]]
    with pytest.raises(ConfigError, match="non-finite"):
        turn_advantages([[float("nan")], [1.0]])
    with pytest.raises(ConfigError, match="scale"):
        turn_advantages([[1.0]], scale="batch")
    assert token_advantages([0, 0, -1, -1, 1], [0.25, -2.0]) == [0.25, 0.25, 0.0, 0.0, -2.0]
    with pytest.raises(ConfigError, match="move 2"):
        token_advantages([0, 2], [1.0, 1.0])


# -- TRL: per-token advantages from each move's MR -------------------------------------------------

MR_KWARGS = dict(reward="mr", reward_kwargs=dict(
                                                weights={"accuracy_rule": 1.0, "token_amount": -1e-2},
                                                num_rollouts=2, max_user_turns=1, max_assistant_turns=2))


def _runs(mask):
    """(start, end) of each run of 1s in ``mask``."""
    runs, start = [], None
    for t, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            runs.append((start, t))
            start = None
    return runs


def _group_adv(values):
    """GRPO with TRL's scale_rewards='group': (v - mean) / (Bessel std + 1e-4); one member: 0."""
    if len(values) < 2:
        return [0.0] * len(values)
    m = sum(values) / len(values)
    std = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return [(v - m) / (std + 1e-4) for v in values]


@pytest.fixture
def trl_parts(tiny_dir, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig

    from collab_env.adapters import trl as ce_trl
    from collab_env.testing.tiny_model import load_tiny_chat_model

    torch.manual_seed(0)
    model, tok = load_tiny_chat_model(tiny_dir)

    def make(cls, *, scale_rewards="group", rollout=None, steps=1):
        args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                          max_completion_length=8, max_steps=steps, logging_steps=1, report_to=[], use_cpu=True,
                          save_strategy="no", learning_rate=1e-2, seed=0, scale_rewards=scale_rewards)
        fn = rollout if rollout is not None else ce_trl.rollout_func("hidden-facts-easy", env_kwargs=MR_KWARGS)
        ds = ce_trl.dataset("hidden-facts-easy", n=4, env_kwargs=MR_KWARGS)
        return cls(model=model, reward_funcs=ce_trl.episode_reward, args=args, train_dataset=ds,
                   processing_class=tok, rollout_func=fn), fn

    return torch, ce_trl, make


def test_trl_turn_credit_advantages_match_each_moves_mr_token_by_token(trl_parts):
    torch, ce_trl, make = trl_parts
    from collab_env.rollout import token_transcript, turn_samples

    seen = []

    class Capturing(ce_trl.TurnCreditGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            episodes = list(self.rollout_func.last_episodes)
            seen.append((out, [dict(r) for r in inputs], episodes,
                         [ce_trl.scored_moves(e, "assistant") for e in episodes]))
            return out

    trainer, fn = make(Capturing)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert seen, "the trainer scored a batch"
    distinct_moves = 0
    for out, rows, episodes, mrs in seen:
        adv = out["advantages"]
        assert adv.dim() == 2 and adv.shape == out["completion_ids"].shape
        # the expected credit of every move: the MR of that reply, read from the env's infos
        credits = []
        for ep, mr in zip(episodes, mrs, strict=True):
            moves = [t for t in ep.turns if t.player == "assistant" and t.trainable]
            by_step = {m["step"]: m["reward"] for m in mr}
            assert [t.step for t in moves] == sorted(by_step), "the MR scored every move of the assistant"
            # hidden-facts gives the assistant nothing at the user's steps: a move's credit is its MR
            credits.append([by_step[t.step] for t in moves])
            assert sum(credits[-1]) == pytest.approx(ep.returns["assistant"], abs=1e-9)
        for i, (row, ep) in enumerate(zip(rows, episodes, strict=True)):
            assert row["turn_rewards"] == pytest.approx(credits[i], abs=1e-12)
            tt = token_transcript(ep, "assistant")
            mask = row["env_mask"] if "env_mask" in row else tt.mask
            runs = _runs(tt.mask)
            moves = [t for t in ep.turns if t.player == "assistant" and t.trainable]
            # the runs of the mask are the moves' own ids, in order
            assert [tt.response_ids[a:b] for a, b in runs] == [list(t.completion.token_ids) for t in moves]
            assert mask == tt.mask
            # the same moves as per-turn samples (the CollabLLM recipe's export): own prompt, ids, credit
            samples = turn_samples(ep, "assistant")
            assert [(s.prompt_ids, s.completion_ids, s.logprobs, s.step) for s in samples] == [
                (list(t.completion.prompt_token_ids), list(t.completion.token_ids), list(t.completion.logprobs), t.step)
                for t in moves]
            assert [s.reward for s in samples] == pytest.approx(credits[i], abs=1e-12)
            # expected per-move advantages: this row against its group's rows, move by move
            g0 = i - i % 2
            group = credits[g0:g0 + 2]
            expected_moves = []
            for k in range(len(credits[i])):
                members = [c[k] for c in group if len(c) > k]
                expected_moves.append(_group_adv(members)[[j for j, c in enumerate(group) if len(c) > k].index(i - g0)])
            expected = [0.0] * adv.shape[1]
            for k, (a, b) in enumerate(runs):
                for t in range(a, b):
                    expected[t] = expected_moves[k]
            assert adv[i].tolist() == pytest.approx(expected, abs=1e-5)
            distinct_moves += len(set(round(x, 6) for x in expected_moves)) > 1
    assert distinct_moves > 0, "some episode's moves got different advantages (not one scalar per episode)"


def test_trl_turn_credit_refuses_what_it_cannot_credit(trl_parts):
    torch, ce_trl, make = trl_parts
    with pytest.raises(ConfigError, match="scale_rewards"):
        make(ce_trl.TurnCreditGRPOTrainer, scale_rewards="batch")
    with pytest.raises(ConfigError, match="rollout_func"):
        make(ce_trl.TurnCreditGRPOTrainer, rollout=lambda prompts, trainer: {})

    class Stripped(ce_trl.RolloutFunc):
        """A rollout whose rows lost the credit fields: the trainer must not fall back silently."""

        def __call__(self, prompts, trainer):
            out = super().__call__(prompts, trainer)
            out.pop("turn_rewards")
            out.pop("turn_ids")
            return out

    base = ce_trl.rollout_func("hidden-facts-easy", env_kwargs=MR_KWARGS)
    stripped = Stripped(base.build_env, player=base.player)
    trainer, _ = make(ce_trl.TurnCreditGRPOTrainer, rollout=stripped)
    with pytest.raises(ConfigError, match="turn_ids"):
        trainer.train()


# -- SkyRL: each step's reward is the move's credit -------------------------------------------------


def _skyrl_mr_kwargs():
    from collab_env.policy import FixedTextPolicy

    return dict(reward="mr", reward_kwargs=dict(policy=FixedTextPolicy("The total is \\boxed{7}."),
                                                weights={"accuracy_rule": 1.0, "token_amount": -1e-2},
                                                num_rollouts=2, max_user_turns=1, max_assistant_turns=2))


def test_skyrl_step_rewards_are_the_turn_credits_of_the_same_episode():
    pytest.importorskip("skyrl_gym")
    import collab_env
    from collab_env.adapters.skyrl import CollabTextEnv
    from collab_env.policy import CallablePolicy
    from collab_env.rollout import run_episode, turn_rewards, turn_samples
    from collab_env.tasks.hidden_facts import HiddenFactsUser

    item = collab_env.make("hidden-facts-easy").task.get_item(2)
    labels = [f["label"] for f in item["facts"]]
    replies = [f"What is {labels[0]}?", "Tell me the rest, please: " + ", ".join(labels[1:]) + ".",
               f"The total is \\boxed{{{item['answer']}}}."]

    def reply(obs):
        return replies[min(sum(m.role == "assistant" for m in obs), len(replies) - 1)]

    env = collab_env.make("hidden-facts-easy", **_skyrl_mr_kwargs())
    ep = run_episode(env, {"assistant": CallablePolicy(reply), "user": HiddenFactsUser()}, seed=4, index=2)
    credits = turn_rewards(ep, "assistant")
    assert len(credits) == len(ep.completions("assistant")) >= 2
    assert sum(credits) == pytest.approx(ep.returns["assistant"], abs=1e-12)
    # a move's credit is its own step's MR: different replies, different credits (not one scalar)
    mr_by_step = {t.step: t.reward for t in ep.turns if t.player == "assistant"}
    assert credits == pytest.approx([mr_by_step[t.step] for t in ep.completions("assistant")], abs=1e-12)
    assert len(set(round(c, 9) for c in credits)) > 1
    with pytest.raises(ConfigError, match="token ids"):
        turn_samples(ep, "assistant")  # text policies return no tokens: nothing a learner can train on

    sky = CollabTextEnv({}, {"extra_info": {"seed": 4, "index": 2}}, env_id="hidden-facts-easy",
                        env_kwargs=_skyrl_mr_kwargs())
    sky.init()
    rewards = []
    for r in replies[:len(credits)]:
        out = sky.step(r)
        rewards.append(out["reward"])
        if out["done"]:
            break
    # SkyRL gets each move's credit as that step's reward: its generator puts it on the turn's last token
    assert rewards == pytest.approx(credits, abs=1e-12)
    sky.close()


# -- our learners: MAGRPO on chains (independent episodes), per-turn or per-episode credit ---------


class _Comp:
    def __init__(self, ids):
        self.token_ids, self.logprobs = tuple(ids), tuple(-0.5 for _ in ids)


def _chain_tree():
    """One root, 3 chains of one agent: rewards per move (chain 0: 1, 0; chain 1: 0, 3; chain 2:
    0, ended after one move); returns (undiscounted): 1, 3, 0."""
    from collab_env.adapters.common.rollout import JointAction, TreeNode

    def node(depth, comps):
        return TreeNode(root=0, depth=depth, env=None, obs={}, infos={}, players=("a",), acting=[0],
                        prompt_ids={0: [depth]}, completions={0: [_Comp(c) for c in comps]})

    root = node(0, [[1], [2], [3]])
    kids = [node(1, [[10, 11]]), node(1, [[20]])]
    for kid, r in zip(kids, (0.0, 3.0), strict=True):
        kid.joint = [JointAction(choice={0: 0}, rewards=[r], returns=[r])]
    root.joint = [JointAction(choice={0: 0}, rewards=[1.0], child=kids[0], returns=[1.0]),
                  JointAction(choice={0: 1}, rewards=[0.0], child=kids[1], returns=[3.0]),
                  JointAction(choice={0: 2}, rewards=[0.0], child=None, returns=[0.0])]
    return [[root], kids]


def test_chain_groups_compare_each_move_with_the_same_move_of_the_other_chains():
    from collab_env.adapters.common.losses import group_advantages
    from collab_env.adapters.common.tree_learner import group_chains

    seen = []

    def adv(node, agent, values):
        seen.append(values)
        return group_advantages(values)

    groups, lengths = group_chains(_chain_tree(), adv, "turn")
    # depth 0: rewards 1, 0, 0 (mean 1/3); depth 1: 0, 3 (mean 1.5)
    assert seen == [[1.0, 0.0, 0.0], [0.0, 3.0]]
    assert [[(s[1], round(s[2], 9), s[3]) for s in g] for _, g in groups] == [
        [((1,), round(2 / 3, 9), 0), ((2,), round(-1 / 3, 9), 0), ((3,), round(-1 / 3, 9), 0)],
        [((10, 11), -1.5, 1), ((20,), 1.5, 1)]]
    assert groups[1][1][0][0] == [1] and groups[1][1][0][4] == (-0.5, -0.5)  # prompt ids, sampler log-probs
    assert sorted(lengths) == [1, 1, 1, 1, 2]

    seen.clear()
    groups, _ = group_chains(_chain_tree(), adv, "episode")
    # one group per root and agent: every move of a chain gets its chain's return advantage (1, 3, 0; mean 4/3)
    assert seen == [[1.0, 3.0, 0.0]]
    [(agent, g)] = groups
    assert [(s[1], round(s[2], 9)) for s in g] == [((1,), round(-1 / 3, 9)), ((10, 11), round(-1 / 3, 9)),
                                                   ((2,), round(5 / 3, 9)), ((20,), round(5 / 3, 9)),
                                                   ((3,), round(-4 / 3, 9))]
    with pytest.raises(ConfigError, match="credit"):
        group_chains(_chain_tree(), adv, "step")


def test_magrpo_on_chains_trains_on_independent_episodes(tiny_dir, tmp_path):
    pytest.importorskip("torch")
    from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer
    from collab_env.testing.tiny_model import load_tiny_chat_model

    with pytest.raises(ConfigError, match="chains.*joint_mode"):
        MAGRPOConfig(rollout_shape="chains", joint_mode="cross")
    with pytest.raises(ConfigError, match="chain_credit"):
        MAGRPOConfig(rollout_shape="chains", chain_credit="steps")
    model, tok = load_tiny_chat_model(tiny_dir)
    cfg = MAGRPOConfig(num_agents=1, num_generations=3, max_new_tokens=4, num_turns=2, eval_interval=0,
                       logging_steps=1, learning_rate=1e-2, max_steps=1, output_dir=str(tmp_path / "out"),
                       rollout_shape="chains", chain_credit="turn")
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, env="hidden-facts", args=cfg)
    captured = {}
    original = trainer.chain_groups

    def spy(levels, advantages, credit):
        captured["levels"] = levels
        return original(levels, advantages, credit)

    trainer.chain_groups = spy
    trainer.train()
    levels = captured["levels"]
    # 3 chains from the root, then one completion per node: independent episodes
    assert [len(n.joint) for n in levels[0]] == [3]
    assert all(len(n.completions[0]) == 1 and len(n.joint) <= 1 for n in levels[1])
