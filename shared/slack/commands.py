"""The `/train` command's grammar: Slack's text in, one command out. Pure: no I/O.

`parse` raises `CommandError` and nothing else, whatever the text; its message is for the
user who typed the command.
"""

from __future__ import annotations

import shlex
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.events.types import CapacityClass, JobId, Name, ShortText
from shared.slack.model import ProjectName

MAX_TEXT_CHARS = 4000
"""Slack sends at most this much after the command; anything longer is not from Slack."""


class CommandError(ValueError):
    """The text is not a valid `/train` command; the message says why, for the user."""


class Verb(StrEnum):
    SUBMIT = "submit"
    STATUS = "status"
    CANCEL = "cancel"
    COST = "cost"
    HELP = "help"


class _Command(BaseModel):
    # Lax, unlike events: values arrive as the strings the user typed.
    model_config = ConfigDict(frozen=True, extra="forbid")


class Submit(_Command):
    """`/train submit PROJECT [options] [-- ARGS]`"""

    project: ProjectName
    args: Annotated[tuple[ShortText, ...], Field(max_length=192)] = ()
    gpus: Annotated[int, Field(ge=0, le=16)] = 0
    workers: Annotated[int, Field(ge=1, le=256)] = 1
    cpus: Annotated[float, Field(gt=0, le=512)] = 1.0
    memory_gb: Annotated[float, Field(ge=0, le=4096)] = 0.0
    gpu_type: Name | None = None
    capacity: CapacityClass = CapacityClass.ANY
    priority: Annotated[int, Field(ge=0, le=9)] = 5
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3
    experiment: Name | None = None


class Status(_Command):
    """`/train status [JOB]`: one job, or my recent jobs."""

    job_id: JobId | None = None


class Cancel(_Command):
    """`/train cancel JOB`"""

    job_id: JobId


class Cost(_Command):
    """`/train cost [JOB]`: one job's cost, or my experiments'."""

    job_id: JobId | None = None


class Help(_Command):
    """`/train` or `/train help`"""


Command = Submit | Status | Cancel | Cost | Help
C = TypeVar("C", bound=_Command)

# Submit's options: the CLI's names, for what makes sense without a working directory.
VALUED_OPTIONS = {
    "--gpus": "gpus",
    "--workers": "workers",
    "--cpus": "cpus",
    "--memory-gb": "memory_gb",
    "--gpu-type": "gpu_type",
    "--priority": "priority",
    "--max-restarts": "max_restarts",
    "--experiment": "experiment",
}
CAPACITY_FLAGS = {
    "--spot": CapacityClass.SPOT,
    "--on-demand": CapacityClass.ON_DEMAND,
    "--any": CapacityClass.ANY,
}
_OPTION_OF_FIELD = {field: option for option, field in VALUED_OPTIONS.items()}

# What Slack and phones do to typed text: HTML-escape three characters, curl quotes, and
# turn a typed `--` into a dash.
_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))
_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_DASHES = ("\u2014", "\u2013")


def parse(text: str) -> Command:
    """The command in a slash command's `text`; raises `CommandError` when there is none."""
    if len(text) > MAX_TEXT_CHARS:
        msg = f"that command is too long (at most {MAX_TEXT_CHARS} characters)"
        raise CommandError(msg)
    tokens = tokenize(text)
    if not tokens:
        return Help()
    verb, rest = tokens[0].lower(), tokens[1:]
    if verb == Verb.SUBMIT:
        return _submit(rest)
    if verb == Verb.STATUS:
        return _validated(Status, {"job_id": _at_most_one_job(verb, rest)})
    if verb == Verb.CANCEL:
        job_id = _at_most_one_job(verb, rest)
        if job_id is None:
            raise CommandError("which job? `cancel JOB`")
        return _validated(Cancel, {"job_id": job_id})
    if verb == Verb.COST:
        return _validated(Cost, {"job_id": _at_most_one_job(verb, rest)})
    if verb == Verb.HELP:
        return Help()
    known = ", ".join(f"`{v.value}`" for v in Verb)
    msg = f"unknown command `{_shown(tokens[0])}`; try one of {known}"
    raise CommandError(msg)


def tokenize(text: str) -> list[str]:
    """Split like a shell, after undoing what Slack and phones do to typed text."""
    for entity, char in _ENTITIES:
        text = text.replace(entity, char)
    try:
        tokens = shlex.split(text.translate(_QUOTES))
    except ValueError as error:
        msg = f"cannot split that command: {str(error).lower()}"
        raise CommandError(msg) from None
    return ["--" + token[1:] if token.startswith(_DASHES) else token for token in tokens]


def _submit(tokens: list[str]) -> Submit:
    if "--" in tokens:
        split = tokens.index("--")
        tokens, args = tokens[:split], tokens[split + 1 :]
    else:
        args = []
    fields: dict[str, Any] = {"args": tuple(args)}
    positionals: list[str] = []
    queue = list(tokens)
    while queue:
        token = queue.pop(0)
        if token.startswith("-"):
            _take_option(token, queue, fields)
        else:
            positionals.append(token)
    if not positionals:
        raise CommandError("which project? `submit PROJECT [options] [-- ARGS]`")
    if len(positionals) > 1:
        msg = (
            f"unexpected `{_shown(positionals[1])}`: the project comes first, then options; "
            "put the script's own arguments after `--`"
        )
        raise CommandError(msg)
    fields["project"] = positionals[0]
    return _validated(Submit, fields)


def _take_option(token: str, queue: list[str], fields: dict[str, Any]) -> None:
    """Read one option into `fields`, and its value from `queue` unless given with `=`."""
    name, has_value, value = token.partition("=")
    if name in CAPACITY_FLAGS:
        if has_value:
            msg = f"`{name}` takes no value"
            raise CommandError(msg)
        chosen = CAPACITY_FLAGS[name]
        if fields.setdefault("capacity", chosen) != chosen:
            msg = f"choose one of {', '.join(CAPACITY_FLAGS)}"
            raise CommandError(msg)
        return
    if name not in VALUED_OPTIONS:
        known = ", ".join(f"`{o}`" for o in [*VALUED_OPTIONS, *CAPACITY_FLAGS])
        msg = f"unknown option `{_shown(name)}`; known: {known}"
        raise CommandError(msg)
    if not has_value:
        if not queue or queue[0].startswith("--"):
            msg = f"`{name}` needs a value"
            raise CommandError(msg)
        value = queue.pop(0)
    fields[VALUED_OPTIONS[name]] = value


def _at_most_one_job(verb: str, tokens: list[str]) -> str | None:
    if len(tokens) > 1:
        msg = f"`{verb}` takes one job id, not {len(tokens)} words"
        raise CommandError(msg)
    return tokens[0] if tokens else None


def _validated(model: type[C], fields: dict[str, Any]) -> C:
    try:
        return model.model_validate(fields)
    except ValidationError as error:
        problem = error.errors()[0]
        field = str(problem["loc"][0]) if problem["loc"] else ""
        what = _FIELD_NAMES.get(field) or f"`{_OPTION_OF_FIELD.get(field, field)}`"
        if problem["type"] == "string_pattern_mismatch":
            explained = _PATTERN_HINTS.get(field, "letters, digits, `.`, `_`, `@` and `-` only")
        else:
            explained = problem["msg"][0].lower() + problem["msg"][1:]
        msg = f"{what}: {explained}"
        raise CommandError(msg) from None


_FIELD_NAMES = {
    "project": "the project name",
    "job_id": "the job id",
    "args": "the script's arguments",
}
_PATTERN_HINTS = {
    "project": "lowercase letters, digits, `-` and `_`, as `help` lists them",
    "job_id": "lowercase letters, digits and dashes, like `digits-3f9a1c`",
}


def _shown(token: str) -> str:
    """A token the user typed, shortened and safe to quote back in Slack's markup."""
    short = token if len(token) <= 40 else token[:39] + "…"
    return short.replace("`", "'")
