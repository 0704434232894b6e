"""Tools: ``@tool`` functions, the registry, the executor; parsers re-exported from chat."""

from agentrl.chat.detect import DetectedParsers, detect_parsers
from agentrl.chat.parsers import (
    HermesToolCallParser,
    ParsedOutput,
    ToolCallParser,
    get_parser,
    make_tool_parser,
    register_parser,
    render_tool_call,
)
from agentrl.chat.reasoning import (
    ReasoningParser,
    TurnParser,
    make_reasoning_parser,
    make_turn_parser,
)
from agentrl.tools.base import FunctionTool, Tool, ToolArgumentError, tool
from agentrl.tools.executor import ToolExecutor, ToolRunResult
from agentrl.tools.registry import ToolRegistry

__all__ = [
    "DetectedParsers",
    "FunctionTool",
    "HermesToolCallParser",
    "ParsedOutput",
    "ReasoningParser",
    "Tool",
    "ToolArgumentError",
    "ToolCallParser",
    "ToolExecutor",
    "ToolRegistry",
    "ToolRunResult",
    "TurnParser",
    "detect_parsers",
    "get_parser",
    "make_reasoning_parser",
    "make_tool_parser",
    "make_turn_parser",
    "register_parser",
    "render_tool_call",
    "tool",
]
