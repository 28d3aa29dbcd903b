"""Every text the Slack bot writes, in Slack's markup. Pure: data in, text out.

Whatever a user or a training script wrote (arguments, failure messages, labels) is
escaped first, so nothing they typed can become a `<!channel>` ping or a fake link.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from shared.events.data import (
    EventData,
    InterruptionCause,
    JobAccepted,
    JobCancelled,
    JobFailed,
    JobInterrupted,
    JobRejected,
    JobRequested,
    JobResumed,
    JobStarted,
    JobSucceeded,
)
from shared.jobs import JobRecord, JobState
from shared.pools import PoolsStatus
from shared.slack.commands import CAPACITY_FLAGS, VALUED_OPTIONS
from shared.slack.model import ExperimentCost, JobCost, Origin, Project

MAX_FAILURE_CHARS = 600
"""A failure's message is cut to this much in the thread; `spotrain logs` has the rest."""


def escape(text: str) -> str:
    """Slack's three control characters, as Slack's docs ask for them to be escaped."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    """Inline code that stays inline code whatever the text holds."""
    return "`" + escape(text).replace("`", "'") + "`"


def block(text: str) -> str:
    """A preformatted block, for output such as a traceback's last lines."""
    return "```" + escape(text).replace("```", "'''") + "```"


def usage(command: str, projects: Mapping[str, Project]) -> str:
    options = " ".join(f"{o} N" for o in VALUED_OPTIONS) + " " + " | ".join(CAPACITY_FLAGS)
    lines = [
        f"*{command} submit PROJECT [options] [-- ARGS]*: run a registered project "
        "(code already in the training image); its progress is posted in a thread here.",
        f"    options: {escape(options)}",
        f"*{command} status [JOB]*: one of your jobs, or your recent ones",
        f"*{command} cancel JOB*: stop one of your jobs",
        f"*{command} cost [JOB]*: what a job or your experiments cost",
    ]
    if projects:
        lines.append("Projects:")
        lines += [
            f"• {code(name)}: {code(' '.join(p.entrypoint))}"
            + (f" ({escape(p.description)})" if p.description else "")
            for name, p in sorted(projects.items())
        ]
    else:
        lines.append("No project is registered yet: ask an admin to add one.")
    return "\n".join(lines)


def command_error(problem: str, command: str) -> str:
    return f":warning: {escape(problem)}. See `{command} help`."


def unmapped_user(user_id: str) -> str:
    return (
        ":no_entry: Your Slack account is not mapped to a spotrain user, so you cannot run "
        f"jobs from here. Ask an admin to map your Slack id {code(user_id)} to your user "
        "name (SPOTRAIN_SLACK_OWNERS)."
    )


def unknown_project(name: str, projects: Mapping[str, Project]) -> str:
    known = ", ".join(code(p) for p in sorted(projects)) or "none yet"
    return (
        f":warning: No project {code(name)}. From Slack you run registered projects only, "
        f"since there is no working directory to upload; registered: {known}."
    )


def invalid_request(detail: str) -> str:
    return f":warning: That request is not valid: {escape(detail)}."


def no_such_job(job_id: str) -> str:
    return f":warning: No job {code(job_id)}."


def not_your_job(job_id: str) -> str:
    return (
        f":no_entry: {code(job_id)} belongs to another user: you can see and cancel "
        "your own jobs only."
    )


def already_ended(job_id: str, state: str) -> str:
    return f"{code(job_id)} already ended ({escape(state)}); nothing to cancel."


def platform_unreachable() -> str:
    return ":warning: The platform did not answer in time. Try again: asking twice is harmless."


def submitting(job_id: str) -> str:
    return f"Submitting {code(job_id)}… Updates follow in a thread in this channel."


def announcement(request: JobRequested, origin: Origin, project: str) -> str:
    worker = request.worker
    shape = f"{worker.gpus} GPU" + ("s" if worker.gpus != 1 else "")
    if worker.gpu_type:
        shape += f" ({escape(worker.gpu_type)})"
    if request.num_workers > 1:
        shape += f" on each of {request.num_workers} workers"
    return (
        f"<@{origin.user}> submitted {code(request.job_id)}: project *{escape(project)}*, "
        f"{shape}, {request.capacity.value} capacity\n{code(' '.join(request.entrypoint))}"
    )


def cannot_post(error: str, command: str) -> str:
    return (
        f":warning: I cannot post in this conversation ({escape(error)}), so I could not "
        f"report on the job: nothing was submitted. Invite me to a channel (`/invite`) and "
        f"run `{command} submit` there."
    )


def not_submitted() -> str:
    return ":x: The platform could not be reached: the job was not submitted. Try again."


def cancel_requested(job_id: str) -> str:
    return f"Cancel requested for {code(job_id)}; its thread will say when it has stopped."


def status(record: JobRecord, now: datetime) -> str:
    request, attempt = record.request, record.current
    lines = [
        f"{code(record.job_id)}: *{record.state.value}*"
        + (" (cancel requested)" if record.cancel_requested and record.is_active else ""),
        f"project/experiment {escape(request.experiment or '-')}, "
        f"{record.gpus} GPU(s), {request.capacity.value} capacity, "
        f"submitted {_age(now - record.accepted_at)} ago",
    ]
    if attempt is not None:
        where = f" on {escape(attempt.pool)}" if attempt.pool else ""
        step = f", step {attempt.step}" if attempt.step is not None else ""
        lines.append(f"attempt {attempt.number} {attempt.state.value}{where}{step}")
        if attempt.metrics:
            shown = ", ".join(
                f"{escape(k)} {v:.4g}" for k, v in sorted(attempt.metrics.items())[:6]
            )
            lines.append(shown)
    if record.interruptions:
        lines.append(f"interrupted {record.interruptions} time(s), resumed from checkpoints")
    if record.state is JobState.REJECTED and record.detail:
        lines.append(f"rejected: {escape(record.detail)}")
    if attempt is not None and record.state is JobState.FAILED and attempt.message:
        lines.append(f"failed:\n{block(_cut(attempt.message))}")
    return "\n".join(lines)


def jobs_list(records: Sequence[JobRecord], now: datetime, command: str) -> str:
    if not records:
        return f"You have no jobs yet. Start one with `{command} submit PROJECT`."
    rows = [
        f"• {code(r.job_id)} *{r.state.value}*, {r.gpus} GPU(s), {_age(now - r.accepted_at)} ago"
        for r in records
    ]
    return "Your most recent jobs:\n" + "\n".join(rows)


def cost_unavailable(spend: PoolsStatus | None) -> str:
    text = (
        ":hourglass: Cost per experiment is not available right now: the cost ledger "
        "could not be read."
    )
    if spend is not None:
        text += (
            f" Right now the cluster spends ${spend.cost_per_hour_usd:.2f}/h of a "
            f"${spend.budget_per_hour_usd:.2f}/h budget."
        )
    return text


def job_cost(cost: JobCost) -> str:
    return f"{code(cost.job_id)} has cost {_money(cost)} so far."


def experiment_costs(costs: Sequence[ExperimentCost]) -> str:
    if not costs:
        return "None of your experiments has cost anything yet."
    rows = [
        f"• {escape(c.experiment)}: {_money(c)} over {c.jobs} job(s)"
        for c in sorted(costs, key=lambda c: c.total_usd, reverse=True)
    ]
    return "What your experiments have cost:\n" + "\n".join(rows)


def job_event(
    data: EventData, record: JobRecord, origin: Origin, cost: JobCost | None = None
) -> str:
    """The thread's line about one of a job's events."""
    job = code(record.job_id)
    owner = f"<@{origin.user}>"
    spent = f" Cost: {_money(cost)}." if cost is not None else ""
    match data:
        case JobAccepted():
            return f":inbox_tray: {job} accepted; waiting for capacity."
        case JobRejected(reason=reason, detail=detail):
            return f":no_entry: {owner} {job} was rejected ({reason.value}): {escape(detail)}"
        case JobStarted(attempt=attempt, pool=pool):
            where = f" on {escape(pool)}" if pool else ""
            if attempt == 1:
                return f":rocket: {job} is running{where}."
            return f":rocket: {job} is running again{where} (attempt {attempt})."
        case JobInterrupted(attempt=attempt, node=node, cause=cause):
            why = {
                InterruptionCause.PREEMPTED: "its spot node was preempted",
                InterruptionCause.MOVED: "the platform moved it to other capacity",
                InterruptionCause.RECLAIMED: "its team's borrowed GPUs were taken back",
                InterruptionCause.PRIORITY: "a higher priority job of its team needed the GPUs",
            }.get(cause, "its node was lost")
            return (
                f":warning: {job} attempt {attempt} was interrupted: {why} "
                f"({escape(node)}). It resumes from its latest checkpoint."
            )
        case JobResumed(attempt=attempt, from_step=step, steps_lost=lost, capacity=capacity):
            origin_text = f"from step {step}" if step else "from the start"
            return (
                f":arrows_counterclockwise: {job} resumes as attempt {attempt} "
                f"{origin_text} on {capacity.value} capacity ({lost} step(s) lost)."
            )
        case JobSucceeded(attempt=attempt):
            tries = f" after {attempt} attempts" if attempt > 1 else ""
            return f":white_check_mark: {owner} {job} succeeded{tries}.{spent}"
        case JobFailed(attempt=attempt, message=message):
            return f":x: {owner} {job} failed (attempt {attempt}).{spent}\n{block(_cut(message))}"
        case JobCancelled():
            return f":stop_sign: {owner} {job} was cancelled.{spent}"
    return f"{job}: {escape(data.event_type())}"


def _money(cost: JobCost | ExperimentCost) -> str:
    return f"${cost.total_usd:.2f} ({cost.gpu_hours:.1f} GPU-hours)"


def _cut(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_FAILURE_CHARS else "…" + text[-MAX_FAILURE_CHARS:]


def _age(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86_400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86_400}d"
