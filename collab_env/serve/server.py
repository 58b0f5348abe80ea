"""A registered env as an OpenEnv environment (``collab-env serve ID``).

One seat of the env is played over the wire; the other seats are driven by the policies the
server was started with (given by spec, like ``collab-env eval``'s ``--policy``), inside the
single-agent view (:class:`~collab_env.wrappers.single_agent.SingleAgentEnv`, built by
:func:`collab_env.make` with ``view=<seat>``). Each WebSocket connection is one session with its
own env; at most ``max_sessions`` at once (OpenEnv's ``max_concurrent_envs``): one more gets a
``CAPACITY_REACHED`` error and is closed.

The wire (OpenEnv's): ``reset`` takes the keywords ``seed``, ``index`` (the task item),
``episode_id`` and ``api_base`` (the endpoint of the policy being trained, for the multiturn-aware
reward's futures, given per session); ``step`` takes ``{"message": text}``.

**Branching** (what a learner that forks episodes needs: MAGRPO's joint actions, a tree of
futures): ``step`` with ``{"fork": true}`` makes no move; it parks a copy of the session's episode
(the env and the other seats' state) and returns its ``fork_token``. A new session adopts it with
``reset(fork=token)`` and continues from there. A token is adopted once; an unadopted copy is
dropped after ``fork_ttl_s`` seconds, or when more than ``max_sessions`` copies wait. The observation holds
the seat's view as chat messages (``messages``), the other players' moves since its last move
(``other_moves``), the reward and ``done``, and ``terminated``, ``truncated``, ``end_reason``,
``index`` and ``reward_components``. ``GET /schema`` carries the env's card (under
``observation.card``) and what a client needs (``observation.collab_env``: env id, seat, role,
number of items); ``GET /sessions`` the open sessions.

Bad input gets an error to its client and never stops the server: an unknown action field a
``VALIDATION_ERROR``, an unknown reset keyword or a step outside an episode an
``EXECUTION_ERROR`` naming the fix, a WebSocket message over ``max_message_bytes`` a close with
code 1009, and a connection that drops mid-episode frees its session.
"""

# ruff: noqa: E402 (openenv is checked first: the imports below need it)
from __future__ import annotations

import secrets
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from collab_env.errors import ConfigError, EnvStateError, require

require("openenv", "serve", "collab_env.serve.server")

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import ConfigDict, Field

__all__ = ["ServeConfig", "ChatAction", "ChatObservation", "ServedEnv", "build_app", "serve",
           "RESET_KEYWORDS"]

#: The keywords ``reset`` takes over the wire; any other is an error that lists them.
RESET_KEYWORDS = ("seed", "index", "episode_id", "api_base", "fork")


class ChatAction(Action):
    """The served seat's move."""

    message: str = Field(description="The seat's message text (empty with fork).")
    fork: bool = Field(default=False, description="Make no move: park a copy of this episode for another "
                                                  "session to adopt with reset(fork=<the observation's "
                                                  "fork_token>).")


class ChatObservation(Observation):
    """What the served seat sees after a reset or a step (``reward`` and ``done`` are OpenEnv's)."""

    messages: list[dict[str, Any]] = Field(default_factory=list,
                                           description="The seat's view of the conversation, as chat messages "
                                                       "(role, content, author, ...).")
    other_moves: list[dict[str, str]] = Field(default_factory=list,
                                              description="The other players' moves since the seat's last move "
                                                          "({player, text}).")
    terminated: bool = Field(default=False, description="The episode ended by protocol.")
    truncated: bool = Field(default=False, description="The episode ended by a budget or a fault.")
    end_reason: str | None = Field(default=None, description="Why the episode ended.")
    index: int | None = Field(default=None, description="The task item played.")
    reward_components: dict[str, float] = Field(default_factory=dict,
                                                description="The reward's named components of this step.")
    fork_token: str | None = Field(default=None, description="After a fork request: the token a new session "
                                                             "passes to reset(fork=...) to continue this episode.")


@dataclass
class ServeConfig:
    """What a server serves.

    Args:
        env_id: A registered env id.
        seat: The player played over the wire (default: the env's only trainable player, else its
            first trainable one).
        policies: Player -> policy spec of the other seats (over the spec's defaults); a spec for
            the served seat is the policy the multiturn-aware reward's futures use for it, whose
            ``api_base`` a session may set at reset.
        reward: A reward option of :func:`collab_env.make` (``"mr"``, ``"conversation"``...).
        reward_kwargs: Its keywords (``judge``, ``num_rollouts``...).
        env_kwargs: Other keywords of :func:`collab_env.make` (``split``, ``max_steps``...).
        max_sessions: Most sessions (WebSocket connections) at once.
        max_message_bytes: Largest WebSocket message the server reads.
        fork_ttl_s: How long a parked copy of an episode (a fork) waits for a session to adopt it.
    """

    env_id: str
    seat: str | None = None
    policies: Mapping[str, Any] = field(default_factory=dict)
    reward: str | None = None
    reward_kwargs: Mapping[str, Any] = field(default_factory=dict)
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_sessions: int = 64
    max_message_bytes: int = 1 << 20
    fork_ttl_s: float = 600.0

    def __post_init__(self) -> None:
        from collab_env.registry import spec

        s = spec(self.env_id)  # unknown id: the closest ids
        self.env_id = s.id
        for name in ("max_sessions", "max_message_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}.")
        if isinstance(self.fork_ttl_s, bool) or not isinstance(self.fork_ttl_s, (int, float)) or self.fork_ttl_s <= 0:
            raise ConfigError(f"fork_ttl_s must be a number of seconds > 0, got {self.fork_ttl_s!r}.")
        composing = sorted(set(self.env_kwargs) & {"view", "policies", "reward", "reward_kwargs"})
        if composing:
            raise ConfigError(f"env_kwargs {composing}: give them as the server's seat, policies, reward and "
                              "reward_kwargs.")
        if self.reward is None and self.reward_kwargs:
            raise ConfigError("reward_kwargs need a reward: add reward='mr' (CLI: --reward mr) or another option.")
        trainable = list(s.trainable)
        if self.seat is None:
            if not trainable:
                raise ConfigError(f"{s.id} has no trainable player to serve; pass seat= (CLI: --seat), one of "
                                  f"{list(s.players)}.")
            self.seat = trainable[0]
        elif self.seat not in s.players:
            raise ConfigError(f"seat {self.seat!r} is not a player of {s.id}; players: {list(s.players)}.")
        self.policies = dict(self.policies)
        self.reward_kwargs = dict(self.reward_kwargs)
        self.env_kwargs = dict(self.env_kwargs)

    @property
    def seat_policy(self) -> Any:
        """The spec given for the served seat (the futures' policy), or ``None``."""
        return self.policies.get(str(self.seat))

    def make(self, api_base: str | None = None) -> Any:
        """The single-agent view of the seat, the other seats driven by their policies; with
        ``api_base``, the multiturn-aware reward's futures play the seat through that endpoint."""
        import collab_env

        reward_kwargs = dict(self.reward_kwargs)
        if self.seat_policy is not None and self.reward == "mr":
            from collab_env.policy import policy_spec

            reward_kwargs.setdefault("policy", policy_spec(self.seat_policy, api_base=api_base)
                                     if api_base is not None else self.seat_policy)
        elif api_base is not None:
            raise ConfigError("reset(api_base=...) is the endpoint of the trained policy for the multiturn-aware "
                              "reward's futures: this server has no --reward mr with a --policy "
                              f"{self.seat}=SPEC to connect; reset without api_base.")
        others = {p: ref for p, ref in self.policies.items() if p != self.seat}
        kwargs: dict[str, Any] = dict(self.env_kwargs)
        if self.reward is not None:
            kwargs["reward"] = self.reward
            if reward_kwargs:
                kwargs["reward_kwargs"] = reward_kwargs
        return collab_env.make(self.env_id, view=self.seat, policies=others, **kwargs)

    def describe(self) -> dict[str, Any]:
        """What a client needs to know about the served seat (the schema route's ``collab_env``)."""
        from collab_env.registry import spec

        s = spec(self.env_id)
        view = self.make()
        try:
            task = view.env.unwrapped.task
            return {"env_id": s.id, "seat": self.seat, "role": task.role_of(str(self.seat)),
                    "trainable": bool(task.is_trainable(str(self.seat))), "num_items": task.num_items(),
                    "players": list(s.players), "reward": self.reward}
        finally:
            view.close()


class ServedEnv(Environment):
    """One session's env: the seat of :attr:`config` (a subclass per server sets it)."""

    SUPPORTS_CONCURRENT_SESSIONS: ClassVar[bool] = True
    config: ClassVar[ServeConfig]
    #: Parked copies of episodes (forks): token -> (deadline, view, api_base, done, step count).
    parked: ClassVar[OrderedDict[str, tuple[float, Any, str | None, bool, int]]]
    parked_lock: ClassVar[threading.Lock]

    def __init__(self) -> None:
        super().__init__()
        self._view: Any = None
        self._api_base: str | None = None
        self._done = True
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ChatObservation:
        unknown = sorted(set(kwargs) - set(RESET_KEYWORDS))
        if unknown:
            raise ConfigError(f"reset got unknown keyword(s) {unknown}; it takes {', '.join(RESET_KEYWORDS)}.")
        if kwargs.get("fork") is not None:
            given = (("seed", seed), ("index", kwargs.get("index")), ("api_base", kwargs.get("api_base")))
            return self._adopt(kwargs["fork"], episode_id, [k for k, v in given if v is not None])
        index, api_base = kwargs.get("index"), kwargs.get("api_base")
        for name, value, kind in (("seed", seed, int), ("index", index, int), ("api_base", api_base, str)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                raise ConfigError(f"reset's {name} must be {'an int' if kind is int else 'a string'} or null, "
                                  f"got {value!r}.")
        if self._view is None or api_base != self._api_base:
            self.close()
            self._view = self.config.make(api_base)
            self._api_base = api_base
        obs, info = self._view.reset(seed=seed, options=None if index is None else {"index": index})
        st = self._view.env.unwrapped.episode
        self._done = not self._view.env.agents
        self._state = State(episode_id=episode_id, step_count=0)
        return self._observation(obs, 0.0, st.terminated, st.truncated, info)

    def step(self, action: ChatAction, timeout_s: float | None = None, **kwargs: Any) -> ChatObservation:
        if self._view is None:
            raise EnvStateError("no episode in progress: send reset first.")
        if action.fork:
            if action.message:
                raise ConfigError("a fork request makes no move: send either a message or fork=true.")
            return self._fork()
        if self._done:
            raise EnvStateError("the episode has ended: send reset to start the next one.")
        obs, reward, terminated, truncated, info = self._view.step(action.message)
        self._done = bool(terminated or truncated)
        self._state = State(episode_id=self._state.episode_id, step_count=self._state.step_count + 1)
        return self._observation(obs, float(reward), bool(terminated), bool(truncated), info)

    def _fork(self) -> ChatObservation:
        """Park a copy of this episode; its token goes back in the observation."""
        token = secrets.token_urlsafe(18)
        cls = type(self)
        entry = (time.monotonic() + self.config.fork_ttl_s, self._view.clone(), self._api_base, self._done,
                 self._state.step_count)
        with cls.parked_lock:
            self._expire()
            cls.parked[token] = entry
            while len(cls.parked) > self.config.max_sessions:
                cls.parked.popitem(last=False)[1][1].close()
        st = self._view.env.unwrapped.episode
        obs = self._observation(self._view.observation, 0.0, st.terminated, st.truncated, {})
        obs.fork_token = token
        return obs

    def _adopt(self, token: Any, episode_id: str | None, others: list[str]) -> ChatObservation:
        """Continue the parked episode ``token`` in this session."""
        if others:
            raise ConfigError(f"reset(fork=...) continues a parked episode: it takes no {', '.join(sorted(others))}.")
        if not isinstance(token, str):
            raise ConfigError(f"reset's fork must be a fork_token string, got {token!r}.")
        cls = type(self)
        with cls.parked_lock:
            self._expire()
            entry = cls.parked.pop(token, None)
        if entry is None:
            raise ConfigError("no parked episode has that fork token: a token is adopted once and waits "
                              f"{self.config.fork_ttl_s:g} s; fork the episode again.")
        _, view, api_base, done, steps = entry
        self.close()
        self._view, self._api_base, self._done = view, api_base, done
        self._state = State(episode_id=episode_id, step_count=steps)
        st = view.env.unwrapped.episode
        return self._observation(view.observation, 0.0, st.terminated, st.truncated, {})

    def _expire(self) -> None:
        """Drop the parked copies past their deadline (the caller holds the lock)."""
        now = time.monotonic()
        for token in [t for t, e in type(self).parked.items() if e[0] < now]:
            type(self).parked.pop(token)[1].close()

    def _observation(self, obs: Any, reward: float, terminated: bool, truncated: bool,
                     info: Mapping[str, Any]) -> ChatObservation:
        st = self._view.env.unwrapped.episode
        return ChatObservation(
            messages=[m.to_dict() for m in obs],
            other_moves=[{"player": p, "text": t} for p, t in info.get("other_moves", ())],
            reward=reward, done=self._done, terminated=terminated, truncated=truncated,
            end_reason=st.end_reason, index=st.index,
            reward_components={k: float(v) for k, v in dict(info.get("reward_components") or {}).items()})

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        from collab_env.registry import spec

        s = spec(self.config.env_id)
        card = "\n".join(f"{h}: {t}" for h, t in s.card.lines()) if s.card is not None else None
        return EnvironmentMetadata(name=s.id, description=s.description, readme_content=card,
                                   version=s.id.rsplit("-v", 1)[-1])

    def close(self) -> None:
        if self._view is not None:
            view, self._view = self._view, None
            view.close()


def build_app(config: ServeConfig) -> tuple[Any, Any]:
    """The FastAPI app serving ``config`` and its OpenEnv ``HTTPEnvServer`` (which holds the sessions)."""
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import HTTPEnvServer

    from collab_env.registry import spec

    s = spec(config.env_id)
    extra: dict[str, Any] = {"card": s.card.to_dict() if s.card is not None else None,
                             "collab_env": config.describe()}
    env_cls = type("ServedEnv", (ServedEnv,), {"config": config, "__module__": __name__,
                                               "parked": OrderedDict(), "parked_lock": threading.Lock()})
    obs_cls = type("ChatObservation", (ChatObservation,),
                   {"model_config": ConfigDict(json_schema_extra=extra), "__module__": __name__})
    app = FastAPI(title=f"collab_env {s.id} (seat {config.seat})", version="1", description=s.description)
    server = HTTPEnvServer(env_cls, ChatAction, obs_cls, max_concurrent_envs=config.max_sessions)
    server.register_routes(app)

    @app.get("/sessions", tags=["Sessions"], summary="Open sessions")
    async def sessions() -> dict[str, int]:
        return {"active": server.active_sessions, "max": server.max_concurrent_envs}

    return app, server


def serve(config: ServeConfig, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "warning",
          announce: Any = None) -> None:
    """Serve ``config`` on ``host``:``port`` until interrupted (``port=0``: a free port). The line
    ``serving <id> seat <seat> on http://host:port`` goes to ``announce`` (default stderr) once the
    socket listens."""
    import uvicorn

    app, _ = build_app(config)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port.") from None
    sock.listen(2048)
    bound = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(app, log_level=log_level, ws_max_size=config.max_message_bytes,
                                       lifespan="off"))
    print(f"serving {config.env_id} seat {config.seat} on http://{host}:{bound} "
          f"(at most {config.max_sessions} sessions)", file=announce or sys.stderr, flush=True)
    uv.run(sockets=[sock])
