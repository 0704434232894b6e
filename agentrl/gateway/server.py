"""The gateway's HTTP server: OpenAI's chat/completions API in front of the Router.

Each episode gets its own base URL, ``http://HOST:PORT/sessions/{token}/v1``, so
any OpenAI client library works by setting ``base_url``. Routes under it:
``POST chat/completions`` (streaming and not), ``POST completions`` and
``GET models``. The server runs in the caller's event loop (the Router and the
agents live there too) and never installs signal handlers, so Ctrl-C stays the
run's.

Every failure of a request is answered with an OpenAI-style error body (4xx
for the request, 5xx for the inference side) that the ``openai`` client raises;
nothing a request does can take the server, or the run, down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentrl.gateway.openai_api import (
    ApiError,
    error_body,
    parse_chat_request,
    parse_completion_request,
)
from agentrl.gateway.responses import chat_body, chat_chunks, completion_body
from agentrl.gateway.session import GatewayLimits, Session
from agentrl.gateway.templates import Templates
from agentrl.inference.protocol import LLMClient
from agentrl.types import StopReason

__all__ = ["Answer", "Gateway", "sse_bytes"]


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


@dataclass(frozen=True)
class Answer:
    """A response, whatever carries it: a JSON ``body``, or ``stream`` (SSE events)."""

    status: int
    body: Any
    stream: Iterator[dict[str, Any]] | None = None


def sse_bytes(items: Iterator[dict[str, Any]]) -> bytes:
    """``items`` as one server-sent-events body, ``[DONE]`` last."""
    return b"".join(
        [*(f"data: {json.dumps(i, ensure_ascii=False)}\n\n".encode() for i in items), _DONE]
    )


_DONE = b"data: [DONE]\n\n"


def _sse(items: Iterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for item in items:
            yield f"data: {json.dumps(item, ensure_ascii=False)}\n\n".encode()
        yield _DONE

    return gen()


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
        self.sessions: dict[str, Session] = {}
        self._models = {
            "object": "list",
            "data": [{"id": lim.model_name, "object": "model", "owned_by": "agentrl"}],
        }
        self.app = self._make_app()
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ sessions

    def open_session(self, episode_id: str) -> Session:
        """A new session for one episode; its URL token is ``session.token``."""
        session = Session(episode_id, self.llm, self.templates, self.limits)
        session.token = uuid.uuid4().hex
        self.sessions[session.token] = session
        return session

    def close_session(self, session: Session) -> None:
        """Ends a session: later requests to its URL get 404."""
        self.sessions.pop(session.token, None)
        session.close()

    def base_url(self, session: Session) -> str:
        """The session's OpenAI base URL (ends in ``/v1``)."""
        return f"http://{self.host}:{self.port}/sessions/{session.token}/v1"

    def _session(self, token: str) -> Session:
        s = self.sessions.get(token)
        if s is None:
            raise ApiError(
                404,
                f"unknown session {token!r}: its episode ended or never started (use the "
                "base_url the gateway gave the episode)",
                code="session_not_found",
            )
        return s

    # ------------------------------------------------------------------ the app

    def _make_app(self) -> FastAPI:
        app = FastAPI(title="agentrl gateway", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {"status": "ok", "sessions": len(self.sessions)}

        @app.get("/sessions/{token}/v1/models")
        async def session_models(token: str) -> Response:
            ans = self.models(token)
            return JSONResponse(ans.body, status_code=ans.status)

        @app.get("/v1/models")
        async def list_models() -> dict[str, Any]:
            return self._models

        @app.post("/sessions/{token}/v1/chat/completions")
        async def chat(token: str, request: Request) -> Response:
            return await self._handle(token, request, chat=True)

        @app.post("/sessions/{token}/v1/completions")
        async def completions(token: str, request: Request) -> Response:
            return await self._handle(token, request, chat=False)

        @app.post("/v1/chat/completions")
        @app.post("/v1/completions")
        async def no_session() -> Response:
            return _error(
                ApiError(
                    404,
                    "no session in the URL: each episode has its own base URL "
                    "(http://HOST:PORT/sessions/{token}/v1)",
                    code="session_not_found",
                )
            )

        return app

    async def _handle(self, token: str, request: Request, *, chat: bool) -> Response:
        ans = await self.answer(token, await request.body(), chat=chat)
        if ans.stream is not None:
            return StreamingResponse(_sse(ans.stream), media_type="text/event-stream")
        return JSONResponse(ans.body, status_code=ans.status)

    async def answer(self, token: str, raw: bytes, *, chat: bool) -> Answer:
        """Answers one request body to a session's chat/completions (``chat``) or
        completions route, whichever transport it came over (HTTP or in-process)."""
        session: Session | None = None
        try:
            session = self._session(token)
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ApiError(400, f"the request body is not valid JSON: {e}") from e
            if chat:
                creq = parse_chat_request(body)
                reply = await session.chat(creq)
                if creq.stream:
                    chunks = chat_chunks(
                        reply, logprobs=creq.logprobs, include_usage=creq.include_usage
                    )
                    return Answer(200, None, chunks)
                return Answer(200, chat_body(reply, logprobs=creq.logprobs))
            treq = parse_completion_request(body)
            reply = await session.complete(treq)
            out = completion_body(reply, logprobs=treq.logprobs, stream=treq.stream)
            if treq.stream:
                return Answer(200, None, iter([out]))
            return Answer(200, out)
        except ApiError as e:
            if session is not None:
                session.count(f"gateway/errors_{e.status}")
                session.last_api_error = e.message
            return Answer(e.status, e.body())
        except Exception:  # a bug here must not take the run down: the episode records it
            tb = traceback.format_exc()
            if session is not None:
                session.end(StopReason.INTERNAL_ERROR, tb)
            return Answer(
                500, error_body(f"internal gateway error: {tb.splitlines()[-1]}", status=500)
            )

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
