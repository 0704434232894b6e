"""SWE-style code-agent environment (``--env swe``): see docs/swe.md.

Task validation lives in ``agentrl.envs.swe.validate`` (also a command).
"""

from .editor import Editor, EditorError, FileSystem, MemoryFS
from .env import SweEnv
from .grader import Grader, GraderError, GradeResult
from .loader import DATA_DIR, as_task, builtin_tasks, from_swebench, load_tasks, parse_task
from .patch import PatchError, filter_patch, split_patch
from .task import DEFAULT_PROTECTED, SweTask, TaskFormatError
from .workspace import SandboxLostError

__all__ = [
    "DATA_DIR",
    "DEFAULT_PROTECTED",
    "Editor",
    "EditorError",
    "FileSystem",
    "GradeResult",
    "Grader",
    "GraderError",
    "MemoryFS",
    "PatchError",
    "SandboxLostError",
    "SweEnv",
    "SweTask",
    "TaskFormatError",
    "as_task",
    "builtin_tasks",
    "filter_patch",
    "from_swebench",
    "load_tasks",
    "parse_task",
    "split_patch",
]
