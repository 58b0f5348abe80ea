"""The retry policy of the API backend: which failures are retried, which are fatal, how long to wait.

An attempt that failed is sorted (:func:`classify_error`) into

* :class:`Retry`: transient, another attempt may work: rate limits and the other retryable 4xx
  (408, 409, 425, 429: :data:`RETRYABLE_4XX`), 5xx, timeouts, dropped connections (and, found
  by the policy itself, malformed or empty responses);
* :class:`GiveUp`: no retry fixes it. ``fatal`` ones raise
  :class:`~collab_env.errors.FatalPolicyError` whatever the fault policy: requests the provider
  rejected (a missing or invalid key, every other 4xx, the litellm classes of
  :data:`REJECTIONS`) and local misuse (an unexpected exception: a bad keyword, a broken
  installation). A conversation longer than the model's context window gives up without being
  fatal: it follows the fault policy.

Between attempts the policy waits :func:`backoff_delay`: exponential backoff with jitter, or
the server's ``Retry-After`` (:func:`retry_after_seconds`), capped.
"""

from __future__ import annotations

import email.utils
import random
import sys
import time

__all__ = ["Retry", "GiveUp", "REJECTIONS", "AUTH_REJECTIONS", "RETRYABLE_4XX", "classify_error",
           "retry_after_seconds", "backoff_delay"]


class Retry(Exception):
    """An attempt failed in a way that another attempt may fix."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class GiveUp(Exception):
    """An attempt failed in a way no retry fixes; ``fatal`` ones raise
    :class:`~collab_env.errors.FatalPolicyError` whatever the fault policy (``rejected``: the
    provider refused the request, as opposed to a local misuse)."""

    def __init__(self, reason: str, *, fatal: bool, rejected: bool = True, auth: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fatal = fatal
        self.rejected = rejected
        #: The provider refused the credentials (a missing, invalid or unauthorised key).
        self.auth = auth


#: litellm's exception classes for requests the provider refused (4xx answers that no retry
#: fixes). ContextWindowExceededError is a BadRequestError but is handled before these.
REJECTIONS = ("AuthenticationError", "PermissionDeniedError", "NotFoundError", "BadRequestError",
              "UnprocessableEntityError", "UnsupportedParamsError", "InvalidRequestError")
#: The rejections that are about the credentials (the only ones whose fix is the key).
AUTH_REJECTIONS = ("AuthenticationError", "PermissionDeniedError")
#: 4xx statuses that are transient: timeout, conflict, too early, rate limit.
RETRYABLE_4XX = (408, 409, 425, 429)


def classify_error(exc: Exception) -> Retry | GiveUp:
    """Sort an exception from a litellm call into retry / give up (the rules are in the module
    docstring). It never imports litellm: its exception classes are checked only when it is
    loaded (an exception from litellm means it is)."""
    message = str(exc).strip() or repr(exc)
    litellm = sys.modules.get("litellm")
    if litellm is not None and isinstance(exc, litellm.ContextWindowExceededError):
        return GiveUp(f"context window exceeded: {message}", fatal=False)
    if "Missing credentials" in message:  # litellm reports a missing OpenAI key as a 500
        return GiveUp(f"no API key: {message}", fatal=True, auth=True)
    auth = type(exc).__name__ in AUTH_REJECTIONS
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        if status >= 500 or status in RETRYABLE_4XX:
            return Retry(f"{status} {type(exc).__name__}: {message}", retry_after_seconds(exc))
        if 400 <= status < 500:
            return GiveUp(f"{status} {type(exc).__name__}: {message}", fatal=True, auth=auth or status in (401, 403))
    if litellm is not None and isinstance(exc, tuple(getattr(litellm, n) for n in REJECTIONS
                                                       if hasattr(litellm, n))):
        # A rejection class without a usable status code (some providers' adapters).
        return GiveUp(f"{type(exc).__name__}: {message}", fatal=True, auth=auth)
    if litellm is not None and isinstance(exc, (litellm.Timeout, litellm.APIConnectionError)):
        return Retry(f"{type(exc).__name__}: {message}")
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return Retry(f"{type(exc).__name__}: {message}")
    # Anything else is a bug or a misuse (a bad keyword in completion_kwargs...): retrying
    # would only hide it.
    return GiveUp(f"unexpected {type(exc).__name__}: {message}", fatal=True, rejected=False)


def retry_after_seconds(exc: Exception) -> float | None:
    """Seconds the server asked us to wait (``retry-after-ms`` or ``Retry-After``), if any."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or getattr(exc, "headers", None) or {}
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return float(ms) / 1000.0
        value = headers.get("retry-after")
    except (AttributeError, TypeError, ValueError):
        return None
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:  # an HTTP date
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


def backoff_delay(attempt: int, retry_after: float | None, *, base: float, cap: float,
                  rng: random.Random) -> float:
    """Seconds to wait before attempt ``attempt + 1``: the server's ``retry_after`` if it gave
    one, else ``base * 2 ** (attempt - 1)``, drawn uniformly from [half, all] of it ("equal
    jitter"); never more than ``cap`` (nor below 0)."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), cap)
    top = min(cap, base * 2 ** (attempt - 1))
    return top * rng.uniform(0.5, 1.0)
