"""CoMLRL: any registered collab_env env as CoMLRL's dataset, formatters, reward function and
external transition, so CoMLRL's own trainers (``MAGRPOTrainer``, the REINFORCE family...) train on
it::

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from collab_env.adapters.comlrl import export

    ex = export("length-ratio", num_turns=2, tokenizer=tok)   # env keywords pass through
    trainer = MAGRPOTrainer(agent_model=path, tokenizer=tok, num_agents=ex.num_agents,
                            train_dataset=ex.dataset(), formatters=ex.formatters,
                            reward_func=ex.reward_func, external_transition=ex.external_transition,
                            args=MAGRPOConfig(num_turns=2, num_agents=ex.num_agents))

The CoMLRL agents are the env's trainable players (``players=`` picks others), in the spec's
order; every other player (a simulated user, a fixed partner) is played by its policy through the
one episode driver, :func:`collab_env.rollout.advance`, until a trained player is on turn.

What each piece does (CoMLRL's calling conventions, read from ``comlrl 1.4.3``'s
``trainers/reinforce/magrpo.py``):

* **Rows** (:meth:`ComlrlExport.dataset`): one per task item, ``{"prompt", "env_seed",
  "env_index"}``; ``prompt`` is the item's task text (or agent 0's opening).
* **Formatters**, one per agent: ``formatter(item)`` renders that agent's opening view (the env
  reset with the row's seed and index, the untrained players played until a trained one is on
  turn); with ``external_prompts=`` (later turns) it returns that prompt.
* **Reward function** ``reward_func(*agent_completions, batch_items=[row], prompts=None)``: the
  joint action (one completion per agent) goes to the env in the state the completions answer;
  the driver then plays the others; the reward is the mean of the trained players' rewards over
  that span (the joint reward itself in cooperative envs). Once the episode has ended, later
  turns score 0.0.
* **External transition** ``external_transition(prompt, agent_completions, num_agents,
  prompt_history_per_agent, response_history_per_agent)``: the next prompt of each agent, its
  view after that joint action and the others' replies.

State across calls. CoMLRL's reward function sees one turn's completions, its transition the
histories. The export keeps the env states of the tree being rolled out, keyed by the history of
joint actions: the reward function steps the state its completions answer and keeps the result;
the transition looks it up (or, in another process, replays the history from the row's opening:
exact with deterministic untrained players). Which state a reward call answers: the state whose
agent-0 prompt is ``prompts[0]`` (CoMLRL passes the prompt its agents used); else the state the
latest transition made, while it has not been scored (CoMLRL's evaluation passes the opening
prompt on every turn); else the row's opening. CoMLRL rolls trees out one at a time, which this
relies on; its ``joint_mode="cross"`` with ``num_turns > 1`` passes no prompts and is not
supported (use the default ``"aligned"``).

Needs the ``comlrl`` extra (``pip install 'collab_env[comlrl]'``) only to train; the export itself
uses ``datasets`` for :meth:`ComlrlExport.dataset`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collab_env._async import run_sync
from collab_env.errors import ConfigError, EnvStateError
from collab_env.types import template_chat

__all__ = ["ComlrlExport", "export", "render_prompt"]


def render_prompt(chat: Sequence[Mapping[str, str]], tokenizer: Any = None) -> str:
    """A player's view as CoMLRL's prompt text (CoMLRL tokenises the prompt string as it is).

    With ``tokenizer``: its chat template with the generation prompt. Without: a lone user
    message is its text (the plain prompt of a CoMLRL formatter); a longer chat is
    ``"<role>: <text>"`` blocks separated by blank lines, ending with ``"assistant:"``.
    """
    if tokenizer is not None:
        return tokenizer.apply_chat_template(template_chat(chat), tokenize=False, add_generation_prompt=True)
    if len(chat) == 1 and chat[0]["role"] == "user":
        return chat[0]["content"]
    return "\n\n".join([f"{m['role']}: {m['content']}" for m in chat] + ["assistant:"])


@dataclass
class _Node:
    """One state of the tree: the env after a history of joint actions, a trained player on turn."""

    env: Any
    obs: dict[str, Any]
    infos: dict[str, Any]
    history: tuple[tuple[str, ...], ...]
    scored: bool = False
    prompts: list[str] = field(default_factory=list)


class ComlrlExport:
    """CoMLRL's inputs for one registered env (build it with :func:`export`).

    Attributes:
        env_id: The registered id (versioned).
        agents: The trained players, in CoMLRL's agent order.
        num_agents: ``len(agents)`` (CoMLRL's ``num_agents``).
        num_turns: The most turns of the trained players an episode can have (a bound for
            CoMLRL's ``num_turns``).
        rows: The dataset rows.
        formatters: One per agent.
    """

    def __init__(
        self,
        env_id: str,
        *,
        players: Sequence[str] | None = None,
        policies: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Mapping[str, Any]] | None = None,
        tokenizer: Any = None,
        num_items: int | None = None,
        indices: Sequence[int] | None = None,
        seed: int = 0,
        **env_kwargs: Any,
    ) -> None:
        import collab_env
        from collab_env.policy import policies_for
        from collab_env.rollout import check_policies

        self._proto = collab_env.make(env_id, **env_kwargs)
        spec = self._proto.spec
        self.env_id = spec.id
        agents = tuple(players) if players is not None else (spec.trainable or spec.players)
        unknown = [p for p in agents if p not in self._proto.possible_agents]
        if unknown or not agents:
            raise ConfigError(f"players={list(agents)} must be players of {spec.id}: {self._proto.possible_agents}.")
        if policies and any(p in agents for p in policies):
            raise ConfigError(f"{[p for p in policies if p in agents]} are trained by CoMLRL; "
                              "give policies only to the others.")
        self.agents = agents
        self.num_agents = len(agents)
        others = [p for p in self._proto.possible_agents if p not in agents]
        self._policies = check_policies(self._proto, policies_for(spec, policies), others)
        self._sampling = dict(sampling or {})
        self._tokenizer = tokenizer
        task = self._proto.unwrapped.task
        if indices is None:
            n = num_items if num_items is not None else task.num_items()
            if n is None:
                raise ConfigError(f"{spec.id} draws unlimited items: pass num_items= or indices=.")
            indices = range(int(n))
        self.num_turns = max(1, self._proto.unwrapped.max_steps // len(task.turn_order))
        self._openings: dict[tuple[int, int], _Node] = {}
        self.rows: list[dict[str, Any]] = []
        for k, i in enumerate(indices):
            row: dict[str, Any] = {"env_seed": int(seed) + k, "env_index": int(i)}
            item_prompt = task.get_item(int(i)).get("prompt")
            opening = self._opening(row)
            row["prompt"] = item_prompt if isinstance(item_prompt, str) else opening.prompts[0]
            self.rows.append(row)
        self.formatters = [self._formatter(k) for k in range(self.num_agents)]
        # The tree being rolled out (CoMLRL rolls one out at a time).
        self._row_key: tuple[int, int] | None = None
        self._stepped: dict[tuple[tuple[str, ...], ...], _Node] = {}
        self._by_prompt: dict[str, _Node] = {}
        self._latest: _Node | None = None

    # -- the env side ------------------------------------------------------------------------
    @staticmethod
    def _key(row: Mapping[str, Any]) -> tuple[int, int]:
        try:
            return int(row["env_seed"]), int(row["env_index"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"a CoMLRL row of this export needs 'env_seed' and 'env_index' (from ComlrlExport.dataset()), "
                f"got keys {sorted(row)}."
            ) from exc

    def _render(self, node: _Node) -> list[str]:
        return [render_prompt(node.env.observe(p).to_chat(), self._tokenizer) for p in self.agents]

    async def _others(self, env: Any, obs: Any, infos: Any, seed: int, actions: Mapping[str, str] | None = None):
        """The driver: the trained players' ``actions`` (if any), then the others' moves until a
        trained player is on turn. Policies get ``seed + env step`` (as in the single-agent view)."""
        from collab_env.rollout import advance

        start = seed + env.unwrapped.episode.step
        return await advance(env, self._policies, obs=obs, infos=infos, until=self.agents, actions=actions,
                             sampling=self._sampling, seed=lambda k: start + k)

    def _opening(self, row: Mapping[str, Any]) -> _Node:
        key = self._key(row)
        node = self._openings.get(key)
        if node is None:
            env = self._proto.clone() if hasattr(self._proto, "clone") else None
            if env is None:
                raise EnvStateError(f"{self.env_id} cannot be cloned; the CoMLRL export forks env states.")
            obs, infos = env.reset(seed=key[0], options={"index": key[1]})
            run = run_sync(self._others(env, obs, infos, key[0]))
            node = _Node(env, run.obs, run.infos, ())
            node.prompts = self._render(node)
            self._openings[key] = node
        return node

    def _step(self, node: _Node, joint: Sequence[str], row_key: tuple[int, int]) -> tuple[_Node, float]:
        history = node.history + (tuple(joint),)
        if not node.env.agents:  # the episode has ended: later turns score 0
            return _Node(node.env, node.obs, node.infos, history, prompts=node.prompts), 0.0
        env = node.env.clone()
        on_turn = [p for p in self.agents if node.infos.get(p, {}).get("on_turn")]
        actions = {p: joint[self.agents.index(p)] for p in on_turn}
        run = run_sync(self._others(env, dict(node.obs), dict(node.infos), row_key[0], actions))
        reward = sum(run.reward(p) for p in self.agents) / self.num_agents
        new = _Node(env, run.obs, run.infos, history)
        new.prompts = self._render(new)
        return new, float(reward)

    def _node_for(self, history: tuple[tuple[str, ...], ...], row_key: tuple[int, int]) -> _Node:
        node = self._stepped.get(history)
        if node is None:  # not stepped here (another process): replay from the opening
            node = self._openings.get(row_key) or self._opening({"env_seed": row_key[0], "env_index": row_key[1]})
            for joint in history:
                node, _ = self._step(node, joint, row_key)
            self._stepped[history] = node
        return node

    # -- CoMLRL's functions --------------------------------------------------------------------
    def _formatter(self, k: int):
        def formatter(item: Mapping[str, Any], external_prompts: Any = None) -> str:
            if external_prompts is not None:
                return external_prompts
            return self._opening(item).prompts[k]

        formatter.__name__ = f"format_{self.agents[k]}"
        formatter.__doc__ = f"CoMLRL prompt of {self.agents[k]!r}: its opening view, or the external prompt."
        return formatter

    def reward_func(self, *agent_completions: Sequence[str], batch_items: Sequence[Mapping[str, Any]] | None = None,
                    prompts: Sequence[str] | None = None) -> list[float]:
        """CoMLRL's joint reward: one list of completions per agent (aligned), ``batch_items=[row]``.

        Returns one reward per aligned joint action (see the module docstring for the state it
        answers).
        """
        if len(agent_completions) != self.num_agents:
            raise ConfigError(f"reward_func takes one completion list per agent ({self.num_agents}), "
                              f"got {len(agent_completions)}.")
        if not batch_items:
            raise ConfigError("reward_func needs batch_items=[row] (CoMLRL passes it).")
        key = self._key(batch_items[0])
        node = self._state_for(key, prompts)
        node.scored = True
        rewards = []
        for joint in zip(*agent_completions, strict=True):
            new, r = self._step(node, joint, key)
            self._stepped[new.history] = new
            rewards.append(r)
        return rewards

    def _state_for(self, key: tuple[int, int], prompts: Sequence[str] | None) -> _Node:
        if key == self._row_key:
            if prompts and prompts[0] in self._by_prompt:
                return self._by_prompt[prompts[0]]
            if self._latest is not None and not self._latest.scored:
                return self._latest
        # A new tree: the row's opening.
        self._row_key, self._stepped, self._by_prompt, self._latest = key, {}, {}, None
        return self._opening({"env_seed": key[0], "env_index": key[1]})

    def external_transition(self, prompt: str = "", agent_completions: Sequence[str] = (),
                            num_agents: int | None = None,
                            prompt_history_per_agent: Sequence[Sequence[str]] | None = None,
                            response_history_per_agent: Sequence[Sequence[str]] | None = None,
                            **_: Any) -> list[str]:
        """CoMLRL's external transition: each agent's next prompt after the joint action that ends
        ``response_history_per_agent``."""
        if num_agents is not None and num_agents != self.num_agents:
            raise ConfigError(f"this export has {self.num_agents} agents, CoMLRL runs {num_agents}.")
        if response_history_per_agent is None:
            raise ConfigError("external_transition needs response_history_per_agent (CoMLRL passes it).")
        if self._row_key is None:
            raise EnvStateError("external_transition before any reward_func call: CoMLRL scores a turn first.")
        history = tuple(zip(*response_history_per_agent, strict=True))
        if agent_completions and tuple(agent_completions) != history[-1]:
            raise ConfigError("agent_completions must be the last entries of response_history_per_agent.")
        node = self._node_for(history, self._row_key)
        node.scored = False
        self._latest = node
        self._by_prompt[node.prompts[0]] = node
        return list(node.prompts)

    def dataset(self):
        """The rows as a Hugging Face ``datasets.Dataset`` (CoMLRL's ``train_dataset``)."""
        from datasets import Dataset

        return Dataset.from_list([dict(r) for r in self.rows])

    def __repr__(self) -> str:
        return f"<ComlrlExport {self.env_id} agents={list(self.agents)} rows={len(self.rows)}>"


def export(env_id: str, **kwargs: Any) -> ComlrlExport:
    """CoMLRL's dataset, formatters, reward function and external transition for ``env_id``.

    Args:
        env_id: A registered collab_env id.
        **kwargs: ``players`` (the trained players; default the spec's trainable ones),
            ``policies`` / ``sampling`` (for the other players), ``tokenizer`` (render prompts
            with its chat template; default :func:`render_prompt`'s plain text), ``num_items`` /
            ``indices`` (the rows' items; default every item of a finite suite), ``seed`` (row
            ``k`` resets with ``seed + k``), and ``collab_env.make`` keywords (``reward=``,
            env overrides such as ``num_turns=``).

    Raises:
        ConfigError: Unknown players, a policy for a trained player, an unlimited suite without
            ``num_items``/``indices``.
    """
    return ComlrlExport(env_id, **kwargs)
