"""Building superseded env versions in tests on purpose.

A superseded id (a newer version of its name is registered) warns with
:class:`~collab_env.errors.DeprecatedEnvWarning` when built. Two kinds of test build one on
purpose: registry-driven tests that check every registered id (conformance, cards, pickling),
and the tests that keep an old version reproducible. Both say so with :func:`building`, which
expects the warning exactly when the id is superseded, so a test on a superseded id that does
not mean to be one fails instead of warning in passing.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from collab_env.errors import DeprecatedEnvWarning
from collab_env.registry import deprecation_message, latest_spec, spec

__all__ = ["building", "is_superseded"]


def is_superseded(env_id: str) -> bool:
    """Whether a newer version of ``env_id``'s name is registered."""
    return bool(deprecation_message(env_id))


@contextlib.contextmanager
def building(env_id: str) -> Iterator[None]:
    """Run the block that builds ``env_id`` (any number of times, through any path).

    When ``env_id`` is superseded the block must warn :class:`DeprecatedEnvWarning` naming the
    latest version (``pytest.warns``: the test fails if it does not; the warning is caught, so
    it does not clutter the report); when it is the latest version nothing is expected or
    caught. Other warnings pass through unchanged either way.
    """
    if not is_superseded(env_id):
        yield
        return
    import pytest

    expected = f"{spec(env_id).id} is superseded by {latest_spec(env_id).id}"
    with pytest.warns(DeprecatedEnvWarning, match="^" + re.escape(expected)):
        yield
