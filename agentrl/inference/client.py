"""HTTP clients for one vLLM server: token ids in, token ids + logprobs out.

Two wire formats, same :class:`~agentrl.inference.protocol.LLMClient` contract:

:class:`CompletionsClient` speaks the OpenAI ``POST /v1/completions`` subset that
both vLLM and ``agentrl.testing.scripted_server`` serve. It sends::

    {"prompt": [int, ...], "max_tokens": int, "temperature": float, "top_p": float,
     "top_k": int, "stop_token_ids": [int, ...], "seed": int (only when set),
     "logprobs": 0, "return_tokens_as_token_ids": true, "return_token_ids": true,
     "skip_special_tokens": false, "n": 1, "stream": false,
     "model": str (only when given)}

and reads ``choices[0]``: ``token_ids`` when present, else ``logprobs.tokens``
(strings ``"token_id:N"``); ``logprobs.token_logprobs``; ``finish_reason``
("stop" / "length" / "abort"); ``stop_reason`` (ignored beyond logging). Generated
tokens include the stop token when generation stopped on one.
Per-token weight versions come from the ``weight_version`` callable, read when the
request is sent and when it returns; if they differ (a weight sync happened while
it ran) every token is labelled with the older version, the conservative choice.

:class:`GenerateClient` speaks vLLM's token-in-token-out ``POST /inference/v1/generate``
(servers started with ``--enable-scale-out``): ``{"token_ids": [...],
"sampling_params": {...}, "output_mode": "tokens"}``; it reads ``choices[0].token_ids``,
``logprobs.content[i].logprob``, ``finish_reason`` and ``weight_versions`` (vLLM's
exact per-token spans of the label set by ``/update_weight_version``), and skips
detokenization on the server.

Retries: only on errors where the request cannot have been processed or the
server said so (connect errors, 502/503/504), with backoff. A read timeout or a
dropped connection mid-generation raises :class:`ServerUnavailable` at once; the
Router decides whether to resend elsewhere.

Transport: :class:`~agentrl.inference.http1.Http1Pool`, one keep-alive pool per
client, made on first use in the running loop. httpx's pool scans its connections
on every request (~6 ms of CPU per request at 1,000 connections) and aiohttp's
request machinery cost ~0.3 ms; see ``benchmarks/rollout_overhead.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.inference.auth import auth_headers
from agentrl.inference.http1 import ConnectFailed, Http1Pool, RequestFailed
from agentrl.inference.protocol import Generation, LLMError, SamplingParams
from agentrl.runtime.lifecycle import AsyncClosing

__all__ = [
    "BadRequest",
    "CompletionsClient",
    "GenerateClient",
    "ServerUnavailable",
    "make_client",
]

_RETRY_STATUS = frozenset({502, 503, 504})


class ServerUnavailable(LLMError):
    """The server could not be reached, timed out, or failed mid-request."""


class BadRequest(LLMError):
    """The server rejected the request itself (HTTP 4xx); resending will not help."""


def _version_list(n: int, start: int, end: int) -> list[int]:
    return [min(start, end)] * n


def _span_versions(spans: list[dict[str, Any]], n: int) -> list[int] | None:
    """Per-token versions from vLLM's ``weight_versions`` spans (None if unusable).

    vLLM 0.32 can miscount the span bounds of a request that was preempted during a
    keep-mode pause (its spans then end before or after the last token); the
    boundaries are then shifted so that the last span ends at the last token.
    """
    try:
        parsed = [(int(s["version"]), int(s["start"]), int(s["end"])) for s in spans]
    except (KeyError, TypeError, ValueError):
        return None  # unlabelled ("default") or malformed
    if not parsed or n == 0:
        return None
    shift = n - parsed[-1][2]
    out: list[int] = []
    for k, (version, start, _end) in enumerate(parsed):
        lo = 0 if k == 0 else min(n, max(0, start + shift))
        hi = n if k == len(parsed) - 1 else min(n, max(0, parsed[k + 1][1] + shift))
        out += [version] * max(0, hi - max(lo, len(out)))
    return out


class CompletionsClient(AsyncClosing):
    """Async LLM client over ``/v1/completions`` with token-id prompts.

    Args:
        base_url: Server root, e.g. ``http://127.0.0.1:8000``.
        model: Model name to send (None: the server's default).
        timeout_s: Seconds a whole request may take (read/write/pool timeout).
        connect_timeout_s: Seconds to establish a connection.
        max_connections: Connection pool size (in-flight requests beyond it queue).
        retries: Extra attempts on errors that are safe to retry.
        weight_version: Returns the weight version the server holds now.
        api_key: Bearer key sent with every request (servers off loopback require it).
    """

    path = "/v1/completions"

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_connections: int = 4096,
        retries: int = 3,
        weight_version: Callable[[], int] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = auth_headers(api_key)
        self.model = model
        self.retries = retries
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self._version = weight_version or (lambda: 0)
        self._pool: Http1Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def _http(self) -> Http1Pool:
        if self._closed:
            raise ServerUnavailable(f"{self.base_url}: client is closed")
        loop = asyncio.get_running_loop()
        pool = self._pool
        if pool is None or self._loop is not loop:  # a new event loop: a new pool
            self._loop = loop
            pool = self._pool = Http1Pool(
                self.base_url,
                max_connections=self.max_connections,
                connect_timeout_s=self.connect_timeout_s,
                headers=self._headers,
            )
        return pool

    async def close(self) -> None:
        """Closes the connection pool (idempotent)."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        session_id: str | None = None,
        model: str | None = None,
        version: int | None = None,
    ) -> Generation:
        """Generates a continuation of ``prompt_ids`` (see :class:`~agentrl.LLMClient`).

        ``model``: send this model name instead of the client's (a LoRA adapter's);
        ``version``: label every token with it (the adapter's version) instead of the
        server's weight version.

        Raises:
            BadRequest: The server rejected the request (e.g. prompt too long).
            ServerUnavailable: The server is unreachable or failed mid-request.
        """
        if not prompt_ids:
            raise BadRequest("empty prompt: generate() needs at least one prompt token id")
        payload = self.payload(list(prompt_ids), params)
        if model is not None:
            payload["model"] = model
        v0 = self._version()
        body = await self.post_json(self.path, payload)
        if version is None:
            return self.parse(body, v0, self._version())
        gen = self.parse(body, version, version)
        gen.weight_versions[:] = [version] * len(gen.token_ids)  # not the server's spans
        return gen

    def payload(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        """The JSON body for one request."""
        p: dict[str, Any] = {
            "prompt": prompt_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "stop_token_ids": list(params.stop_token_ids),
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "n": 1,
            "stream": False,
        }
        if params.seed is not None:
            p["seed"] = params.seed
        if self.model is not None:
            p["model"] = self.model
        return p

    def parse(self, body: dict[str, Any], v0: int, v1: int) -> Generation:
        """Turns a response body into a :class:`Generation`."""
        try:
            choice = body["choices"][0]
            lp = choice.get("logprobs") or {}
            ids = choice.get("token_ids")
            if ids is None:
                ids = [int(t.rsplit(":", 1)[1]) for t in lp.get("tokens") or []]
            logprobs = [float(x) for x in lp.get("token_logprobs") or []]
            reason = choice.get("finish_reason") or "stop"
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise LLMError(f"{self.base_url}{self.path}: malformed response: {e!r}") from e
        if len(logprobs) != len(ids):
            raise LLMError(
                f"{self.base_url}{self.path}: {len(ids)} tokens but {len(logprobs)} logprobs"
            )
        return Generation(
            token_ids=[int(i) for i in ids],
            logprobs=logprobs,
            finish_reason=reason,
            weight_versions=_version_list(len(ids), v0, v1),
            server=self.base_url,
        )

    async def post_json(
        self, path: str, payload: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """POSTs JSON, retrying only where safe; returns the decoded body.

        Raises:
            BadRequest: HTTP 4xx.
            ServerUnavailable: Anything else that failed.
        """
        url = f"{self.base_url}{path}"
        content = json.dumps(payload, separators=(",", ":")).encode()
        http = self._http()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                status, raw = await http.post(path, content, timeout_s=timeout)
            except ConnectFailed as e:  # nothing was sent: safe to resend
                if last:
                    raise ServerUnavailable(f"{url}: cannot connect: {e}") from e
            except TimeoutError as e:  # sent, no whole answer in time
                raise ServerUnavailable(f"{url}: no response within {timeout:g} s") from e
            except RequestFailed as e:  # dropped connection, garbage
                raise ServerUnavailable(f"{url}: request failed: {e}") from e
            else:
                if status < 300:
                    try:
                        out: dict[str, Any] = json.loads(raw)
                    except ValueError as e:
                        raise LLMError(f"{url}: response is not JSON: {raw[:200]!r}") from e
                    return out
                text = raw[:500].decode(errors="replace")
                if 400 <= status < 500:
                    raise BadRequest(f"{url}: HTTP {status}: {text}")
                if status not in _RETRY_STATUS or last:
                    raise ServerUnavailable(f"{url}: HTTP {status}: {text}")
            await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
        raise AssertionError("unreachable")  # pragma: no cover


class GenerateClient(CompletionsClient):
    """Async LLM client over vLLM's token-in-token-out ``/inference/v1/generate``.

    Same arguments as :class:`CompletionsClient`; per-token weight versions come
    from the server's spans when their labels are integers.
    """

    path = "/inference/v1/generate"

    def payload(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        sp: dict[str, Any] = {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "stop_token_ids": list(params.stop_token_ids),
            "logprobs": 0,
            "detokenize": False,
            "skip_special_tokens": False,
        }
        if params.seed is not None:
            sp["seed"] = params.seed
        p: dict[str, Any] = {"token_ids": prompt_ids, "sampling_params": sp}
        if self.model is not None:
            p["model"] = self.model
        return p

    def parse(self, body: dict[str, Any], v0: int, v1: int) -> Generation:
        try:
            choice = body["choices"][0]
            ids = [int(i) for i in choice.get("token_ids") or []]
            content = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [float(c["logprob"]) for c in content]
            reason = choice.get("finish_reason") or "stop"
            spans = choice.get("weight_versions") or []
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise LLMError(f"{self.base_url}{self.path}: malformed response: {e!r}") from e
        if len(logprobs) != len(ids):
            raise LLMError(
                f"{self.base_url}{self.path}: {len(ids)} tokens but {len(logprobs)} logprobs"
            )
        versions = _span_versions(spans, len(ids)) or _version_list(len(ids), v0, v1)
        return Generation(ids, logprobs, reason, versions[: len(ids)], self.base_url)


def make_client(api: str, base_url: str, **kwargs: Any) -> CompletionsClient:
    """Builds a client for ``api`` ("completions" or "generate")."""
    kinds: dict[str, type[CompletionsClient]] = {
        "completions": CompletionsClient,
        "generate": GenerateClient,
    }
    if api not in kinds:
        raise ValueError(f"unknown inference api {api!r}: use one of {sorted(kinds)}")
    return kinds[api](base_url, **kwargs)
