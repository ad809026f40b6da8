"""Render a Sample into the user prompt text from the Jinja template of its task type.

Templates live in `easyvideor1/templates/`, one per task family, named after the canonical
problem type ("spatial-temporal grounding" -> `spatial_temporal_grounding.jinja`). Each asks for
the `<think>`/`<answer>` structure and for the answer in exactly the form its scorer in
`easyvideor1.rewards` reads, with an example. Templates branch on `data_type` (video / image /
text); a modality-specific file `<name>.<data_type>.jinja` wins over `<name>.jinja`.

Override: `template_dir` is searched before the shipped templates (copy one, edit it, keep the
name), or may be a single template file used for every sample. Templates see `problem`,
`options` (formatted "A. text"), `data_type`, `extra` (the sample's extra fields) and `sample`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from easyvideor1.records import Sample
from easyvideor1.rewards.dispatch import canonical_type
from easyvideor1.rewards.multiple_choice import option_map

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"


def template_stem(problem_type: str) -> str:
    """File stem of a problem type's template: "open-ended" -> "open_ended" (aliases resolved)."""
    return re.sub(r"[^a-z0-9]+", "_", canonical_type(problem_type).lower()).strip("_")


@lru_cache(maxsize=16)
def _environment(search: tuple[str, ...]):
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(search)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_prompt(sample: Sample, template_dir: str | Path | None = None) -> str:
    """The user prompt text of `sample` (see module docstring for lookup and override)."""
    import jinja2

    search = [str(TEMPLATE_DIR)]
    names = [f"{template_stem(sample.problem_type)}.{sample.data_type}.jinja"]
    names.append(f"{template_stem(sample.problem_type)}.jinja")
    if template_dir is not None:
        path = Path(template_dir)
        if path.is_file():
            search.insert(0, str(path.parent.resolve()))
            names = [path.name]
        elif path.is_dir():
            search.insert(0, str(path.resolve()))
        else:
            raise FileNotFoundError(f"template override {path} is neither a file nor a directory")
    env = _environment(tuple(search))
    try:
        template = env.select_template(names)
    except jinja2.TemplatesNotFound:
        raise FileNotFoundError(
            f"sample {sample.problem_id!r}: no template {' or '.join(names)} in {search}; "
            "add one for this problem type"
        ) from None
    options = [f"{letter}. {text}" for letter, text in option_map(sample.options).items()]
    text = template.render(
        problem=sample.problem,
        options=options,
        data_type=sample.data_type,
        extra=sample.extra,
        sample=sample,
    )
    return text.strip()
