"""A scripted inference server for tests: vLLM's ``/v1/completions`` subset, over real HTTP.

It takes token-id prompts and answers with token ids and logprobs chosen by a
*policy* (scripted text, or seeded random tokens), so the AgentLoop can be tested
end to end over HTTP on a machine without a model.

Request fields read: ``prompt`` (list of token ids), ``max_tokens``, ``seed``,
``logprobs``, ``return_tokens_as_token_ids``, ``stop_token_ids``. Response:
``choices[0]`` with ``text``, ``logprobs.tokens`` (``"token_id:N"``),
``logprobs.token_logprobs``, ``finish_reason`` ("stop" | "length") and
``stop_reason``; plus ``usage``. Also ``GET /health`` and ``GET /v1/models``.

Run it alone: ``python -m agentrl.testing.scripted_server --port 8123 --vocab 1000 --eos 999``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentrl.inference.protocol import Generation, SamplingParams

__all__ = [
    "RandomPolicy",
    "ScriptedLLM",
    "ScriptedPolicy",
    "ScriptedServer",
    "TextPolicy",
    "fake_logprob",
]


class ScriptedPolicy(Protocol):
    """Chooses the tokens of a completion."""

    eos_id: int

    def __call__(self, prompt_ids: Sequence[int], max_tokens: int, seed: int | None) -> list[int]:
        """Returns the completion's tokens, ending with ``eos_id`` when it stops on its own."""
        ...


def fake_logprob(token_id: int, position: int) -> float:
    """A deterministic logprob in (-4, 0] for (token, position): tests can recompute it."""
    return -((token_id * 2654435761 + position * 40503) % 1000) / 250.0


@dataclass
class RandomPolicy:
    """Seeded random tokens: a length drawn in [min_len, max_len], then eos.

    Attributes:
        vocab_size: Tokens are drawn from [0, vocab_size) minus eos.
        eos_id: End-of-turn token.
        min_len: Shortest completion (before eos).
        max_len: Longest completion (before eos).
    """

    vocab_size: int
    eos_id: int
    min_len: int = 4
    max_len: int = 16

    def __call__(self, prompt_ids: Sequence[int], max_tokens: int, seed: int | None) -> list[int]:
        rng = random.Random(hash((len(prompt_ids), tuple(prompt_ids[-4:]), seed)))
        n = rng.randint(self.min_len, self.max_len)
        out = [rng.randrange(self.vocab_size) for _ in range(n)]
        return [t if t != self.eos_id else (t + 1) % self.vocab_size for t in out] + [self.eos_id]


@dataclass
class TextPolicy:
    """Answers with text chosen by a function of the decoded prompt.

    Attributes:
        tokenizer: Encodes the reply and decodes the prompt.
        reply: ``reply(prompt_text) -> str``; the reply is encoded and eos appended.
    """

    tokenizer: Any
    reply: Callable[[str], str]
    eos_id: int = field(init=False)

    def __post_init__(self) -> None:
        self.eos_id = int(self.tokenizer.eos_token_id)

    def __call__(self, prompt_ids: Sequence[int], max_tokens: int, seed: int | None) -> list[int]:
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        ids = list(self.tokenizer.encode(self.reply(text), add_special_tokens=False))
        return [*ids, self.eos_id]


def complete(policy: ScriptedPolicy, body: dict[str, Any]) -> dict[str, Any]:
    """The ``/v1/completions`` response body for a request body."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
        raise ValueError("prompt must be a list of token ids")
    max_tokens = int(body.get("max_tokens") or 16)
    stops = set(body.get("stop_token_ids") or ()) | {policy.eos_id}
    ids = policy(prompt, max_tokens, body.get("seed"))
    finish = "length"
    for i, t in enumerate(ids[:max_tokens]):
        if t in stops:
            ids, finish = ids[: i + 1], "stop"
            break
    else:
        ids = ids[:max_tokens]
    logps = [fake_logprob(t, len(prompt) + i) for i, t in enumerate(ids)]
    return {
        "id": f"cmpl-{time.monotonic_ns()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model", "scripted"),
        "choices": [
            {
                "index": 0,
                "text": "",
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in ids],
                    "token_logprobs": logps,
                    "top_logprobs": None,
                    "text_offset": list(range(len(ids))),
                },
                "finish_reason": finish,
                "stop_reason": ids[-1] if finish == "stop" and ids[-1] != policy.eos_id else None,
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(ids),
            "total_tokens": len(prompt) + len(ids),
        },
    }


class ScriptedLLM:
    """In-process LLMClient double over a policy (no HTTP): for unit tests and benchmarks."""

    def __init__(self, policy: ScriptedPolicy, *, weight_version: int = 0) -> None:
        self.policy = policy
        self.weight_version = weight_version
        self.requests: list[list[int]] = []

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        self.requests.append(list(prompt_ids))
        body = {
            "prompt": list(prompt_ids),
            "max_tokens": params.max_tokens,
            "seed": params.seed,
            "stop_token_ids": list(params.stop_token_ids),
        }
        choice = complete(self.policy, body)["choices"][0]
        ids = [int(s.split(":", 1)[1]) for s in choice["logprobs"]["tokens"]]
        return Generation(
            token_ids=ids,
            logprobs=list(choice["logprobs"]["token_logprobs"]),
            finish_reason=choice["finish_reason"],
            weight_versions=[self.weight_version] * len(ids),
            server="in-process",
        )


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def make_app(policy: ScriptedPolicy, requests: list[dict[str, Any]] | None = None) -> Any:
    """The FastAPI app serving ``policy``; every request body is appended to ``requests``."""
    app = FastAPI(title="agentrl scripted inference server")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "scripted", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        if requests is not None:
            requests.append(body)
        try:
            return JSONResponse(complete(policy, body))
        except ValueError as e:
            return JSONResponse({"error": {"message": str(e)}}, status_code=400)

    return app


class ScriptedServer:
    """Runs the scripted server in a background thread on 127.0.0.1.

    ``api_key``: every route but ``/health`` then needs ``Authorization: Bearer <key>``,
    as on an agentrl vLLM server off loopback (:mod:`agentrl.inference.auth`).

    Example:
        >>> with ScriptedServer(RandomPolicy(100, eos_id=99)) as srv:  # doctest: +SKIP
        ...     client = CompletionsClient(srv.url)
    """

    def __init__(
        self,
        policy: ScriptedPolicy,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.policy = policy
        self.api_key = api_key
        self.host = host
        self.port = port or _free_port(host)
        self.requests: list[dict[str, Any]] = []
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> ScriptedServer:
        import uvicorn

        app = make_app(self.policy, self.requests)
        if self.api_key:
            from agentrl.inference.auth import ServerKeyMiddleware

            app = ServerKeyMiddleware(app, self.api_key)
        config = uvicorn.Config(
            app,
            host=self.host,
            port=self.port,
            log_level="warning",
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"scripted server did not start on {self.url}")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Serves a RandomPolicy in the foreground (for benchmarks in a separate process)."""
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--eos", type=int, default=999)
    p.add_argument("--min-len", type=int, default=4)
    p.add_argument("--max-len", type=int, default=16)
    a = p.parse_args(argv)
    policy = RandomPolicy(a.vocab, a.eos, a.min_len, a.max_len)
    asyncio.run(
        uvicorn.Server(
            uvicorn.Config(make_app(policy), host=a.host, port=a.port, log_level="warning")
        ).serve()
    )


if __name__ == "__main__":
    main()
