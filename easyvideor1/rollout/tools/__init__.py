"""Video tools and the multi-turn rollout ("thinking with videos").

protocol.py (what a tool is: `Tool`, `ToolContext`, `ToolOutput`, `ToolError`), video_tools.py
(the built-in `crop_video` and `zoom_frame`, and `ClipSource`, which decodes clips once),
registry.py (`TOOLS`, the literal name -> tool table; parsing and running calls), turns.py (a
tool turn's tokens and media; a sequence of prompt + turns as model inputs), multiturn.py
(`ToolEngine`: the token-in / token-out loop around a rollout engine; tool metrics).
"""
