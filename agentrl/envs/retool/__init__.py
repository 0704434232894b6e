"""ReTool-style math with a Python interpreter (``--env retool``)."""

from .data import TaskFormatError, generate_tasks, load_tasks, parse_task
from .env import RetoolEnv
from .reward import answers_match, extract_boxed, score

__all__ = [
    "RetoolEnv",
    "TaskFormatError",
    "answers_match",
    "extract_boxed",
    "generate_tasks",
    "load_tasks",
    "parse_task",
    "score",
]
