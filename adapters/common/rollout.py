"""Rollout trees on any collab_env environment (the CoMLRL multi-turn tree).

A tree starts at a task item. At every **node** (an environment state where trained agents are
on turn) each trained agent on turn samples ``G`` completions from its observation; the
completions form the node's **joint actions** — aligned (the ``j``-th completion of every agent,
``G`` joint actions) or crossed (every combination, ``G ** n``). Each joint action is applied to
its own ``env.clone()`` and played on by the one episode driver
(:func:`~collab_env.rollout.driver.advance`, the loop every rollout in collab_env uses): players
the learner does not train act through their own policies until a trained agent is on turn again
(their steps' rewards count towards the joint action). The resulting state is the joint action's
**child** node at the next depth, until the episode ends or the tree reaches ``max_depth`` turns.

Batching: a level's completions are sampled with one :meth:`generate_tokens` request per model
(all nodes, all forks, all agents sharing that model: ``ceil(rows / max_batch_size)`` model
calls), and the joint actions of a level are stepped concurrently, so the calls that their
untrained players and their rewards' futures make to a policy with a queue (the learner's own
:attr:`~collab_env.adapters.common.models.PolicyModel.policy` in multiturn-aware futures) merge
into batches across every fork of the level.

The **return** of a joint action is its reward plus ``discount`` times the mean return of its
child's joint actions (CoMLRL's MAGRPO: the same with discount 1); a learner turns the returns of
sibling joint actions into group-relative advantages (a crossed completion's value: the mean or,
as in CoMLRL, the sum of the returns of its joint actions, :func:`completion_values`). The same
function evaluates (``G = 1``) and samples ``k`` independent chains for pass@k (``G = k`` at the
root, 1 below).

Anything with ``areset``/``astep``/``clone``/``possible_agents`` works as the environment: a
:class:`~collab_env.env.CollabEnv`, a :func:`~collab_env.tasks.from_dataset` env, or a reward
wrapper around one (``JointReward``, the multiturn-aware reward).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from collab_env._async import run_sync
from collab_env.policy import SamplingParams
from collab_env.rollout.driver import advance

__all__ = [
    "TreeNode", "JointAction", "grow_trees", "start_roots", "expand_tree", "compute_returns", "completion_values",
    "episode_item", "driver_table", "release_envs",
]


@dataclass
class JointAction:
    """One joint action of a node: which completion each acting agent chose, what the trained
    agents earned for it, and the child state it led to."""

    choice: dict[int, int]
    """Acting agent index -> index of its completion in ``node.completions[agent]``."""
    rewards: list[float]
    """Per trained agent, the env rewards from this step until a trained agent acts again."""
    child: TreeNode | None = None
    """The next node (``None`` when the episode ended or the tree is at its depth)."""
    returns: list[float] = field(default_factory=list)
    """Per trained agent, reward plus discounted mean child return (:func:`compute_returns`)."""


@dataclass
class TreeNode:
    """A state where trained agents are on turn, and what they did there."""

    root: int
    """Index of the tree (the task item's position in the batch)."""
    depth: int
    """0-based turn of the tree (``turn_{depth + 1}`` in metric names)."""
    env: Any
    """The environment in this state (owned by this node)."""
    obs: Mapping[str, Any]
    """Observations of the state."""
    infos: Mapping[str, Any]
    """Infos of the state (who is on turn)."""
    players: tuple[str, ...]
    """Trained player ids; agent ``i`` is ``players[i]``."""
    acting: list[int]
    """Trained agents on turn here."""
    prompt_ids: dict[int, list[int]] = field(default_factory=dict)
    """Per acting agent, the token ids it generated from: its observation through the chat
    template (``prompt_format="chat"``) or its turn's prompt string tokenised as it is
    (``"raw"``)."""
    prompts: dict[int, str] = field(default_factory=dict)
    """Per acting agent, the text of the latest message addressed to it (the turn's prompt)."""
    completions: dict[int, list[Any]] = field(default_factory=dict)
    """Per acting agent, its ``G`` sampled :class:`~collab_env.types.Completion` objects."""
    joint: list[JointAction] = field(default_factory=list)
    """The joint actions tried from here."""


def episode_item(env: Any) -> Mapping[str, Any]:
    """The task item of ``env``'s running episode (through wrappers), or ``{}``."""
    for obj in (env, getattr(env, "unwrapped", None)):
        ep = getattr(obj, "episode", None) if obj is not None else None
        item = getattr(ep, "item", None)
        if item is not None:
            return item
    return {}


def _latest_prompt(observation: Any) -> str:
    for m in reversed(list(observation)):
        if getattr(m, "role", None) == "user":
            return m.content
    return ""


def _draws(seeds: Callable[[int], list[int]], first: int | None = None) -> Callable[[int], int]:
    """The driver's per-round seed: a fresh draw of the learner's RNG each round played (round 0
    uses ``first`` when given: drawn before the joint action's own round, as it always was)."""
    if first is None:
        return lambda k: seeds(1)[0]
    return lambda k: first if k == 0 else seeds(1)[0]


async def start_roots(base_env: Any, indices: Sequence[int], players: Sequence[str],
                      others: Mapping[str, Any], seeds: Callable[[int], list[int]], *,
                      others_sampling: Mapping[str, Mapping[str, Any]] | None = None) -> list[TreeNode]:
    """One root node per task index: a clone of ``base_env`` reset on that item, advanced until
    a trained player is on turn (all items concurrently, so the untrained players' calls share
    batches). Items whose episode ends before that get no root.

    ``others_sampling`` (player -> sampling keywords) goes to the untrained players' policies."""

    async def root(k: int, index: int) -> TreeNode | None:
        env = base_env.clone()
        obs, infos = await env.areset(seed=seeds(1)[0], options={"index": int(index)})
        # rewards before the first trained move count for nothing
        run = await advance(env, others, obs=obs, infos=infos, until=players, sampling=others_sampling,
                            seed=_draws(seeds))
        if run.done:
            return None
        return TreeNode(root=k, depth=0, env=env, obs=run.obs, infos=run.infos, players=tuple(players),
                        acting=_acting(players, run.infos))

    nodes = await asyncio.gather(*(root(k, index) for k, index in enumerate(indices)))
    return [node for node in nodes if node is not None]


def grow_trees(task: Any, env: Any, indices: Sequence[int], models: Sequence[Any], *,
               branching: Callable[[int], int], max_depth: int, sampling: SamplingParams,
               seeds: Callable[[int], list[int]], joint_mode: Literal["aligned", "cross"] = "aligned",
               prompt_format: Literal["chat", "raw"] = "chat", stop_above: float | None = None,
               discount: float = 1.0, follow: Literal["all", "best"] = "all",
               ) -> tuple[list[TreeNode], list[list[TreeNode]]]:
    """The rollout trees of the task items ``indices`` on ``env``, returns filled: the roots
    (:func:`start_roots`), the levels (:func:`expand_tree`, whose arguments these are) and
    :func:`compute_returns` with ``discount``. ``task`` gives the players: ``players``,
    ``others`` and ``others_sampling`` (a :class:`~collab_env.adapters.common.task.TaskSource`).
    Returns ``(roots, levels)``."""
    others_sampling = task.others_sampling or None

    async def go() -> tuple[list[TreeNode], list[list[TreeNode]]]:
        roots = await start_roots(env, indices, task.players, task.others, seeds, others_sampling=others_sampling)
        levels = await expand_tree(roots, players=task.players, models=models, others=task.others,
                                   branching=branching, max_depth=max_depth, joint_mode=joint_mode,
                                   sampling=sampling, seeds=seeds, prompt_format=prompt_format,
                                   stop_above=stop_above, others_sampling=others_sampling, follow=follow)
        return roots, levels

    roots, levels = run_sync(go())
    compute_returns(levels, len(task.players), discount)
    release_envs([*roots, *(n for level in levels for n in level)])
    return roots, levels


def release_envs(nodes: Sequence[TreeNode]) -> None:
    """Close the envs of grown trees' nodes: each is a clone made for its node alone, and a
    served env's clone holds a session on its server until it is closed. The episodes' state
    stays readable (:func:`episode_item`); the envs take no more steps."""
    for node in nodes:
        node.env.close()


def driver_table(players: Sequence[str], models: Sequence[Any], others: Mapping[str, Any],
                 sampling: SamplingParams | Mapping[str, Any],
                 others_sampling: Mapping[str, Mapping[str, Any]] | None = None,
                 ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The episode driver's policy table and sampling keywords for a learner's rollouts: the
    untrained players' ``others`` with ``others_sampling``, and each trained player
    ``players[i]`` played by ``models[i].policy`` (the model that generates its moves: the live
    model, or the frozen copy of async rollouts) with the learner's ``sampling``. The trained
    players never act through the driver (their moves are given); a reward stage that rolls
    futures (the multiturn-aware reward) plays them with these policies, so the futures'
    assistant is the model that wrote the reply."""
    keywords = {k: v for k, v in SamplingParams.coerce(sampling).to_dict().items()
                if k in ("temperature", "top_p", "top_k", "max_new_tokens") and v is not None}
    table = dict(others)
    table_sampling = {p: dict(v) for p, v in (others_sampling or {}).items()}
    for i, p in enumerate(players):
        policy = getattr(models[i], "policy", None)
        if policy is not None:
            table[p] = policy
            table_sampling[p] = dict(keywords)
    return table, table_sampling


def _acting(players: Sequence[str], infos: Mapping[str, Any]) -> list[int]:
    return [i for i, p in enumerate(players) if infos.get(p, {}).get("on_turn")]


async def expand_tree(
    roots: Sequence[TreeNode],
    *,
    players: Sequence[str],
    models: Sequence[Any],
    others: Mapping[str, Any],
    branching: Callable[[int], int],
    max_depth: int,
    joint_mode: Literal["aligned", "cross"],
    sampling: SamplingParams | Mapping[str, Any],
    seeds: Callable[[int], list[int]],
    prompt_format: Literal["chat", "raw"] = "chat",
    stop_above: float | None = None,
    others_sampling: Mapping[str, Mapping[str, Any]] | None = None,
    follow: Literal["all", "best"] = "all",
) -> list[list[TreeNode]]:
    """Grow the trees level by level; return the nodes of every depth (``levels[d]``).

    Args:
        roots: From :func:`start_roots`.
        players: Trained player ids; agent ``i`` is ``players[i]``.
        models: Per agent, a :class:`~collab_env.adapters.common.models.PolicyModel` or any
            :class:`~collab_env.agents.tokens.TokenGenerator` with ``prompt_ids`` /
            ``raw_prompt_ids`` (the same object for agents sharing a model: their requests then
            share generate calls).
        others: Policies of the untrained players.
        branching: Completions per acting agent at a depth (``G``).
        max_depth: Turns per tree.
        joint_mode: ``"aligned"`` or ``"cross"`` joint actions.
        sampling: The agents' :class:`~collab_env.policy.SamplingParams` (or its keywords).
        seeds: ``seeds(n)`` returns ``n`` fresh generator seeds (the learner's RNG).
        prompt_format: ``"chat"``: agents generate from their whole observation through the chat
            template; ``"raw"``: from their turn's prompt (the latest message addressed to
            them) tokenised as it is (CoMLRL).
        stop_above: CoMLRL's early termination: a node whose joint actions' mean reward (over
            joint actions and trained agents) exceeds this value gets no children.
        others_sampling: Player -> sampling keywords for the untrained players' policies.
        follow: ``"all"``: every joint action's child is expanded (a full tree). ``"best"``: of
            each node, only the child of its best joint action (highest mean reward over the
            trained agents; the first on a tie) is expanded, the others' envs are closed: one
            path per item, the conversation going on with its best reply, and ``branching``
            candidates at every turn of it (online DPO's pairs at every trained turn).
    """
    levels: list[list[TreeNode]] = []
    frontier = list(roots)
    depth = 0
    table, table_sampling = driver_table(players, models, others, sampling, others_sampling)
    while frontier and depth < max_depth:
        levels.append(frontier)
        g = branching(depth)
        _generate(frontier, models, g, SamplingParams.coerce(sampling), seeds, prompt_format)
        steps = []
        for node in frontier:
            for choice in _joint_choices(node, g, joint_mode):
                ja = JointAction(choice=choice, rewards=[0.0] * len(players))
                node.joint.append(ja)
                steps.append(_step_joint(node, ja, players, table, seeds, depth + 1 < max_depth, table_sampling))
        await asyncio.gather(*steps)
        if stop_above is not None:
            for node in frontier:
                if node.joint and _node_mean_reward(node) > stop_above:
                    for ja in node.joint:
                        if ja.child is not None:
                            ja.child.env.close()
                        ja.child = None
        if follow == "best":
            nxt: list[TreeNode] = []
            for node in frontier:
                kids = [ja for ja in node.joint if ja.child is not None]
                if not kids:
                    continue
                best = max(kids, key=lambda ja: sum(ja.rewards) / len(ja.rewards) if ja.rewards else 0.0)
                for ja in kids:
                    if ja is not best and ja.child is not None:
                        ja.child.env.close()
                        ja.child = None
                if best.child is not None:
                    nxt.append(best.child)
            frontier = nxt
        else:
            frontier = [ja.child for node in frontier for ja in node.joint if ja.child is not None]
        depth += 1
    return levels


def _node_mean_reward(node: TreeNode) -> float:
    """Mean over a node's joint actions of their mean reward over the trained agents."""
    per_joint = [sum(ja.rewards) / len(ja.rewards) for ja in node.joint if ja.rewards]
    return sum(per_joint) / len(per_joint) if per_joint else 0.0


def _generate(nodes: Sequence[TreeNode], models: Sequence[Any], g: int, params: SamplingParams,
              seeds: Callable[[int], list[int]], prompt_format: str = "chat") -> None:
    """Sample ``g`` completions per acting agent of every node: one ``generate_tokens`` request
    per model, holding every node, fork and agent it plays."""
    requests: list[tuple[Any, TreeNode, int]] = []  # (model, node, agent)
    for node in nodes:
        for a in node.acting:
            obs = node.obs[node.players[a]]
            node.prompts[a] = _latest_prompt(obs)
            if prompt_format == "raw":
                node.prompt_ids[a] = models[a].raw_prompt_ids(node.prompts[a])
            else:
                node.prompt_ids[a] = models[a].prompt_ids(obs)
            requests.append((models[a], node, a))
    by_model: list[tuple[Any, list[tuple[TreeNode, int]]]] = []
    for model, node, a in requests:
        for m, reqs in by_model:
            if m is model:
                reqs.append((node, a))
                break
        else:
            by_model.append((model, [(node, a)]))
    for model, reqs in by_model:
        prompts = [node.prompt_ids[a] for node, a in reqs for _ in range(g)]
        outs = model.generate_tokens(prompts, params, seeds(len(prompts)))
        for k, (node, a) in enumerate(reqs):
            node.completions[a] = outs[k * g:(k + 1) * g]


def _joint_choices(node: TreeNode, g: int, mode: str) -> list[dict[int, int]]:
    if mode == "aligned" or len(node.acting) <= 1:
        return [dict.fromkeys(node.acting, j) for j in range(g)]
    combos = itertools.product(range(g), repeat=len(node.acting))
    return [dict(zip(node.acting, combo, strict=True)) for combo in combos]


async def _step_joint(node: TreeNode, ja: JointAction, players: Sequence[str], table: Mapping[str, Any],
                      seeds: Callable[[int], list[int]], expand: bool,
                      table_sampling: Mapping[str, Mapping[str, Any]] | None = None) -> TreeNode | None:
    """Apply ``ja`` to a clone of ``node``'s env and play on until a trained player is on turn;
    ``ja.rewards`` gets the trained players' rewards of every round played. ``table``: every
    player's policy (:func:`driver_table`): the untrained players act through theirs, and a
    reward stage (the multiturn-aware reward's futures) plays the trained players with theirs."""
    env = node.env.clone()
    actions = {players[a]: node.completions[a][j].text for a, j in ja.choice.items()}
    run = await advance(env, table, obs=node.obs, infos=node.infos, until=players, actions=actions,
                        sampling=table_sampling, seed=_draws(seeds, seeds(1)[0]))
    for i, p in enumerate(players):
        ja.rewards[i] += run.reward(p)
    if run.done or not expand:
        env.close()  # a leaf: its env takes no more steps (a served env's clone holds a session)
        return None
    child = TreeNode(root=node.root, depth=node.depth + 1, env=env, obs=run.obs, infos=run.infos,
                     players=node.players, acting=_acting(players, run.infos))
    ja.child = child
    return child


def compute_returns(levels: Sequence[Sequence[TreeNode]], num_agents: int, discount: float) -> None:
    """Fill ``JointAction.returns`` bottom-up: reward plus ``discount`` times the mean return
    of the child's joint actions (no child: the reward alone)."""
    for nodes in reversed(levels):
        for node in nodes:
            for ja in node.joint:
                child = ja.child
                if child is not None and child.joint:
                    future = [sum(c.returns[i] for c in child.joint) / len(child.joint) for i in range(num_agents)]
                else:
                    future = [0.0] * num_agents
                ja.returns = [ja.rewards[i] + discount * future[i] for i in range(num_agents)]


def completion_values(node: TreeNode, agent: int, reduce: Literal["mean", "sum"] = "mean") -> list[float]:
    """Per completion of ``agent`` at ``node``, the returns (to that agent) of the joint actions
    that used it, averaged (``reduce="mean"``: the marginal over the other agents' choices) or
    added up (``"sum"``: CoMLRL's MAGRPO, ``G ** (n - 1)`` times the mean when ``n`` agents
    cross ``G`` completions each). Aligned joint actions use each completion once, so both give
    its joint action's return."""
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}.")
    g = len(node.completions[agent])
    sums, counts = [0.0] * g, [0] * g
    for ja in node.joint:
        j = ja.choice[agent]
        sums[j] += ja.returns[agent]
        counts[j] += 1
    if reduce == "sum":
        return sums
    return [s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]
