"""MAGRPO's returns under ``preset="comlrl"`` against the installed CoMLRL's own trainer.

One two-turn rollout tree is rolled out with our trainer (the tiny model). CoMLRL's
``MAGRPOTrainer._train_step_returns`` is then made to walk that same tree: its generation step
(``_generate_completions``) hands it our tree's completions node by node, in the order it asks
for them; everything else is CoMLRL's code: the prompts and the transition between turns, the
rewards (the same reward function), early termination, the returns and each agent's
per-completion returns in its rollout buffer. Those must equal the values our trainer takes
advantages of."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("comlrl", reason="needs the installed CoMLRL to compare with: pip install 'collab-env[comlrl]'")

from collab_env.adapters.common.config import learner_sampling  # noqa: E402
from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402

ROWS = [{"prompt": "Describe a city in the clouds."}, {"prompt": "Invent a new holiday."}]


def _tiny(tiny_dir):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    return load_tiny_chat_model(tiny_dir)


def brief(item):
    return f"Briefly: {item['prompt']}"


def detailed(item):
    return f"In detail: {item['prompt']}"


def transition(agent_completions, **_):
    return [f"Revise [{agent_completions[0]}]", f"Expand [{agent_completions[1]}]"]


def _text_reward(offset):
    """A joint reward of the two texts only (so both trainers score a joint action alike), varied
    by the texts, in [offset - 0.48, offset]."""

    def reward(first, second):
        return [offset - (sum(map(ord, a + "|" + b)) % 97) / 200.0 for a, b in zip(first, second, strict=True)]

    return reward


def _ours(tiny_dir, tmp_path, joint_mode, reward):
    model, tok = _tiny(tiny_dir)
    # CoMLRL's defaults, but sampling at temperature 1 so that the branches' texts differ (the
    # returns do not depend on the sampling); a few tokens per completion for speed.
    args = MAGRPOConfig(preset="comlrl", num_generations=2, max_new_tokens=4, temperature=1.0, top_p=1.0,
                        joint_mode=joint_mode, num_train_epochs=1, eval_interval=0, plot=False,
                        output_dir=str(tmp_path / "ours"))
    assert args.num_turns == 2 and args.discount == 1.0 and args.early_termination_threshold == -0.2
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=[brief, detailed],
                            reward_func=reward, train_dataset=ROWS, external_transition=transition, args=args)
    return trainer


def _our_tree(trainer):
    """Our training tree of item 0 and, per node, each acting agent's completion values (what
    MAGRPO's ``train_step`` takes group-relative advantages of)."""
    a = trainer.args
    _, levels = trainer.rollout(trainer.train_env, [0], lambda d: a.num_generations, a.joint_mode,
                                learner_sampling(trainer.args), trainer.task.seeds)
    values: dict[tuple[int, int], list[float]] = {}

    def keep(node, agent, vals):
        values[(id(node), agent)] = list(vals)
        return [0.0] * len(vals)

    trainer.node_groups(levels, keep)
    return levels, values


def _preorder(node):
    yield node
    for ja in node.joint:
        if ja.child is not None:
            yield from _preorder(ja.child)


def _comlrl_walk(tiny_dir, levels, joint_mode, reward):
    """CoMLRL's MAGRPO on our tree of item 0: returns its buffered NodeSamples per agent, in
    the order it built the nodes (depth-first), and the nodes of our tree in that order."""
    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig as ComlrlConfig
    from comlrl.trainers.reinforce.magrpo import MAGRPOTrainer as ComlrlTrainer

    model0, tok = _tiny(tiny_dir)
    model1, _ = _tiny(tiny_dir)
    # CoMLRL's defaults (discount, early_termination_threshold, turns) except the group size, the
    # joint mode and a buffer too large to fill (its samples stay there, unused, for the test).
    args = ComlrlConfig(num_agents=2, num_generations=2, max_new_tokens=4, joint_mode=joint_mode,
                        rollout_buffer_size=1_000_000)
    theirs = ComlrlTrainer(agents=[model0, model1], num_agents=2, tokenizer=tok, reward_func=reward,
                           formatters=[brief, detailed], external_transition=transition,
                           train_dataset=None, args=args)
    nodes = list(_preorder(levels[0][0]))
    asks = [(node, agent) for node in nodes for agent in sorted(node.acting)]
    served: list[tuple[int, int]] = []

    def generate(agent, batch_items, agent_idx=0, num_return_sequences=1, max_new_tokens=128,
                 prompts_override=None, external_prompts=None, **_):
        node, ours_agent = asks[len(served)]
        assert agent_idx == ours_agent and num_return_sequences == len(node.completions[ours_agent])
        if external_prompts is not None:  # CoMLRL's transition on the branch it is on: our child's prompt
            assert external_prompts in node.prompts[ours_agent], (external_prompts, node.prompts[ours_agent])
        served.append((node.depth, agent_idx))
        comps = node.completions[ours_agent]
        return {
            "prompts": [node.prompts[ours_agent]], "batch_items": batch_items,
            "prompt_input_ids": torch.tensor([node.prompt_ids[ours_agent]]),
            "completions": [[c.text for c in comps]],
            "completion_input_ids": [[torch.tensor(list(c.token_ids or ()), dtype=torch.long) for c in comps]],
            "reference_kls": [],
        }

    theirs._generate_completions = generate
    theirs._train_step_returns(dict(ROWS[0]))
    assert len(served) == len(asks), "CoMLRL grew a different tree (fewer nodes) than ours"
    assert theirs.env_step == sum(len(n.joint) for n in nodes)
    samples = [sorted(buf, key=lambda s: s.node_env_step) for buf in theirs.rollout_buffers]
    return nodes, samples


def _assert_same_returns(values, nodes, samples):
    for agent in (0, 1):
        assert len(samples[agent]) == len(nodes)
        for node, sample in zip(nodes, samples[agent], strict=True):
            assert sample.turn_idx == node.depth
            ours = values[(id(node), agent)]
            assert ours == pytest.approx(sample.returns, rel=1e-6, abs=1e-9), (node.depth, agent)
            assert sample.node_mean_reward == pytest.approx(
                sum(ja.rewards[agent] for ja in node.joint) / len(node.joint), rel=1e-6)
            assert sample.node_mean_return == pytest.approx(
                sum(ja.returns[agent] for ja in node.joint) / len(node.joint), rel=1e-6)


@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_two_turn_returns_equal_comlrls_on_the_same_tree(tiny_dir, tmp_path, joint_mode):
    reward = _text_reward(-0.5)  # every mean reward is below CoMLRL's threshold -0.2: both turns grow
    trainer = _ours(tiny_dir, tmp_path, joint_mode, reward)
    levels, values = _our_tree(trainer)
    g = trainer.args.num_generations
    per_node = g if joint_mode == "aligned" else g ** 2
    assert [len(lv) for lv in levels] == [1, per_node]
    assert all(len(n.joint) == per_node for lv in levels for n in lv)
    # the first turn's returns carry the second turn's (nonzero) rewards: a discount would show
    assert all(ja.returns[0] < ja.rewards[0] - 0.4 for ja in levels[0][0].joint)
    nodes, samples = _comlrl_walk(tiny_dir, levels, joint_mode, reward)
    _assert_same_returns(values, nodes, samples)
    trainer.close()


def test_early_termination_at_the_root_equals_comlrls(tiny_dir, tmp_path):
    reward = _text_reward(0.5)  # every reward is above CoMLRL's threshold -0.2: the root stops the tree
    trainer = _ours(tiny_dir, tmp_path, "aligned", reward)
    levels, values = _our_tree(trainer)
    assert len(levels) == 1 and all(ja.child is None for ja in levels[0][0].joint)
    assert all(ja.returns == ja.rewards for ja in levels[0][0].joint)
    nodes, samples = _comlrl_walk(tiny_dir, levels, "aligned", reward)
    _assert_same_returns(values, nodes, samples)
    trainer.close()
