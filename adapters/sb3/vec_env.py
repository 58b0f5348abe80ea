"""The SB3 ``VecEnv`` that steps many wrappers at once on one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecEnv

from collab_env._async import run_sync
from collab_env.adapters.sb3.wrappers import DialogueEnv, MacroActionWrapper
from collab_env.errors import ConfigError, EnvStateError
from collab_env.policy import policies_for, resolve_policy
from collab_env.rollout.batching import BatchedPolicy, batches_itself

__all__ = ["CollabVecEnv"]


class CollabVecEnv(VecEnv):
    """An SB3 ``VecEnv`` over wrappers that steps them all at once on one event loop.

    ``step_wait`` gathers every wrapper's ``astep`` (then every finished one's ``areset``)
    with ``asyncio.gather``; policies the wrappers share (see :meth:`from_id`) receive their
    calls concurrently and batch them. Finished episodes reset automatically, with the SB3
    conventions: ``info["terminal_observation"]``, ``info["TimeLimit.truncated"]``, and
    ``reset_infos``. ``seed(s)`` seeds the next reset of wrapper ``i`` with ``s + i``.

    Args:
        envs: :class:`MacroActionWrapper` or :class:`RerankWrapper` instances with equal spaces.

    Raises:
        ConfigError: No envs, envs without ``areset``/``astep``, or different spaces.
    """

    def __init__(self, envs: Sequence[DialogueEnv]) -> None:
        self.envs = list(envs)
        if not self.envs:
            raise ConfigError("CollabVecEnv needs at least one env.")
        for e in self.envs:
            if not (hasattr(e, "areset") and hasattr(e, "astep")):
                raise ConfigError(f"CollabVecEnv steps envs with async areset/astep; {type(e).__name__} has none.")
            if e.observation_space != self.envs[0].observation_space or e.action_space != self.envs[0].action_space:
                raise ConfigError("every env of a CollabVecEnv must have the same observation and action spaces.")
        super().__init__(len(self.envs), self.envs[0].observation_space, self.envs[0].action_space)
        self._actions: np.ndarray | None = None

    @classmethod
    def from_id(
        cls,
        env_id: str,
        n: int,
        *,
        wrapper: type = MacroActionWrapper,
        policies: Mapping[str, Any] | None = None,
        batch: bool = True,
        **wrapper_kwargs: Any,
    ) -> CollabVecEnv:
        """``n`` wrappers of ``env_id`` sharing one instance of every policy.

        The other players' policies (``policies`` over the spec's defaults) and the wrapper's
        ``realiser`` or ``candidates_policy`` are resolved once and shared by the ``n`` envs;
        with ``batch``, a policy that does not batch itself is wrapped in a
        :class:`~collab_env.rollout.BatchedPolicy` (as the rollout engine does).

        Args:
            env_id: Registered id.
            n: Number of envs.
            wrapper: :class:`MacroActionWrapper` or :class:`RerankWrapper`.
            policies: Player -> policy for the other players.
            batch: Wrap shared policies in BatchedPolicy where that helps.
            **wrapper_kwargs: The wrapper's keywords (``acts``, ``candidates_policy``, ``n`` is
                ``num_candidates`` here, ``player``, env overrides...).
        """
        from collab_env.registry import spec

        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"n must be an int >= 1, got {n!r}.")
        s = spec(env_id)
        player = wrapper_kwargs.get("player") or (s.trainable[0] if s.trainable else s.players[0])

        def shared(ref: Any) -> Any:
            pol = resolve_policy(ref)
            return BatchedPolicy(pol) if batch and not batches_itself(pol) else pol

        chosen = policies_for(s, policies)
        others = {p: shared(ref) for p, ref in chosen.items() if p != player and ref is not None}
        kw = dict(wrapper_kwargs)
        if "num_candidates" in kw:
            kw["n"] = kw.pop("num_candidates")
        for key in ("realiser", "candidates_policy"):
            if kw.get(key) is not None and (isinstance(kw[key], str) or hasattr(kw[key], "act")):
                kw[key] = shared(kw[key])
        return cls([wrapper(env_id, policies=others, **kw) for _ in range(n)])

    # -- SB3 API -------------------------------------------------------------------------------
    def reset(self) -> np.ndarray:
        async def all_resets():
            return await asyncio.gather(*(
                e.areset(seed=self._seeds[i], options=self._options[i] or None) for i, e in enumerate(self.envs)))

        results = run_sync(all_resets())
        self.reset_infos = [info for _, info in results]
        self._reset_seeds()
        self._reset_options()
        return np.stack([obs for obs, _ in results])

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self):
        if self._actions is None:
            raise EnvStateError("step_wait() needs step_async(actions) first.")
        actions, self._actions = self._actions, None

        async def all_steps():
            steps = await asyncio.gather(*(e.astep(int(a)) for e, a in zip(self.envs, actions, strict=True)))
            done = [i for i, (_, _, term, trunc, _) in enumerate(steps) if term or trunc]
            resets = await asyncio.gather(*(self.envs[i].areset() for i in done))
            return steps, dict(zip(done, resets, strict=True))

        steps, resets = run_sync(all_steps())
        obs, rews, dones, infos = [], [], [], []
        for i, (o, r, term, trunc, info) in enumerate(steps):
            info = dict(info)
            info["TimeLimit.truncated"] = bool(trunc and not term)
            if i in resets:
                info["terminal_observation"] = o
                o, self.reset_infos[i] = resets[i]
            obs.append(o)
            rews.append(r)
            dones.append(term or trunc)
            infos.append(info)
        return np.stack(obs), np.asarray(rews, dtype=np.float32), np.asarray(dones, dtype=bool), infos

    def close(self) -> None:
        for e in self.envs:
            e.close()

    def _targets(self, indices: Any) -> list[Any]:
        return [self.envs[i] for i in self._get_indices(indices)]

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(e, attr_name) for e in self._targets(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        for e in self._targets(indices):
            setattr(e, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any) -> list[Any]:
        return [getattr(e, method_name)(*method_args, **method_kwargs) for e in self._targets(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        from stable_baselines3.common.env_util import is_wrapped

        return [is_wrapped(e, wrapper_class) for e in self._targets(indices)]
