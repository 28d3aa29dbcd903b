"""`spotrain cost`: what the nodes cost, by job, experiment, owner or pool, with GPU-hours,
work lost to preemptions, and the saving against running everything on on-demand."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shared.cli.console import CliError, OutputOption, duration_s, err, out, print_table
from shared.cli.job_actions import iso_moment
from shared.cli.tables import Column, Output
from shared.client import SpotrainClient
from shared.jobs import span_text
from shared.policy.cost import (
    CostRow,
    GroupBy,
    Ledger,
    PoolPrice,
    PricingError,
    cost_rows,
    format_usd,
    ledger,
    load_overrides,
    total,
)
from shared.policy.cost.billing_export import (
    BillingExport,
    ExportError,
    Match,
    Reconciliation,
    guess_form,
    ledger_by_node_day,
    read_export,
    reconcile,
)
from shared.policy.cost.node_ends import Unaccounted, node_history, unaccounted
from shared.pools import billed_up_to
from shared.prices import packaged_catalog


def register(app: typer.Typer) -> None:
    app.command()(cost)


def cost(  # noqa: PLR0917  # a typer command: its options are its parameters
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
            "(a machine of the dated list-price catalog in shared/policy/cost).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON array, one object per row, for tools.")
    ] = False,
    output: OutputOption = Output.TABLE,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="List the nodes open on the ledger that no provider has listed lately, "
            "with how long they have gone unaccounted for; exit 1 if there are any.",
        ),
    ] = False,
    reconcile_with: Annotated[
        Path | None,
        typer.Option(
            "--reconcile",
            metavar="FILE",
            help="Compare the ledger, per node and day, with a Cloud Billing export to "
            "BigQuery (CSV, or JSON lines as `bq extract` writes them); exit 1 on any "
            "difference or problem.",
        ),
    ] = None,
) -> None:
    """Cost, GPU-hours, waste and the saving against on-demand, from the node-seconds billed."""
    as_json = as_json or output is Output.JSON
    started = _since(since) if since is not None else None
    overrides = _overrides(prices) if prices is not None else {}
    export = _export(reconcile_with) if reconcile_with is not None else None
    view = asyncio.run(_read(started, overrides))
    if check:
        _print_check(view, as_json=as_json)
        return
    if export is not None:
        _print_reconciliation(view, export, as_json=as_json)
        return
    rows = cost_rows(view.ledger, by, experiment)
    if as_json:
        print(json.dumps([row.as_json(by) for row in rows]))
        return
    _print_table(view.ledger, rows, by, experiment, output)
    _warn_unaccounted(view.unaccounted)


@dataclass(frozen=True)
class _View:
    ledger: Ledger
    unaccounted: list[Unaccounted]
    open_nodes: int
    known_pools: frozenset[str]


async def _read(since: datetime | None, prices: dict[str, PoolPrice]) -> _View:
    async with await SpotrainClient.connect() as client:
        # Sightings first, as `SpotrainClient.costs` reads them (see there why).
        sightings = await client.sightings()
        events = await client.cost_events()
        status = await client.pools()
    now = datetime.now(UTC)
    seen = billed_up_to(sightings)
    history = node_history(events)
    stale_after_s = sightings.stale_after_s() if sightings is not None else 0.0
    billed = ledger(events, now=now, since=since, prices=prices, seen=seen)
    pools = {node.pool for node in billed.inputs.nodes}
    pools |= {pool.pool for pool in status.pools} if status is not None else set()
    return _View(
        ledger=billed,
        unaccounted=unaccounted(history.open, last_seen=seen, now=now, stale_after_s=stale_after_s),
        open_nodes=len(history.open),
        known_pools=frozenset(pools),
    )


def _warn_unaccounted(nodes: list[Unaccounted]) -> None:
    if not nodes:
        return
    longest = max(n.for_s for n in nodes)
    err.print(
        f"[yellow]{len(nodes)} node(s) open on the ledger have not been seen for up to "
        f"{span_text(longest)}: billed only up to when each was last seen "
        "(see `spotrain cost --check`)[/]"
    )


def _print_check(view: _View, *, as_json: bool) -> None:
    nodes = view.unaccounted
    if as_json:
        print(json.dumps([_unaccounted_json(n) for n in nodes]))
    elif not nodes:
        out.print(f"every node open on the ledger ({view.open_nodes}) was seen lately")
    else:
        table = Table("node", "pool", "launched", "last seen", "unaccounted for")
        for n in nodes:
            table.add_row(
                n.node,
                n.pool,
                f"{n.launched_at.astimezone():%Y-%m-%d %H:%M:%S}",
                f"{n.last_seen.astimezone():%Y-%m-%d %H:%M:%S}",
                span_text(n.for_s),
            )
        out.print(table)
        out.print(
            "[dim]open on the ledger, and no provider lists them: billed up to when each "
            "was last seen; the scaler closes them when it next starts[/]"
        )
    if nodes:
        raise typer.Exit(1)


def _unaccounted_json(node: Unaccounted) -> dict[str, object]:
    return {
        "node": node.node,
        "pool": node.pool,
        "launched_at": node.launched_at.isoformat(),
        "last_seen": node.last_seen.isoformat(),
        "unaccounted_for_s": round(node.for_s, 3),
    }


def _export(path: Path) -> BillingExport:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise CliError(f"cannot read the billing export {path}: {error.strerror}", 2) from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a text file (CSV or JSON lines)", 2) from None
    try:
        return read_export(text, guess_form(path.name, text))
    except ExportError as error:
        raise CliError(f"{path}: {error}", 2) from None


def _print_reconciliation(view: _View, export: BillingExport, *, as_json: bool) -> None:
    ours = ledger_by_node_day(view.ledger.inputs.nodes, view.ledger.end)
    result = reconcile(ours, export, known_pools=view.known_pools)
    if as_json:
        print(json.dumps(_reconciliation_json(result)))
    else:
        table = Table("node", "day", "ledger", "bill", "difference", "")
        for day in result.days:
            style = "" if day.match is Match.MATCHED else "[yellow]"
            table.add_row(
                day.node,
                day.day.isoformat(),
                format_usd(day.ledger_usd),
                format_usd(day.bill_usd),
                format_usd(day.difference_usd),
                f"{style}{day.match.value}",
            )
        out.print(table)
        counts = ", ".join(f"{result.counts.get(m, 0)} {m.value}" for m in Match)
        out.print(
            f"{len(result.days)} node-days: {counts}; ledger {format_usd(result.ledger_usd)}, "
            f"bill {format_usd(result.bill_usd)} (credits {format_usd(result.credits_usd)} "
            "not counted)"
        )
        for problem in result.problems:
            out.print(f"[yellow]problem: {problem}[/]")
    if result.problems or any(d.match is not Match.MATCHED for d in result.days):
        raise typer.Exit(1)


def _reconciliation_json(result: Reconciliation) -> dict[str, object]:
    return {
        "node_days": [
            {
                "node": d.node,
                "day": d.day.isoformat(),
                "ledger_usd": round(float(d.ledger_usd), 6),
                "bill_usd": round(float(d.bill_usd), 6),
                "difference_usd": round(float(d.difference_usd), 6),
                "match": d.match.value,
            }
            for d in result.days
        ],
        "ledger_usd": round(float(result.ledger_usd), 6),
        "bill_usd": round(float(result.bill_usd), 6),
        "credits_usd": round(float(result.credits_usd), 6),
        "problems": list(result.problems),
    }


def _since(text: str) -> datetime:
    now = datetime.now(UTC)
    try:
        back = duration_s(text)
    except CliError:
        pass
    else:
        return now - timedelta(seconds=back)
    try:
        moment = iso_moment(text)
    except ValueError:
        msg = f"--since takes a duration back (30m, 2h) or an ISO time, not {text!r}"
        raise CliError(msg, 2) from None
    if moment > now:
        raise CliError(f"--since {text} is in the future", 2)
    return moment


def _overrides(path: Path) -> dict[str, PoolPrice]:
    try:
        text = path.read_text()
    except OSError as error:
        raise CliError(f"cannot read the prices file {path}: {error.strerror}", 2) from None
    try:
        return load_overrides(text, packaged_catalog())
    except PricingError as error:
        raise CliError(f"{path}: {error}", 2) from None


def _print_table(
    ledger: Ledger, rows: list[CostRow], by: GroupBy, experiment: str | None, output: Output
) -> None:
    columns = [
        Column(by.value, style=lambda cell: "dim" if cell.startswith("(idle ") else None),
        Column("cost"),
        *([Column("idle", priority=2)] if by is GroupBy.POOL else []),
        Column("gpu_hours", priority=1),
        Column("waste", priority=1),
        Column("saving", priority=2),
    ]
    cells = [_cells(f"(idle {r.idle_pool})" if r.idle_pool else (r.key or "-"), r) for r in rows]
    if rows:
        # The bill's total is the last row, as on an invoice.
        cells.append(_cells("total", total(rows)))
    print_table(
        columns,
        [{by.value: c.pop("key"), **c} for c in cells],
        output,
        [],
        empty="nothing billed: no node ran in the window",
    )
    window = f"{ledger.start.astimezone():%Y-%m-%d %H:%M} to {ledger.end.astimezone():%H:%M}"
    scope = f" for experiment {experiment}" if experiment else ""
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


def _cells(name: str, row: CostRow) -> dict[str, str]:
    return {
        "key": name,
        "cost": format_usd(row.cost_usd),
        "idle": format_usd(row.idle_usd),
        "gpu_hours": f"{float(row.gpu_hours):.2f}",
        "waste": format_usd(row.waste_usd),
        "saving": format_usd(row.saving_vs_on_demand_usd),
    }
