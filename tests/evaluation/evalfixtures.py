"""Record and response builders shared by the evaluation tests (unique module name on purpose)."""

from __future__ import annotations


def mc(pid, question, options, letter, **extra) -> dict:
    """A multiple-choice record in EasyVideoR1's converted schema."""
    return {"problem_id": pid, "problem": question, "data_type": "video", "problem_type": "multiple choice",
            "options": options, "solution": f"<answer>{letter}</answer>", "path": f"./videos/{pid}.mp4", **extra}


def answer(text: str) -> str:
    """A well-formed model response."""
    return f"<think>looked at the video</think><answer>{text}</answer>"
