"""`spotrain cost`: what the nodes cost, by job, experiment, owner or pool, with GPU-hours,
work lost to preemptions, and the saving against running everything on on-demand."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shared.cli.console import CliError, err, out
from shared.cli.jobs import duration_s
from shared.client import SpotrainClient
from shared.cost import (
    CostRow,
    GroupBy,
    Ledger,
    PoolPrice,
    PricingError,
    cost_rows,
    format_usd,
    load_overrides,
    total,
)


def register_cost_commands(app: typer.Typer) -> None:
    app.command()(cost)


def cost(
    experiment: Annotated[str | None, typer.Option(help="Only this experiment's jobs.")] = None,
    by: Annotated[
        GroupBy, typer.Option(help="One row per job, experiment, owner or pool.")
    ] = GroupBy.JOB,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only node-seconds from then on: a duration back (30m, 2h) or an ISO time "
            "(local time if it names no zone). Default: all on record."
        ),
    ] = None,
    prices: Annotated[
        Path | None,
        typer.Option(
            envvar="SPOTRAIN_COST_PRICES_FILE",
            help="A TOML file of per-pool prices that override the pools' configured ones: "
            "[pool.NAME] price_per_hour_usd, on_demand_price_per_hour_usd, or machine_type "
            "(a machine of the dated list-price catalog in shared/cost).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON array, one object per row, for tools.")
    ] = False,
) -> None:
    """Cost, GPU-hours, waste and the saving against on-demand, from the node-seconds billed."""
    started = _since(since) if since is not None else None
    overrides = _overrides(prices) if prices is not None else {}

    async def go() -> Ledger:
        async with await SpotrainClient.connect() as client:
            return await client.costs(since=started, prices=overrides)

    ledger = asyncio.run(go())
    rows = cost_rows(ledger, by, experiment)
    if as_json:
        print(json.dumps([row.as_json(by) for row in rows]))
        return
    _print_table(ledger, rows, by, experiment)


def _since(text: str) -> datetime:
    now = datetime.now(UTC)
    try:
        back = duration_s(text)
    except CliError:
        pass
    else:
        return now - timedelta(seconds=back)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        msg = f"--since takes a duration back (30m, 2h) or an ISO time, not {text!r}"
        raise CliError(msg, 2) from None
    moment = moment if moment.tzinfo is not None else moment.astimezone()
    if moment > now:
        raise CliError(f"--since {text} is in the future", 2)
    return moment


def _overrides(path: Path) -> dict[str, PoolPrice]:
    try:
        text = path.read_text()
    except OSError as error:
        raise CliError(f"cannot read the prices file {path}: {error.strerror}", 2) from None
    try:
        return load_overrides(text)
    except PricingError as error:
        raise CliError(f"{path}: {error}", 2) from None


def _print_table(ledger: Ledger, rows: list[CostRow], by: GroupBy, experiment: str | None) -> None:
    columns = [by.value, "cost", "GPU-hours", "waste", "saving vs on-demand"]
    if by is GroupBy.POOL:
        columns.insert(2, "idle")
    table = Table(*columns, show_footer=bool(rows))
    for row in rows:
        name = f"[dim](idle {row.idle_pool})[/]" if row.idle_pool else (row.key or "-")
        table.add_row(*_cells(name, row, by))
    if rows:
        for column, cell in zip(table.columns, _cells("total", total(rows), by), strict=True):
            column.footer = cell
    window = f"{ledger.start.astimezone():%Y-%m-%d %H:%M} to {ledger.end.astimezone():%H:%M}"
    scope = f" for experiment {experiment}" if experiment else ""
    out.print(table)
    out.print(f"[dim]node-seconds billed from {window}{scope}[/]")
    inputs = ledger.inputs
    if inputs.pools_without_baseline:
        pools = ", ".join(sorted(inputs.pools_without_baseline))
        err.print(f"[yellow]no on-demand pool of the same shape as {pools}: no saving counted[/]")
    if ledger.attribution.unbilled:
        attempts = {(h.job_id, h.attempt) for h in ledger.attribution.unbilled}
        err.print(
            f"[yellow]{len(attempts)} attempt(s) ran on nodes with no launch on record "
            "(before cost accounting, or past the stream's retention): not costed[/]"
        )


def _cells(name: str, row: CostRow, by: GroupBy) -> list[str]:
    cells = [
        name,
        format_usd(row.cost_usd),
        f"{float(row.gpu_hours):.2f}",
        format_usd(row.waste_usd),
        format_usd(row.saving_vs_on_demand_usd),
    ]
    if by is GroupBy.POOL:
        cells.insert(2, format_usd(row.idle_usd))
    return cells
