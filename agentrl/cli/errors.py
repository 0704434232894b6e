"""The top of the ``agentrl`` command: user errors as one line, signals as clean exits.

A mistake the user can fix (see :func:`is_user_error`) prints ``error: <message>`` on
stderr and exits with status 2, without a traceback; ``--debug`` (anywhere on the command
line) or ``AGENTRL_DEBUG=1`` prints the traceback too. SIGTERM unwinds the run like Ctrl-C
(``finally`` blocks and ``async with`` exits run, so servers, sandboxes and weight files
are released) and exits with status 143. Any other exception is a bug: its traceback is
printed as usual.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

__all__ = ["DEBUG_FLAG", "cli_app_class", "is_user_error", "run_cli", "user_message"]

DEBUG_FLAG = "--debug"


def _user_error_types() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the user can fix this" (imported only on an error)."""
    import yaml

    from agentrl.config import ConfigError
    from agentrl.errors import UserError
    from agentrl.loading.envs import EnvNotFoundError, InvalidEnvError
    from agentrl.loading.task_files import TaskFormatError
    from agentrl.models.gguf import ModelImportError
    from agentrl.orchestration.startup import ComponentError

    return (
        UserError,
        ConfigError,
        ComponentError,
        EnvNotFoundError,
        InvalidEnvError,
        TaskFormatError,
        ModelImportError,
        yaml.YAMLError,
    )


def is_user_error(e: BaseException) -> bool:
    """Whether ``e`` is a mistake the user can fix (printed without a traceback)."""
    try:
        return isinstance(e, _user_error_types())
    except ImportError:  # a broken install is not the user's config
        return False


def user_message(e: BaseException) -> str:
    """The one-line-first message for ``e``."""
    import yaml

    msg = str(e).strip() or type(e).__name__
    if isinstance(e, yaml.YAMLError):
        msg = "invalid YAML: " + " ".join(msg.split())
    return msg


def _exit_on_sigterm(_sig: int, _frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut cleanup
    raise SystemExit(128 + signal.SIGTERM)


def run_cli(app: Callable[..., Any], argv: Sequence[str] | None = None) -> None:
    """Runs the typer ``app`` with ``argv`` (default ``sys.argv[1:]``); see the module."""
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    debug = DEBUG_FLAG in args[:end] or os.environ.get("AGENTRL_DEBUG") == "1"
    args = [a for i, a in enumerate(args) if i >= end or a != DEBUG_FLAG]
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        app(args=args, prog_name="agentrl")
    except Exception as e:
        if not is_user_error(e):
            raise
        if debug:
            traceback.print_exc()
        print(f"error: {user_message(e)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def cli_app_class() -> type:
    """A ``typer.Typer`` whose plain call (the console script's ``app()``) goes through
    :func:`run_cli`; a call with arguments (``app(args=[...])``) is typer's own."""
    import typer

    class CliApp(typer.Typer):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if args or kwargs:
                return super().__call__(*args, **kwargs)
            return run_cli(super().__call__)

    return CliApp
