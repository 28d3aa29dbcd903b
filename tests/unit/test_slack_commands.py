"""The `/train` grammar: what each text becomes, and that nothing but `CommandError`
ever comes out of the parser."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.events.types import CapacityClass
from shared.slack.commands import (
    CAPACITY_FLAGS,
    MAX_TEXT_CHARS,
    VALUED_OPTIONS,
    Cancel,
    Command,
    CommandError,
    Cost,
    Help,
    Status,
    Submit,
    parse,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", Help(), id="nothing-is-help"),
        pytest.param("  HELP ", Help(), id="help-any-case"),
        pytest.param("submit digits", Submit(project="digits"), id="submit-defaults"),
        pytest.param(
            "submit digits --gpus 2 --workers 3 --cpus 4.5 --memory-gb 16 --gpu-type nvidia-l4"
            " --priority 7 --max-restarts 1 --experiment lr-sweep --spot",
            Submit(
                project="digits",
                gpus=2,
                workers=3,
                cpus=4.5,
                memory_gb=16,
                gpu_type="nvidia-l4",
                priority=7,
                max_restarts=1,
                experiment="lr-sweep",
                capacity=CapacityClass.SPOT,
            ),
            id="submit-every-option",
        ),
        pytest.param(
            "submit digits --gpus=4 --on-demand",
            Submit(project="digits", gpus=4, capacity=CapacityClass.ON_DEMAND),
            id="option-equals-value",
        ),
        pytest.param(
            "submit digits --gpus 1 -- --lr 0.1 --name 'two words' -- x",
            Submit(
                project="digits", gpus=1, args=("--lr", "0.1", "--name", "two words", "--", "x")
            ),
            id="everything-after-the-first-dashes-is-the-scripts",
        ),
        pytest.param(
            "submit digits \u2014gpus 2 \u2014 --note \u201cit\u2019s fine\u201d",
            Submit(project="digits", gpus=2, args=("--note", "it's fine")),
            id="phone-dashes-and-curly-quotes",
        ),
        pytest.param(
            "submit digits -- --expr 'a &lt; b &amp;&amp; c &gt; d'",
            Submit(project="digits", args=("--expr", "a < b && c > d")),
            id="slack-escaped-characters-are-unescaped",
        ),
        pytest.param(
            "submit digits --any --any", Submit(project="digits"), id="same-capacity-twice"
        ),
        pytest.param("status", Status(), id="status-of-my-jobs"),
        pytest.param("status digits-3f9a1c", Status(job_id="digits-3f9a1c"), id="status-job"),
        pytest.param("Cancel digits-3f9a1c", Cancel(job_id="digits-3f9a1c"), id="cancel-job"),
        pytest.param("cost", Cost(), id="cost-of-my-experiments"),
        pytest.param("cost digits-3f9a1c", Cost(job_id="digits-3f9a1c"), id="cost-of-a-job"),
    ],
)
def test_parses(text: str, expected: Command) -> None:
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("frobnicate", "unknown command `frobnicate`", id="unknown-verb"),
        pytest.param("submit", "which project?", id="submit-without-project"),
        pytest.param("submit --gpus 2", "which project?", id="options-but-no-project"),
        pytest.param("submit a b", "unexpected `b`", id="second-positional"),
        pytest.param("submit digits --gpus", "`--gpus` needs a value", id="missing-value"),
        pytest.param("submit digits --gpus --spot", "`--gpus` needs a value", id="flag-as-value"),
        pytest.param(
            "submit digits --gpus two",
            "`--gpus`: input should be a valid integer",
            id="not-a-number",
        ),
        pytest.param(
            "submit digits --gpus 17",
            "`--gpus`: input should be less than or equal",
            id="over-the-limit",
        ),
        pytest.param("submit digits --workers 0", "`--workers`", id="no-workers"),
        pytest.param("submit digits --spot --on-demand", "choose one of", id="two-capacities"),
        pytest.param("submit digits --spot=yes", "`--spot` takes no value", id="flag-with-value"),
        pytest.param("submit digits --frob", "unknown option `--frob`", id="unknown-option"),
        pytest.param("submit Digits", "the project name: lowercase", id="bad-project-name"),
        pytest.param("submit digits --gpu-type 'a b'", "`--gpu-type`: letters", id="bad-name"),
        pytest.param("status Not_An_Id", "the job id: lowercase", id="bad-job-id"),
        pytest.param("status a b", "takes one job id, not 2 words", id="two-job-ids"),
        pytest.param("cancel", "which job?", id="cancel-without-job"),
        pytest.param("submit 'digits", "no closing quotation", id="unbalanced-quote"),
        pytest.param("x" * (MAX_TEXT_CHARS + 1), "too long", id="too-long"),
    ],
)
def test_refuses_with_a_message_for_the_user(text: str, message: str) -> None:
    with pytest.raises(CommandError) as raised:
        parse(text)
    assert message in str(raised.value)


_WORDS = [
    "submit", "status", "cancel", "cost", "help", "digits", "job-1", "--", "-", "—", "=",
    *VALUED_OPTIONS, *CAPACITY_FLAGS, "--gpus=3", "2", "-1", "1e999", "nan", "0.5", "'",
    '"', "\\", "“", "&amp;", "&lt;", "é", "\x00", "", " ",
]  # fmt: skip


@given(st.text(max_size=300))
def test_any_text_parses_or_raises_only_command_error(text: str) -> None:
    """Whatever Slack sends, the parser answers a command or a CommandError."""
    with contextlib.suppress(CommandError):
        parse(text)


@given(st.lists(st.sampled_from(_WORDS) | st.text(max_size=8), max_size=12))
def test_any_sequence_of_command_words_parses_or_raises_only_command_error(
    words: list[str],
) -> None:
    """Near-miss commands reach the deep branches of the grammar, and still only raise
    CommandError; what parses is a valid command."""
    outcome = _parse_or_error(" ".join(words))
    if isinstance(outcome, CommandError):
        assert str(outcome), "a refusal always says why"
    else:
        assert isinstance(outcome, Submit | Status | Cancel | Cost | Help)


def _parse_or_error(text: str) -> Command | CommandError:
    try:
        return parse(text)
    except CommandError as error:
        return error
