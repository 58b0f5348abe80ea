"""Tinker: any registered collab_env env as a tinker-cookbook RL env.

tinker-cookbook's RL loop (``tinker_cookbook.rl.train.main``) samples from a Tinker sampling client,
steps ``Env`` objects made by ``EnvGroupBuilder``\\ s that an ``RLDatasetBuilder`` hands it, and
trains on the tokens it sampled. Here the trained player's side of a collab_env env is such an
``Env``; every other player (a simulated user, a fixed partner) is played by its policy through
the one episode driver, inside the env's single-agent view
(:class:`~collab_env.wrappers.single_agent.SingleAgentEnv`, its async ``areset``/``astep``)::

    import chz
    from tinker_cookbook.rl import train
    from collab_env.adapters.tinker import CollabDatasetBuilder

    builder = CollabDatasetBuilder(env_id="letter-requests", model_name_for_tokenizer=MODEL,
                                   renderer_name="qwen3_disable_thinking", batch_size=4, group_size=4)
    config = train.Config(learning_rate=1e-4, dataset_builder=builder, model_name=MODEL,
                          recipe_name="collab_env", max_tokens=32, log_path="/tmp/run",
                          base_url=None)  # or the URL of any Tinker-compatible service
    asyncio.run(train.main(config))

The layers, lowest first:

* :class:`CollabMessageEnv`: a cookbook ``MessageEnv`` (chat messages in, chat messages out).
* :class:`CollabTinkerEnv`: the token-level ``Env`` over a renderer. A reply cut at the token
  limit is still the player's move (as everywhere in collab_env), not the end of the episode.
* :class:`CollabEnvGroupBuilder`: ``group_size`` envs on one task item and seed. It holds only
  names and numbers (env id, item, seed, tokenizer and renderer names, policy specs), so it
  pickles; the envs, the tokenizer and the renderer are built in ``make_envs``.
* :class:`CollabDataset` / :class:`CollabDatasetBuilder`: batches of builders over the items.
* :class:`CompleterPolicy`: a cookbook ``MessageCompleter`` (e.g. ``TinkerMessageCompleter`` over
  a Tinker sampling client) as a collab_env policy, so a simulated user or a partner can be
  sampled from a Tinker model.

Rewards: whatever ``collab_env.make`` builds for the trained player (the env's own reward, the
multiturn-aware reward ``reward="mr"``, a joint reward option such as ``"joint-shared"``), paid
per step (``reward_at="step"``: each move's ``StepResult.reward`` is the view's reward for it) or
once per episode as the group reward (``reward_at="group"``: the steps pay 0 and
``compute_group_rewards`` returns each episode's return). MR's futures are rolled by the policies
of ``reward_kwargs`` (``policy=``, ``user=``: specs, so the builder pickles), as for any
Gymnasium view: tinker-cookbook hands its sampling client to its own sampler, not to envs, so
the futures are not sampled from the model being trained (the recipe's rule); our own learners
(``collab_env.adapters``) roll them with the live model.

Needs the ``tinker`` extra (``pip install 'collab_env[tinker]'``: ``tinker`` and ``tinker-cookbook``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from collab_env.errors import ConfigError, EnvStateError, require
from collab_env.types import Tool, ToolCall, template_chat

_cookbook = require("tinker_cookbook", "tinker", "collab_env.adapters.tinker")
import chz  # noqa: E402
import tinker  # noqa: E402
from tinker_cookbook import renderers  # noqa: E402
from tinker_cookbook.completers import MessageCompleter, StopCondition  # noqa: E402
from tinker_cookbook.rl.message_env import MessageEnv, MessageStepResult  # noqa: E402
from tinker_cookbook.rl.types import (  # noqa: E402
    Action,
    ActionExtra,
    Env,
    EnvGroupBuilder,
    Metrics,
    RLDataset,
    RLDatasetBuilder,
    StepResult,
    Trajectory,
)
from tinker_cookbook.tokenizer_utils import get_tokenizer  # noqa: E402

__all__ = [
    "CollabMessageEnv",
    "CollabTinkerEnv",
    "CollabEnvGroupBuilder",
    "CollabDataset",
    "CollabDatasetBuilder",
    "CompleterPolicy",
    "REWARD_AT",
]

#: Where the trained player's reward is paid: at each move, or once per episode as the group reward.
REWARD_AT = ("step", "group")


def _check_reward_at(reward_at: str) -> None:
    if reward_at not in REWARD_AT:
        raise ConfigError(f"reward_at={reward_at!r}: choose one of {list(REWARD_AT)}.")


class CollabMessageEnv(MessageEnv):
    """The trained player's side of a collab_env env as a cookbook ``MessageEnv``.

    Args:
        env_id: A registered collab_env id.
        index: The task item (``None``: the env draws one from ``seed``).
        seed: The episode seed (the other players' sampling and the env's draws).
        player: The trained player (default: the spec's first trainable player).
        policies: Player -> policy for the other players (objects, registered names, specs);
            left out: the spec's default policies.
        reward_at: ``"step"``: each move's reward is the view's reward for it; ``"group"``: the
            moves pay 0 and :attr:`episode_return` is paid by the group builder.
        env_kwargs: Keywords of ``collab_env.make`` (``reward=``, ``reward_kwargs=``, overrides).

    ``initial_observation`` resets the env and returns the player's view as chat messages;
    ``step(message)`` sends the message's text as the player's move and returns the view after
    the other players answered (the whole chat, as the cookbook's renderers expect).
    """

    def __init__(
        self,
        env_id: str,
        *,
        index: int | None = None,
        seed: int | None = None,
        player: str | None = None,
        policies: Mapping[str, Any] | None = None,
        reward_at: Literal["step", "group"] = "step",
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        import collab_env
        from collab_env.registry import spec

        _check_reward_at(reward_at)
        kwargs = dict(env_kwargs or {})
        for bad in ("view", "policies"):
            if bad in kwargs:
                raise ConfigError(f"pass {bad}= as player=/policies=, not in env_kwargs.")
        s = spec(env_id)
        if player is not None and player not in s.players:
            raise ConfigError(f"player={player!r} is not a player of {s.id}; players: {list(s.players)}.")
        self.env_id = s.id
        self.player = player or (s.trainable[0] if s.trainable else s.players[0])
        self.index, self.seed, self.reward_at = index, seed, reward_at
        self.view = collab_env.make(self.env_id, view=self.player, policies=policies, **kwargs)
        self.example_id = f"{self.env_id}/{index}"
        self.episode_return = 0.0
        self.turns = 0
        self.done = False
        self.components: dict[str, float] = {}
        #: The tools the env declares to the player (the ``tools=`` list of OpenAI-style APIs,
        #: :attr:`collab_env.types.Conversation.tools`), set by :meth:`initial_observation`; a
        #: renderer declares them with :func:`declare_tools`.
        self.tools: list[dict[str, Any]] = []
        self._started = False

    async def initial_observation(self) -> list[renderers.Message]:
        options = {"index": self.index} if self.index is not None else None
        obs, _ = await self.view.areset(seed=self.seed, options=options)
        self._started, self.done = True, not self.view.env.agents
        self.episode_return, self.turns, self.components = 0.0, 0, {}
        self.tools = obs.tools
        return _messages(obs)

    async def step(self, message: renderers.Message) -> MessageStepResult:
        if not self._started:
            raise EnvStateError("step() before initial_observation().")
        if self.done:
            raise EnvStateError("the episode has ended; make a new env.")
        text = renderers.get_text_content(message)
        obs, reward, terminated, truncated, info = await self.view.astep(text)
        self.turns += 1
        self.episode_return += float(reward)
        for k, v in info.get("reward_components", {}).items():
            self.components[k] = self.components.get(k, 0.0) + float(v)
        self.done = bool(terminated or truncated)
        metrics: dict[str, float] = {}
        if self.done:
            metrics = {"return": self.episode_return, "turns": float(self.turns),
                       **{f"reward/{k}": v for k, v in self.components.items()}}
        paid = float(reward) if self.reward_at == "step" else 0.0
        return MessageStepResult(reward=paid, episode_done=self.done, next_messages=_messages(obs),
                                 metrics=metrics)

    def close(self) -> None:
        self.view.close()


def _messages(obs: Any) -> list[renderers.Message]:
    """The view as cookbook messages, tool calls and results included. A call is given as the
    text the model wrote (:func:`~collab_env.types.template_chat`: the renderer renders it once,
    from those tokens, so an observation extends the previous observation and action token by
    token and the cookbook trains the episode as one sequence); a call with no text keeps its
    ``tool_calls``. A ``"tool"`` result keeps its ``tool_call_id`` and the called tool's ``name``."""
    names = {c.id: c.name for m in obs for c in m.tool_calls}
    out: list[renderers.Message] = []
    for m in template_chat(obs.to_chat()):
        msg = renderers.Message(role=m["role"], content=m["content"])
        calls = [ToolCall.from_dict(c) for c in m.get("tool_calls") or ()]
        if calls:
            msg["tool_calls"] = [renderers.ToolCall(id=c.id, function=renderers.ToolCall.FunctionBody(
                name=c.name, arguments=json.dumps(dict(c.arguments)))) for c in calls]
        if m.get("tool_call_id") is not None:
            msg["tool_call_id"] = m["tool_call_id"]
            if m["tool_call_id"] in names:
                msg["name"] = names[m["tool_call_id"]]
        out.append(msg)
    return out


def declare_tools(renderer: renderers.Renderer, messages: list[renderers.Message],
                  tools: Sequence[Mapping[str, Any]]) -> list[renderers.Message]:
    """``messages`` with ``tools`` (OpenAI-style entries) declared the renderer's way:
    ``renderer.create_conversation_prefix_with_tools`` takes the leading system message's text and
    replaces it (Qwen3: a ``<tools>`` block in the system message), as the cookbook's own tool
    envs build their prompts. The same prefix on every step, so each observation still extends
    the previous one token by token. No tools: ``messages`` as given."""
    if not tools:
        return messages
    specs = [renderers.ToolSpec(name=t.name, description=t.description, parameters=dict(t.parameters))
             for t in map(Tool.from_dict, tools)]
    system = ""
    rest = list(messages)
    if rest and rest[0]["role"] == "system":
        system = renderers.get_text_content(rest.pop(0))
    try:
        prefix = renderer.create_conversation_prefix_with_tools(specs, system)
    except NotImplementedError:
        raise ConfigError(f"renderer {type(renderer).__name__} cannot declare tools, and this env gives the player "
                          f"{len(specs)} ({', '.join(t['name'] for t in specs)}): choose a renderer with tool "
                          "calling (e.g. renderer_name='qwen3').") from None
    return prefix + rest


class CollabTinkerEnv(Env):
    """The token-level cookbook ``Env`` of a :class:`CollabMessageEnv`, through ``renderer``.

    The observation is the player's whole view rendered as a generation prompt; an action's tokens
    are parsed by the renderer and their text is the move, whether sampling stopped on a stop
    sequence or at the token limit (a truncated reply is a reply in collab_env; the cookbook's
    own ``EnvFromMessageEnv`` would end the episode there instead).
    """

    def __init__(self, message_env: CollabMessageEnv, renderer: renderers.Renderer) -> None:
        self.message_env = message_env
        self.renderer = renderer
        self.example_id = message_env.example_id

    def _stop(self) -> StopCondition:
        return self.renderer.get_stop_sequences()

    def _text(self, action: Action) -> str:
        """The text of ``action``'s tokens, without the stop token it ended on."""
        ids = list(action)
        stop = self._stop()
        if ids and stop and isinstance(stop[0], int) and ids[-1] in stop:
            ids = ids[:-1]
        return str(self.renderer.tokenizer.decode(ids))

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        messages = await self.message_env.initial_observation()
        if self.message_env.done:
            raise EnvStateError(f"the episode of {self.example_id} ended before {self.message_env.player!r} "
                                f"acted ({self.message_env.view.env.episode.end_reason}).")
        return self._prompt(messages), self._stop()

    def _prompt(self, messages: list[renderers.Message]) -> tinker.ModelInput:
        """The generation prompt of ``messages``, the env's tools declared (:func:`declare_tools`)."""
        return self.renderer.build_generation_prompt(declare_tools(self.renderer, messages, self.message_env.tools))

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        message, _termination = self.renderer.parse_response(action)
        if message.get("tool_calls") or message.get("unparsed_tool_calls"):
            # The renderer took the reply's tool-call blocks out of its text; the move is the
            # text the model wrote, all of it (collab_env's env reads the calls from it).
            message = renderers.Message(role="assistant", content=self._text(action))
        result = await self.message_env.step(message)
        nxt = (tinker.ModelInput.empty() if result.episode_done
               else self._prompt(result.next_messages))
        metrics: Metrics = dict(result.metrics)
        if (extra or {}).get("stop_reason") == "length":
            metrics["truncated_reply"] = 1.0
        return StepResult(reward=result.reward, episode_done=result.episode_done, next_observation=nxt,
                          next_stop_condition=self._stop(), metrics=metrics)


class CollabEnvGroupBuilder(EnvGroupBuilder):
    """``group_size`` envs of ``env_id`` on task item ``index`` with episode seed ``seed``.

    Holds names and numbers only, so it pickles (the cookbook may ship builders to other
    processes); ``make_envs`` builds the tokenizer (``model_name_for_tokenizer``, through
    ``tinker_cookbook.tokenizer_utils.get_tokenizer``), the renderer (``renderer_name``) and the
    envs. ``policies`` are specs (strings) for the same reason. Every env of the group plays the
    same item with the same seed, so the group's returns differ by the trained model's replies.
    """

    def __init__(
        self,
        env_id: str,
        *,
        index: int | None,
        seed: int,
        group_size: int,
        model_name_for_tokenizer: str,
        renderer_name: str,
        player: str | None = None,
        policies: Mapping[str, str] | None = None,
        reward_at: Literal["step", "group"] = "step",
        env_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        _check_reward_at(reward_at)
        if group_size < 1:
            raise ConfigError(f"group_size must be >= 1, got {group_size}.")
        for p, v in (policies or {}).items():
            if not isinstance(v, str):
                raise ConfigError(f"policies[{p!r}] must be a policy spec (str) so the builder pickles; "
                                  f"got {type(v).__name__}.")
        self.env_id, self.index, self.seed, self.group_size = env_id, index, seed, group_size
        self.model_name_for_tokenizer, self.renderer_name = model_name_for_tokenizer, renderer_name
        self.player, self.reward_at = player, reward_at
        self.policies = dict(policies or {})
        self.env_kwargs = dict(env_kwargs or {})

    async def make_envs(self) -> Sequence[Env]:
        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name_for_tokenizer))
        return [CollabTinkerEnv(CollabMessageEnv(self.env_id, index=self.index, seed=self.seed, player=self.player,
                                                 policies=self.policies or None, reward_at=self.reward_at,
                                                 env_kwargs=self.env_kwargs), renderer)
                for _ in range(self.group_size)]

    async def compute_group_rewards(self, trajectory_group: list[Trajectory],
                                    env_group: Sequence[Env]) -> list[tuple[float, Metrics]]:
        if self.reward_at == "step":
            return [(0.0, {}) for _ in trajectory_group]
        out: list[tuple[float, Metrics]] = []
        for env in env_group:
            assert isinstance(env, CollabTinkerEnv)
            out.append((env.message_env.episode_return, {"group_reward": env.message_env.episode_return}))
        return out

    async def cleanup(self) -> None:
        return None

    def logging_tags(self) -> list[str]:
        return [self.env_id.rsplit("-v", 1)[0]]


class CollabDataset(RLDataset):
    """Batches of :class:`CollabEnvGroupBuilder`: batch ``b`` is ``builders[b*batch_size:(b+1)*batch_size]``."""

    def __init__(self, builders: Sequence[CollabEnvGroupBuilder], batch_size: int) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}.")
        if len(builders) < batch_size:
            raise ConfigError(f"{len(builders)} groups make no batch of {batch_size}: give more items or a "
                              "smaller batch_size.")
        self.builders, self.batch_size = list(builders), batch_size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        return self.builders[index * self.batch_size:(index + 1) * self.batch_size]

    def __len__(self) -> int:
        return len(self.builders) // self.batch_size


@chz.chz
class CollabDatasetBuilder(RLDatasetBuilder):
    """The cookbook's dataset builder for a collab_env env (a ``chz`` class, as ``rl.train`` expects).

    Batch ``b`` holds ``batch_size`` groups; group ``k`` (counting over all batches) plays item
    ``indices[k % len(indices)]`` (default: items ``0..num_batches*batch_size-1``) with episode
    seed ``seed + k``. ``test_groups`` more groups (the items after the training ones) make the
    test set. ``policies`` are policy specs for the other players; ``env_kwargs`` are keywords of
    ``collab_env.make`` (``reward="mr"``, ``reward_kwargs=``, a joint reward option, env
    overrides such as ``num_turns=``); the other fields are those of :class:`CollabEnvGroupBuilder`.
    """

    env_id: str
    model_name_for_tokenizer: str
    renderer_name: str
    batch_size: int
    group_size: int
    num_batches: int = 1
    indices: tuple[int, ...] | None = None
    seed: int = 0
    player: str | None = None
    policies: dict[str, str] = chz.field(default_factory=dict)
    reward_at: str = "step"
    env_kwargs: dict[str, Any] = chz.field(default_factory=dict)
    test_groups: int = 0

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        from collab_env.registry import spec

        spec(self.env_id)  # an unknown id fails here, with the closest names
        _check_reward_at(self.reward_at)
        if self.num_batches < 1:
            raise ConfigError(f"num_batches must be >= 1, got {self.num_batches}.")
        n = self.num_batches * self.batch_size
        items = list(self.indices) if self.indices is not None else list(range(n + self.test_groups))

        def group(k: int) -> CollabEnvGroupBuilder:
            reward_at: Literal["step", "group"] = "group" if self.reward_at == "group" else "step"
            return CollabEnvGroupBuilder(
                self.env_id, index=items[k % len(items)], seed=self.seed + k, group_size=self.group_size,
                model_name_for_tokenizer=self.model_name_for_tokenizer, renderer_name=self.renderer_name,
                player=self.player, policies=self.policies, reward_at=reward_at, env_kwargs=self.env_kwargs)

        train = CollabDataset([group(k) for k in range(n)], self.batch_size)
        test = (CollabDataset([group(n + k) for k in range(self.test_groups)], self.test_groups)
                if self.test_groups else None)
        return train, test


class CompleterPolicy:
    """A cookbook ``MessageCompleter`` as a collab_env policy (e.g. a simulated user sampled from a
    Tinker model: ``CompleterPolicy(TinkerMessageCompleter(sampling_client, renderer, max_tokens=64))``).

    Each observation (the acting player's view) goes to the completer as chat messages, in which
    the acting player's own messages are the ``assistant`` turns; the reply's text is the move.
    Sampling settings are the completer's own (its ``max_tokens``, ``temperature``): the driver's
    sampling keywords are not passed on.
    """

    def __init__(self, completer: MessageCompleter, name: str = "tinker-completer") -> None:
        if not callable(completer):
            raise ConfigError(f"completer must be a tinker_cookbook MessageCompleter, got {type(completer).__name__}.")
        self.completer = completer
        self.name = name

    async def act(self, observations: Sequence[Any], **sampling: Any) -> list[Any]:
        import asyncio

        from collab_env.types import Completion

        replies = await asyncio.gather(*(self.completer(_messages(o)) for o in observations))
        return [Completion(text=renderers.get_text_content(r), finish_reason="stop", meta={"policy": self.name})
                for r in replies]

    def __repr__(self) -> str:
        return f"<CompleterPolicy {self.name}>"

