"""A scripted reference slowed down, so a test can kill a leaderboard run in the middle."""

import asyncio

from collab_env.tasks.hidden_facts import AskThenAnswer


class SlowAskThenAnswer(AskThenAnswer):
    """AskThenAnswer that waits 30 ms per call (same moves)."""

    name = "slow-ask-then-answer"

    async def act(self, observations, **sampling):
        await asyncio.sleep(0.03)
        return await super().act(observations, **sampling)
