"""The client of a served env: an OpenEnv ``EnvClient`` (:class:`CollabEnvClient`) and
:func:`remote_env`, a :class:`~collab_env.env.CollabEnv` whose one player is the served seat.

The remote env is a real ``CollabEnv`` over a :class:`RemoteTask`: its episode starts with the
server's reset (the item index and seed the local env drew) and each step sends the seat's move
and appends what the server's observation adds (the other players' moves, the env's messages),
with the server's reward and end. So the episode driver (:func:`collab_env.rollout.arun_episode`),
the token transcript and the learners play it like a local env, branching included (a clone of a
started episode is a copy made on the server); the other seats are played on the server, by the
policies it was given (the data flows one way).
"""

# ruff: noqa: E402 (openenv is checked first: the imports below need it)
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from collab_env.errors import ConfigError, ServedEnvError, require

require("openenv", "serve", "collab_env.serve.client")

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import State

from collab_env.env import CollabEnv, EpisodeState, Outcome, Start, Task
from collab_env.types import Message

__all__ = ["CollabEnvClient", "RemoteTask", "RemoteEnv", "remote_env", "describe"]


def _http_url(url: str) -> str:
    url = url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url[5:]
    if url.startswith("wss://"):
        return "https://" + url[6:]
    return url


def describe(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The served env's JSON schemas (``GET /schema``): ``observation.card`` is its card,
    ``observation.collab_env`` the served seat (env id, seat, role, number of items)."""
    try:
        with urllib.request.urlopen(_http_url(url) + "/schema", timeout=timeout) as r:  # noqa: S310 - http(s) only
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ServedEnvError(f"cannot read {url}/schema ({exc}); is `collab-env serve` running there?") from None


class CollabEnvClient(EnvClient):
    """OpenEnv client of ``collab-env serve``: ``reset(seed=, index=, api_base=)`` and
    ``step(text)`` return a ``StepResult`` whose observation is the server's observation dict
    (``messages``, ``other_moves``, ``terminated``, ``truncated``, ``end_reason``, ``index``,
    ``reward_components``). An error of the server, or a connection it closed, is a
    :class:`~collab_env.errors.ServedEnvError` with its reason."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.base_url = _http_url(base_url)

    def _step_payload(self, action: Any) -> dict[str, Any]:
        if isinstance(action, str):
            return {"message": action}
        if isinstance(action, Mapping):
            return dict(action)
        raise ConfigError(f"a served env's action is the message text (a str), got {type(action).__name__}.")

    def _parse_result(self, payload: dict[str, Any]) -> StepResult:
        return StepResult(observation=dict(payload.get("observation") or {}), reward=payload.get("reward"),
                          done=bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)

    def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            self._send(message)
            response = self._receive()
        except ConnectionClosed as exc:
            ws: Any = getattr(self, "_ws", None)
            self._ws = None
            refusal = self._last_words(ws)  # a server that refuses a session says why, then closes
            if refusal is not None and refusal.get("type") == "error":
                return self._checked(refusal)
            rcvd = exc.rcvd
            why = f"code {rcvd.code}" + (f": {rcvd.reason}" if rcvd.reason else "") if rcvd else "no close frame"
            too_big = rcvd is not None and rcvd.code == 1009
            hint = " (the message is larger than the server's --max-message-bytes)" if too_big else ""
            raise ServedEnvError(f"the served env at {self._ws_url} closed the connection ({why}){hint}.") from None
        except ConnectionError as exc:
            raise ServedEnvError(str(exc)) from None
        return self._checked(response)

    @staticmethod
    def _last_words(ws: Any) -> dict[str, Any] | None:
        """The message a closed connection still holds (an error sent before the close), if any."""
        try:
            return json.loads(ws.recv(timeout=0)) if ws is not None else None
        except Exception:  # noqa: BLE001 - nothing buffered, or not JSON: no last words
            return None

    def _checked(self, response: dict[str, Any]) -> dict[str, Any]:
        if response.get("type") == "error":
            data = response.get("data") or {}
            detail = data.get("message", "unknown error")
            errors = data.get("errors")
            if errors:
                detail += ": " + "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}"
                                           for e in errors[:3])
            raise ServedEnvError(f"the served env refused the request ({data.get('code', 'ERROR')}): {detail}")
        return response


class RemoteTask(Task):
    """The served seat as a one-player task; each env holds its own task (and connection)."""

    option_keys = frozenset({"api_base"})

    def __init__(self, url: str, info: Mapping[str, Any], *, message_timeout_s: float = 600.0) -> None:
        self.url = url
        self.seat = str(info["seat"])
        self.players = (self.seat,)
        self.turn_order = ((self.seat,),)
        self._role = str(info.get("role", "assistant"))
        self._trainable = bool(info.get("trainable", True))
        self._num_items = info.get("num_items")
        self.default_max_steps = 1 << 30  # the server ends the episode
        self.info = dict(info)
        self.message_timeout_s = message_timeout_s
        self.client = CollabEnvClient(url, message_timeout_s=message_timeout_s)

    def num_items(self) -> int | None:
        return self._num_items

    def get_item(self, index: int) -> Mapping[str, Any]:
        return {"index": index}

    def role_of(self, player: str) -> str:
        return self._role

    def is_trainable(self, player: str) -> bool:
        return self._trainable

    def start(self, state: EpisodeState, options: Mapping[str, Any]) -> Start:
        kwargs = {"seed": state.seed, "index": state.index, **({"api_base": options["api_base"]}
                                                                 if options.get("api_base") else {})}
        result = self.client.reset(**kwargs)
        obs = result.observation
        return Start(messages=[Message.from_dict(m) for m in obs.get("messages", ())], on_turn=(self.seat,),
                     info={"other_moves": [(m["player"], m["text"]) for m in obs.get("other_moves", ())]})

    def step(self, state: EpisodeState, moves: Mapping[str, str], final: bool) -> Outcome:
        result = self.client.step(moves[self.seat])
        obs = result.observation
        served = obs.get("messages", ())
        k = len(state.messages) - 1  # the seat's move, as this env stored it
        if 0 <= k < len(served) and served[k].get("tool_calls"):
            # the server read it as a tool call (and ran it): keep its call, seen by the seat only
            mine = Message.from_dict(served[k])
            state.messages[k] = replace(state.messages[k], tool_calls=mine.tool_calls, audience=mine.audience)
        new = [Message.from_dict(m) for m in served[len(state.messages):]]
        for m in new:  # the seat's tool results: counted here as the served env counted them
            if m.role == "tool":
                state.tool_calls[self.seat] = state.tool_calls.get(self.seat, 0) + 1
                if not m.meta.get("ok", True):
                    state.tool_errors[self.seat] = state.tool_errors.get(self.seat, 0) + 1
        done = bool(result.done)
        terminated = bool(obs.get("terminated")) or (done and not obs.get("truncated"))
        return Outcome(messages=new, rewards={self.seat: float(result.reward or 0.0)},
                       components={self.seat: dict(obs.get("reward_components") or {})},
                       terminated=terminated, truncated=bool(obs.get("truncated")) and not terminated,
                       reason=obs.get("end_reason"),
                       info={"other_moves": [(m["player"], m["text"]) for m in obs.get("other_moves", ())]})

    def fork(self) -> str:
        """Park a copy of the session's episode on the server; the token a new session adopts."""
        token = self.client.step({"message": "", "fork": True}).observation.get("fork_token")
        if not isinstance(token, str):
            raise ServedEnvError(f"the server at {self.url} gave no fork token: is it an older `collab-env serve`?")
        return token

    def branch(self) -> RemoteTask:
        """A new task (its own session) continuing a copy of this session's episode."""
        new = RemoteTask(self.url, self.info, message_timeout_s=self.message_timeout_s)
        try:
            new.client.reset(fork=self.fork())
        except BaseException:
            new.close()
            raise
        return new

    def close(self) -> None:
        self.client.close()


class RemoteEnv(CollabEnv):
    """A :class:`CollabEnv` over a :class:`RemoteTask` (closing it closes the session)."""

    task: RemoteTask

    # The session's calls block on the network: they run in a thread, so the episodes of one event
    # loop (a batch of rollouts) wait on their servers together.
    async def areset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        return await asyncio.to_thread(self._reset, seed, options)

    async def astep(self, actions: Mapping[str, str]):
        return await asyncio.to_thread(self._step, actions)

    def clone(self) -> RemoteEnv:
        """An independent copy: before the first reset a new session on the same server; during an
        episode a new session that continues a copy of it, made on the server (``step`` with
        ``fork``, then ``reset(fork=token)``): the other seats' state is copied there, not
        replayed. Each copy holds a session until it is closed."""
        if self._state is None:
            return remote_env(self.task.url, message_timeout_s=self.task.message_timeout_s)
        new = super().clone()
        new.task = self.task.branch()
        return new

    def close(self) -> None:
        self.task.close()
        super().close()

    def __str__(self) -> str:
        return repr(self)

    def __repr__(self) -> str:
        return f"<RemoteEnv seat={self.task.seat!r} at {self.task.url}>"


def remote_env(url: str, *, player: str | None = None, message_timeout_s: float = 600.0) -> RemoteEnv:
    """A :class:`RemoteEnv` playing the seat served at ``url`` (``collab-env serve``), one session
    (WebSocket connection) per env, opened at the first reset.

    Args:
        url: The server, e.g. ``"http://127.0.0.1:8000"``.
        player: The seat you expect (checked against the server's; default: the server's).
        message_timeout_s: Longest wait for one reply (a step runs the other seats' policies).
    """
    from collab_env.serve import is_url

    if not is_url(url):
        raise ConfigError(f"a served env's address is an http(s):// or ws(s):// URL, got {url!r}.")
    info = (describe(url).get("observation") or {}).get("collab_env")
    if not isinstance(info, Mapping) or "seat" not in info:
        raise ServedEnvError(f"{url} serves an OpenEnv env that is not a collab_env seat (no collab_env entry "
                             "in its /schema); serve it with `collab-env serve ID`.")
    if player is not None and player != info["seat"]:
        raise ConfigError(f"{url} serves the seat {info['seat']!r} of {info.get('env_id')}, not {player!r}; serve "
                          f"that seat (collab-env serve {info.get('env_id')} --seat {player}) and connect there.")
    return RemoteEnv(RemoteTask(url, info, message_timeout_s=message_timeout_s))
