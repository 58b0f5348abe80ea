"""A fake OpenAI-compatible chat-completions server for tests and benchmarks (never imported
by the library).

It serves ``POST /v1/chat/completions`` on 127.0.0.1 from a background thread with its own
event loop, so synchronous tests, ``asyncio.run`` tests and :func:`collab_env.rollout.run_episode`
can all talk to it. Replies are deterministic: ``"echo: <last user message>"``, so a test can
check that every completion went back to the observation it came from.

Fault injection: every request takes the next fault from :attr:`FakeOpenAIServer.faults` (a
queue, consumed in arrival order) or, when the queue is empty, :attr:`FakeOpenAIServer.always`
(``None`` means answer normally). Faults:

=================  ==============================================================================
``"429"``          429 rate limit, no Retry-After header
``"429-after"``    429 with ``Retry-After: <retry_after>`` (seconds, an integer as HTTP says)
``"429-after-ms"`` 429 with ``retry-after-ms: <retry_after * 1000>`` (OpenAI's header)
``"500"``          500 internal server error
``"503"``          503 service unavailable
``"400"``          400 bad request (``error.message`` says why)
``"401"``          401 invalid API key
``"context"``      400 saying the prompt is longer than the model's context window
``"hang"``         never answers (until ``hang_s`` passes or the server stops)
``"malformed"``    200 with a body that is not JSON
``"no-choices"``   200 with JSON that has no ``choices``
``"empty"``        200 with ``content: ""`` (usage still counted)
``"drop"``         closes the connection without an answer
=================  ==============================================================================

Authentication: a server built with ``api_key="sk-..."`` answers every request whose
``Authorization`` header is not ``Bearer <api_key>`` with OpenAI's 401 (``"You didn't provide
an API key..."`` when the header is missing, ``"Incorrect API key provided: ..."`` when the key
is wrong), before any queued fault. Without ``api_key`` any key is accepted, as local servers do.

Streaming: a request with ``"stream": true`` gets the same reply as server-sent events
(``chat.completion.chunk`` objects, one per word, then ``data: [DONE]``; a usage chunk when
``stream_options.include_usage`` is set), as clients that stream (verifiers' harnesses) need.
Faults answer as they do without streaming.

Every request is recorded (:attr:`requests`, the JSON bodies; rejected ones included) with the peak number of requests
in flight (:attr:`max_in_flight`), which is how tests check a concurrency limit.

Run it alone (the benchmark does, so that the server's CPU is not charged to the client)::

    python -m collab_env.testing.openai_server --latency 0.05     # prints "PORT <n>" then serves

``--canned collabllm`` answers every request with :data:`COLLABLLM_REPLY` instead of the echo: one
JSON object that every role of a CollabLLM run reads (the LLM user simulator's ``response``, the
accuracy judge's ``score``, the interactivity judge's three parts, the answer extractor's
``answer``), so a whole ``collab-env eval ... --reward mr`` runs against it (the README's
CollabLLM section does). It scores nothing: every judge gets the same verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

__all__ = ["FakeOpenAIServer", "FAULTS", "free_port", "COLLABLLM_REPLY", "CANNED"]

FAULTS = (
    "429", "429-after", "429-after-ms", "500", "503", "400", "401", "context",
    "hang", "malformed", "no-choices", "empty", "drop",
)


#: The ``--canned collabllm`` reply (see the module docstring).
COLLABLLM_REPLY = json.dumps({
    "current_answer": "",
    "thought": "I still need the answer to my problem.",
    "response": "Could you walk me through it? I need the final answer.",
    "answer": "42",
    "score": True,
    "understanding": 1,
    "clarification": 0.7,
    "suggestions": 0.3,
    "reason": "canned reply of the fake server",
})

#: Named fixed replies for ``--canned``.
CANNED = {"collabllm": COLLABLLM_REPLY}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of the call)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error(status: int, message: str, type_: str, headers: dict[str, str] | None = None,
           code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code or str(status)}}
    return web.json_response(body, status=status, headers=headers)


def _mask(key: str) -> str:
    """A key as OpenAI's error message shows it (ends only)."""
    return key if len(key) <= 8 else f"{key[:3]}{'*' * 4}{key[-4:]}"


class FakeOpenAIServer:
    """OpenAI-compatible chat-completions server on 127.0.0.1 with fault injection.

    Use it as a context manager (``with FakeOpenAIServer() as srv: srv.url``) or call
    :meth:`start` / :meth:`stop`.

    Args:
        latency: Seconds every request waits before it is answered (faults included).
        jitter: Extra wait drawn uniformly from [0, jitter] per request, so that answers come
            back in another order than the requests went out.
        retry_after: Seconds announced by the ``429-after`` faults.
        hang_s: How long a ``hang`` request waits before it gives up silently (a 504).
        reply: ``fn(request_body) -> str`` to replace the echo reply; it may also return the
            assistant message as a dict, ``{"content": str | None, "tool_calls": [...]}`` (a
            function-calling model's answer, OpenAI's shape: each call ``{"id", "type":
            "function", "function": {"name", "arguments": <JSON string>}}``; its
            ``finish_reason`` is ``"tool_calls"``).
        port: Port to bind; ``0`` picks a free one.
        api_key: The one key accepted (``Authorization: Bearer <api_key>``); other requests get
            a 401. ``None``: any key, or none, is accepted.
    """

    def __init__(
        self,
        *,
        latency: float = 0.0,
        jitter: float = 0.0,
        retry_after: float = 1.0,
        hang_s: float = 600.0,
        reply: Callable[[dict[str, Any]], str | dict[str, Any]] | None = None,
        port: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.api_key = api_key
        self.latency = latency
        self.jitter = jitter
        self.retry_after = retry_after
        self.hang_s = hang_s
        self.reply = reply
        self.port = port
        #: Faults for the next requests, consumed in arrival order (a deque is thread-safe).
        self.faults: collections.deque[str | None] = collections.deque()
        #: Fault applied when the queue is empty (``None``: answer normally).
        self.always: str | None = None
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None

    # -- control ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The ``api_base`` clients use (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def inject(self, *faults: str | None) -> FakeOpenAIServer:
        """Queue faults for the next requests (``None`` in the queue means one normal answer)."""
        for f in faults:
            if f is not None and f not in FAULTS:
                raise ValueError(f"unknown fault {f!r}; valid: {FAULTS}")
            self.faults.append(f)
        return self

    def reset(self) -> None:
        """Forget recorded requests, queued faults and the in-flight peak."""
        with self._lock:
            self.faults.clear()
            self.always = None
            self.requests.clear()
            self.max_in_flight = self.in_flight

    def start(self) -> FakeOpenAIServer:
        """Start serving in a background thread; returns once the port accepts connections."""
        if self.port == 0:
            self.port = free_port()
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # surfaced to start() below
                failure.append(exc)
            finally:
                ready.set()
            if not failure:
                loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=main, name="fake-openai-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stop serving; hanging requests are released first so the shutdown is quick."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        fut.result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving ------------------------------------------------------------------------------
    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024).start()

    async def _shutdown(self) -> None:
        assert self._stopping is not None and self._runner is not None
        self._stopping.set()
        await self._runner.cleanup()

    async def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless the server stops first; True when it stopped."""
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "request body is not JSON", "invalid_request_error")
        with self._lock:
            self.requests.append(body)
        rejection = self._check_key(request.headers.get("Authorization"))
        if rejection is not None:
            return rejection
        with self._lock:
            fault = self.faults.popleft() if self.faults else self.always
        wait = self.latency + (random.uniform(0.0, self.jitter) if self.jitter else 0.0)
        if wait and await self._wait(wait):
            return _error(503, "server shutting down", "server_error")

        if fault == "hang":
            await self._wait(self.hang_s)
            return _error(504, "hung request released", "server_error")
        if fault == "429":
            return _error(429, "Rate limit reached, slow down.", "rate_limit_error")
        if fault == "429-after":
            return _error(429, "Rate limit reached, retry later.", "rate_limit_error",
                          {"Retry-After": str(int(round(self.retry_after)))})
        if fault == "429-after-ms":
            return _error(429, "Rate limit reached, retry later.", "rate_limit_error",
                          {"retry-after-ms": str(int(self.retry_after * 1000))})
        if fault == "500":
            return _error(500, "The server had an error processing your request.", "server_error")
        if fault == "503":
            return _error(503, "The engine is currently overloaded.", "server_error")
        if fault == "400":
            return _error(400, "Invalid value for 'messages': fake bad request.", "invalid_request_error")
        if fault == "401":
            return _error(401, "Incorrect API key provided: sk-fake.", "invalid_request_error")
        if fault == "context":
            return _error(400, "This model's maximum context length is 4096 tokens. However, your "
                          "messages resulted in 5000 tokens. Please reduce the length of the messages.",
                          "invalid_request_error")
        if fault == "malformed":
            return web.Response(status=200, text='{"id": "x", "choices": [ {"mess', content_type="application/json")
        if fault == "no-choices":
            return web.json_response({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                                      "model": body.get("model", "fake")})
        if fault == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)  # never reaches the client

        answer = "" if fault == "empty" else self._reply_text(body)
        completion = self._completion(body, answer)
        if body.get("stream"):
            return await self._stream(request, body, completion)
        return web.json_response(completion)

    @staticmethod
    async def _stream(request: web.Request, body: dict[str, Any], completion: dict[str, Any]) -> web.StreamResponse:
        """Send ``completion`` as OpenAI's server-sent events (``stream: true``): a role chunk, one
        chunk per word (with its leading space, so the pieces join to the exact text), a finish
        chunk, a usage chunk when ``stream_options.include_usage`` asks for it, then ``[DONE]``."""
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache"})
        await resp.prepare(request)
        head = {k: completion[k] for k in ("id", "created", "model")}
        choice = completion["choices"][0]
        text = choice["message"]["content"] or ""

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {**head, "object": "chat.completion.chunk", "choices": choices, **extra}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for piece in re.findall(r"\s*\S+|\s+$", text):
            await send([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        for k, call in enumerate(choice["message"].get("tool_calls") or ()):
            await send([{"index": 0, "delta": {"tool_calls": [{"index": k, **call}]}, "finish_reason": None}])
        await send([{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}])
        if (body.get("stream_options") or {}).get("include_usage"):
            await send([], usage=completion["usage"])
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _check_key(self, header: str | None) -> web.Response | None:
        """OpenAI's 401 for a missing or wrong key, or ``None`` when the key is accepted."""
        if self.api_key is None:
            return None
        scheme, _, key = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return _error(401, "You didn't provide an API key. You need to provide your API key in an "
                          "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                          "invalid_request_error", code="missing_api_key")
        if key.strip() != self.api_key:
            return _error(401, f"Incorrect API key provided: {_mask(key.strip())}. You can find your "
                          "API key at https://platform.openai.com/account/api-keys.",
                          "invalid_request_error", code="invalid_api_key")
        return None

    def _reply_text(self, body: dict[str, Any]) -> str | dict[str, Any]:
        if self.reply is not None:
            return self.reply(body)
        users = [m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user"]
        return "echo: " + (users[-1] if users else "")

    @staticmethod
    def _completion(body: dict[str, Any], answer: str | dict[str, Any]) -> dict[str, Any]:
        # Token counts are words: deterministic and easy to check by hand.
        prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in body.get("messages", []))
        message = ({"role": "assistant", "content": answer} if isinstance(answer, str)
                   else {"role": "assistant", **answer})
        text = message.get("content") or ""
        words = text.split()
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            "logprobs": None,
        }
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [
                {"token": w, "logprob": -0.1 * (i + 1), "bytes": list(w.encode()), "top_logprobs": []}
                for i, w in enumerate(words)
            ]}
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(words),
                "total_tokens": prompt_tokens + len(words),
            },
        }


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground: print ``PORT <n>`` once listening, stop on EOF of stdin."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--always", choices=FAULTS, default=None)
    ap.add_argument("--api-key", default=None, help="the one key accepted (default: any)")
    ap.add_argument("--until-killed", action="store_true",
                    help="serve until SIGTERM or Ctrl-C (for a server started in the background with &), "
                         "not until stdin closes")
    ap.add_argument("--canned", choices=sorted(CANNED), default=None,
                    help="answer every request with this fixed reply instead of the echo")
    args = ap.parse_args(argv)
    reply = None if args.canned is None else (lambda body, text=CANNED[args.canned]: text)
    srv = FakeOpenAIServer(latency=args.latency, port=args.port, api_key=args.api_key, reply=reply)
    srv.always = args.always
    srv.start()
    print(f"PORT {srv.port}", flush=True)
    try:
        if args.until_killed:
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            while not stop.wait(1.0):
                pass
        else:
            sys.stdin.read()  # the parent closes our stdin (or dies) to stop us
    except KeyboardInterrupt:
        pass
    srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
