"""The tool table and what turns a model's text into tool results.

    TOOLS = {"crop_video": ..., "zoom_frame": ...}      `rollout.tools` names keys of it
    parse_tool_calls(text) -> [ParsedCall]              `<tool_call>{"name": .., "arguments": {..}}</tool_call>`
    run_call(call, tools, ctx) -> (ToolOutput, ToolCall)

The call format is the Qwen families' native one (their chat templates' `tools=` system text asks
for it). Every bad call (malformed JSON, unknown tool, arguments that break the schema or the
tool's ranges, over the visual-token budget) gives an output whose text starts with "Error:"
and a `ToolCall` whose `error` says why; nothing raises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from easyvideor1.records import Sample, ToolCall
from easyvideor1.rollout.tools.protocol import Tool, ToolContext, ToolError, ToolOutput, visual_tokens
from easyvideor1.rollout.tools.video_tools import CROP_VIDEO, ZOOM_FRAME

CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
OPEN_TAG = "<tool_call>"


@dataclass
class ParsedCall:
    """One `<tool_call>` of a turn: a name and arguments, or why it could not be read."""

    name: str = ""
    arguments: dict | None = None
    error: str | None = None


def parse_tool_calls(text: str) -> list[ParsedCall]:
    """The calls in `text`, in order; an unclosed `<tool_call>` is one malformed call."""
    calls = []
    bodies = CALL_RE.findall(text)
    for body in bodies:
        try:
            obj = json.loads(body.strip())
        except json.JSONDecodeError as e:
            calls.append(ParsedCall(error=f"malformed tool call (not JSON: {e.msg})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(ParsedCall(error='malformed tool call: expected {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not isinstance(args, dict):
            calls.append(ParsedCall(obj["name"], error="malformed tool call: arguments must be a JSON object"))
            continue
        calls.append(ParsedCall(obj["name"], args))
    if text.count(OPEN_TAG) > len(bodies):
        calls.append(ParsedCall(error="malformed tool call: <tool_call> without </tool_call>"))
    return calls


def _type_ok(value, kind: str) -> bool:
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    return True


def check_arguments(tool: Tool, args: dict) -> None:
    """Raise `ToolError` unless `args` fit the tool's schema (required, known names, types, array sizes)."""
    props = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in args]
    if missing:
        raise ToolError(f"{tool.name} needs {', '.join(missing)}")
    unknown = [k for k in args if k not in props]
    if unknown:
        raise ToolError(f"{tool.name} has no argument {', '.join(unknown)} (it takes {', '.join(props)})")
    for key, value in args.items():
        spec = props[key]
        if not _type_ok(value, spec.get("type", "")):
            raise ToolError(f"{key} must be a {spec['type']}")
        if spec.get("type") == "array":
            if not spec.get("minItems", 0) <= len(value) <= spec.get("maxItems", len(value)):
                raise ToolError(f"{key} must have {spec.get('minItems')} items")
            kind = spec.get("items", {}).get("type", "")
            if not all(_type_ok(v, kind) for v in value):
                raise ToolError(f"{key} must hold {kind}s")


def run_call(call: ParsedCall, tools: dict[str, Tool], ctx: ToolContext) -> tuple[ToolOutput, ToolCall]:
    """Run one call to one of `tools` (those the sample is offered); bad calls, and calls to any
    other tool, give an error output (module docstring)."""
    error = call.error
    output = None
    if error is None and call.name not in tools:  # `tools`: those offered to the prompt's sample
        what = "tool {!r} is not offered to this sample" if call.name in TOOLS else "unknown tool {!r}"
        error = what.format(call.name) + f"; available: {', '.join(tools)}"
    if error is None:
        try:
            check_arguments(tools[call.name], call.arguments)
            output = tools[call.name].fn(ctx, call.arguments)
            used = sum(visual_tokens(m, ctx.family) for m in output.media)
            if used > ctx.visual_tokens:
                raise ToolError(f"over budget: the result takes {used} visual tokens, {ctx.visual_tokens} are left")
        except ToolError as e:
            error, output = str(e), None
    if error is not None:
        return ToolOutput(f"Error: {error}"), ToolCall(call.name, call.arguments, error, 0)
    used = sum(visual_tokens(m, ctx.family) for m in output.media)
    return output, ToolCall(call.name, call.arguments, None, used)


def get_tools(names: list[str]) -> dict[str, Tool]:
    """The tools named by `rollout.tools`, by name; an unknown name lists the valid ones."""
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise ValueError(f"rollout.tools: unknown tool(s) {', '.join(unknown)}; valid: {', '.join(TOOLS)}")
    return {n: TOOLS[n] for n in names}


def tools_not_on(samples: list[Sample], run_tools: list[str]) -> tuple[int, list[str]]:
    """How many samples list (`Sample.tools`) a tool that `run_tools` (`rollout.tools`) does not
    turn on, and those names, sorted: not an error (a control run without tools reads the same
    data), but said once at the start."""
    names = [[t for t in s.tools if t not in run_tools] for s in samples if s.tools]
    names = [n for n in names if n]
    return len(names), sorted({t for n in names for t in n})


TOOLS: dict[str, Tool] = {"crop_video": CROP_VIDEO, "zoom_frame": ZOOM_FRAME}
