"""Tools: ``@tool`` functions, tool-call parsers per model family, and the executor."""

from agentrl.tools.base import FunctionTool, Tool, ToolArgumentError, tool
from agentrl.tools.executor import ToolExecutor, ToolRunResult
from agentrl.tools.parsers import (
    HermesToolCallParser,
    ParsedOutput,
    ToolCallParser,
    get_parser,
    register_parser,
    render_tool_call,
)
from agentrl.tools.registry import ToolRegistry

__all__ = [
    "FunctionTool",
    "HermesToolCallParser",
    "ParsedOutput",
    "Tool",
    "ToolArgumentError",
    "ToolCallParser",
    "ToolExecutor",
    "ToolRegistry",
    "ToolRunResult",
    "get_parser",
    "register_parser",
    "render_tool_call",
    "tool",
]
