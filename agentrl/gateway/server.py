"""The gateway's HTTP server: OpenAI's and Anthropic's APIs in front of the Router.

Each episode gets its own base URL, ``http://HOST:PORT/sessions/{token}/v1``, so
any OpenAI client library works by setting ``base_url`` (an Anthropic client's is
the same without ``/v1``). Routes under it: ``POST chat/completions`` (streaming
and not), ``POST completions``, ``POST responses`` (OpenAI's Responses API,
:mod:`agentrl.gateway.responses_api`), ``POST messages`` (Anthropic's Messages API,
:mod:`agentrl.gateway.messages_api`) and ``GET models``. The server runs in the
caller's event loop (the Router and the agents live there too) and never installs
signal handlers, so Ctrl-C stays the run's.

Every failure of a request is answered with an error body in the client's format
(OpenAI's; Anthropic's on the Messages route or for a request with an
``anthropic-version`` header), 4xx for the request and 5xx for the inference side,
which the client raises; an unknown route gets a 404 naming the served ones.
Nothing a request does can take the server, or the run, down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import socket
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentrl.gateway.messages_api import message_body, message_events, parse_messages_request
from agentrl.gateway.openai_api import (
    ApiError,
    error_body,
    parse_chat_request,
    parse_completion_request,
)
from agentrl.gateway.responses import chat_body, chat_chunks, completion_body
from agentrl.gateway.responses_api import (
    parse_responses_request,
    response_body,
    response_events,
)
from agentrl.gateway.session import GatewayLimits, Session
from agentrl.gateway.templates import Templates
from agentrl.gateway.wire import (
    ROUTES,
    Answer,
    anthropic_error,
    error_answer,
    looks_anthropic,
    sse_bytes,
    sse_stream,
    unknown_route,
)
from agentrl.inference.protocol import LLMClient
from agentrl.runtime.doors import secret_digest
from agentrl.types import Message, StopReason

__all__ = ["Answer", "Gateway", "redact_token", "sse_bytes"]

Handler = Callable[[Session, Any], Awaitable[Answer]]
_SESSION_ROUTES = {tuple(r.split(" ", 1)) for r in ROUTES}


_TOKEN_IN_PATH = re.compile(r"(/sessions/)[^/?#]*")


def redact_token(text: str) -> str:
    """``text`` with every session token of a ``/sessions/{token}`` path replaced.

    >>> redact_token("http://h:1/sessions/abc/v1/models")
    'http://h:1/sessions/{token}/v1/models'
    """
    return _TOKEN_IN_PATH.sub(r"\1{token}", text)


class _RedactTokens(logging.Filter):
    """Rewrites log records that quote a session URL (the HTTP clients' request logs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        with contextlib.suppress(Exception):
            text = record.getMessage()
            if "/sessions/" in text:
                record.msg, record.args = redact_token(text), ()
        return True


_REDACT = _RedactTokens()
_CLIENT_LOGGERS = (  # a logger's filter sees only its own records, not its children's
    "httpx",
    "httpx2",  # the openai SDK's own copy of httpx
    "openai",
    "openai._base_client",
    "anthropic",
    "anthropic._base_client",
    "uvicorn.error",
    "uvicorn.access",
)


def _redact_client_logs() -> None:
    """Keeps session tokens out of the logs of the HTTP clients an agent uses (idempotent)."""
    for name in _CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if _REDACT not in logger.filters:
            logger.addFilter(_REDACT)


def _http(ans: Answer) -> Response:
    if ans.stream is not None:
        return StreamingResponse(
            sse_stream(ans.stream, events=ans.events), media_type="text/event-stream"
        )
    return JSONResponse(ans.body, status_code=ans.status)


class Gateway:
    """OpenAI-compatible endpoint with one exact token record per episode.

    Args:
        llm: The Router (or any LLMClient) generations come from.
        tokenizer: The policy's tokenizer; its chat template renders requests.
        limits: The run's limits on sampling and budgets.
        host: Interface to listen on.
        port: Port (0: a free one).
        parser: A turn parser (``agentrl.tools.make_turn_parser``) instead of the one
            ``limits`` names.

    Example:
        >>> async with Gateway(router, tokenizer, GatewayLimits()) as gw:  # doctest: +SKIP
        ...     session = gw.open_session("episode-0")
        ...     client = openai.AsyncOpenAI(base_url=gw.base_url(session), api_key="-")
    """

    def __init__(
        self,
        llm: LLMClient,
        tokenizer: Any,
        limits: GatewayLimits | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        parser: Any = None,
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.limits = limits or GatewayLimits()
        self.host = host
        self.port = port
        lim = self.limits
        self.templates = Templates(
            tokenizer, tool_parser=lim.tool_parser, reasoning_parser=lim.loop.reasoning_parser,
            inject_tools=lim.inject_tools, parser=parser,
        )  # fmt: skip
        self.sessions: dict[bytes, Session] = {}  # by the SHA-256 digest of the token
        self._models = {
            "object": "list",
            "data": [{"id": lim.model_name, "object": "model", "owned_by": "agentrl"}],
        }
        self.app = self._make_app()
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ sessions

    def open_session(self, episode_id: str) -> Session:
        """A new session for one episode; its URL token is ``session.token``.

        The token (256 random bits from :mod:`secrets`) is the only secret of the
        episode's traffic: sessions are kept and found by its SHA-256 digest (a lookup's
        timing tells about the digest of the token offered, never about a live token),
        and the gateway never logs or echoes it.
        """
        session = Session(episode_id, self.llm, self.templates, self.limits)
        session.token = secrets.token_urlsafe(32)
        self.sessions[secret_digest(session.token)] = session
        return session

    def close_session(self, session: Session) -> None:
        """Ends a session: later requests to its URL get 404."""
        self.sessions.pop(secret_digest(session.token), None)
        session.close()

    def base_url(self, session: Session) -> str:
        """The session's OpenAI base URL (ends in ``/v1``)."""
        return f"http://{self.host}:{self.port}/sessions/{session.token}/v1"

    def anthropic_base_url(self, session: Session) -> str:
        """The session's base URL for an Anthropic client (it appends ``/v1/messages``)."""
        return f"http://{self.host}:{self.port}/sessions/{session.token}"

    def _session(self, token: str) -> Session:
        # Found by the digest of the token offered: a timing difference of the lookup tells
        # about the digest only, never about a live session's token.
        s = self.sessions.get(secret_digest(token))
        if s is None:
            raise ApiError(
                404,
                "unknown session: its episode ended or never started (use the base_url "
                "the gateway gave the episode)",
                code="session_not_found",
            )
        return s

    # ------------------------------------------------------------------ the app

    def _make_app(self) -> FastAPI:
        app = FastAPI(title="agentrl gateway", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", "sessions": len(self.sessions)}

        @app.get("/v1/models")
        async def list_models() -> dict[str, Any]:
            return self._models

        @app.api_route("/sessions/{token}/v1/{route:path}", methods=["GET", "POST"])
        async def session_route(token: str, route: str, request: Request) -> Response:
            raw = await request.body() if request.method == "POST" else b""
            ans = await self.dispatch(
                request.method, token, route, raw, request.headers, path=request.url.path
            )
            return _http(ans)

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
        async def other(path: str, request: Request) -> Response:
            route = path.removeprefix("v1/")
            if path.startswith("v1/") and (request.method, route) in _SESSION_ROUTES:
                msg = (
                    "no session in the URL: each episode has its own base URL "
                    "(http://HOST:PORT/sessions/{token}/v1)"
                )
                e = ApiError(404, msg, code="session_not_found")
                return _http(error_answer(e, anthropic=looks_anthropic(path, request.headers)))
            return _http(unknown_route(request.method, "/" + path, request.headers))

        return app

    async def dispatch(
        self, method: str, token: str, route: str, raw: bytes, headers: Mapping[str, str],
        *, path: str = "",
    ) -> Answer:  # fmt: skip
        """Answers one request to a session's route, whichever transport it came over
        (HTTP or in process); a route the gateway does not serve gets a 404 naming those
        it does, in the client's error format."""
        if method == "GET" and route == "models":
            return self.models(token)
        if method == "POST" and route == "chat/completions":
            return await self.answer(token, raw, chat=True)
        if method == "POST" and route == "completions":
            return await self.answer(token, raw, chat=False)
        if method == "POST" and route == "responses":
            return await self._guard(token, raw, self._responses, api="responses")
        if method == "POST" and route == "messages":
            return await self._guard(token, raw, self._messages, api="messages", anthropic=True)
        return unknown_route(method, redact_token(path or f"/sessions/{token}/v1/{route}"), headers)

    async def answer(self, token: str, raw: bytes, *, chat: bool) -> Answer:
        """Answers one request body to a session's chat/completions (``chat``) or
        completions route."""
        if chat:
            return await self._guard(token, raw, self._chat, api="chat")
        return await self._guard(token, raw, self._complete, api="completions")

    async def _guard(
        self, token: str, raw: bytes, handler: Handler, *, api: str, anthropic: bool = False
    ) -> Answer:
        """Runs ``handler`` on the session and the parsed body, counting the request
        (``gateway/api_{api}``); every failure becomes an error answer in the client's
        format (OpenAI's, or Anthropic's)."""
        session: Session | None = None
        try:
            session = self._session(token)
            session.count(f"gateway/api_{api}")
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ApiError(400, f"the request body is not valid JSON: {e}") from e
            return await handler(session, body)
        except ApiError as e:
            if session is not None:
                session.count(f"gateway/errors_{e.status}")
                session.last_api_error = e.message
            return error_answer(e, anthropic=anthropic)
        except Exception:  # a bug here must not take the run down: the episode records it
            tb = traceback.format_exc()
            if session is not None:
                session.end(StopReason.INTERNAL_ERROR, tb)
            msg = f"internal gateway error: {tb.splitlines()[-1]}"
            return Answer(
                500, anthropic_error(500, msg) if anthropic else error_body(msg, status=500)
            )

    async def _chat(self, session: Session, body: Any) -> Answer:
        creq = parse_chat_request(body)
        reply = await session.chat(creq)
        if creq.stream:
            chunks = chat_chunks(reply, logprobs=creq.logprobs, include_usage=creq.include_usage)
            return Answer(200, None, chunks)
        return Answer(200, chat_body(reply, logprobs=creq.logprobs))

    async def _complete(self, session: Session, body: Any) -> Answer:
        treq = parse_completion_request(body)
        reply = await session.complete(treq)
        out = completion_body(reply, logprobs=treq.logprobs, stream=treq.stream)
        if treq.stream:
            return Answer(200, None, iter([out]))
        return Answer(200, out)

    async def _responses(self, session: Session, body: Any) -> Answer:
        rreq = parse_responses_request(body, session.responses)
        reply = await session.chat(rreq.chat)
        resp = response_body(reply, rreq)
        if rreq.store:  # what previous_response_id continues: input and output
            said = Message("assistant", reply.content, reply.tool_calls, reasoning=reply.reasoning)
            session.responses[resp["id"]] = [*rreq.history, said]
        if rreq.stream:
            return Answer(200, None, response_events(resp), events=True)
        return Answer(200, resp)

    async def _messages(self, session: Session, body: Any) -> Answer:
        mreq = parse_messages_request(body)
        msg = message_body(await session.chat(mreq.chat))
        if mreq.stream:
            return Answer(200, None, message_events(msg), events=True)
        return Answer(200, msg)

    def models(self, token: str) -> Answer:
        """``GET models`` of a session."""
        try:
            self._session(token)
        except ApiError as e:
            return Answer(e.status, e.body())
        return Answer(200, self._models)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Gateway:
        """Starts serving in this event loop; ``port`` is set to the bound one."""
        _redact_client_logs()
        import uvicorn

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # the run owns SIGINT
                yield

        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP;
        # without it each response waits for the client's delayed ACK (~40 ms a request).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=60,
            backlog=4096,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the server's start-up error
                raise RuntimeError(f"the gateway did not start on {self.host}:{self.port}")
            await asyncio.sleep(0.01)
        return self

    async def close(self) -> None:
        """Ends every session and stops the server; idempotent."""
        for s in list(self.sessions.values()):
            self.close_session(s)
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout=10)
        self._server = self._task = None

    async def __aenter__(self) -> Gateway:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
