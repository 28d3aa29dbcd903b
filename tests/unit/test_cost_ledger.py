"""From the events on the bus to costs: node lifetimes, attempt holds, waste and views."""

from __future__ import annotations

from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest

from shared.events import Event, EventData, new_event
from shared.events.data import (
    InterruptionCause,
    JobCancelled,
    JobInterrupted,
    JobQueued,
    JobRequested,
    JobResized,
    JobResumed,
    JobStarted,
    JobSucceeded,
    NodeLaunched,
    NodeLost,
    NodeReleased,
    NoticeSource,
    ReleaseReason,
    ResizeReason,
)
from shared.events.types import Bundle, CapacityClass
from shared.policy.cost import GroupBy, PoolPrice, cost_rows, job_costs, ledger
from shared.prices import packaged_catalog
from tests.events import NOW

T0 = NOW
SPOT_PRICE = 0.72  # $0.0002 a second
ON_DEMAND_PRICE = 1.8  # $0.0005 a second


class Story:
    """Events told in seconds from `t0`."""

    def __init__(self, t0: datetime = T0) -> None:
        self.t0 = t0

    def t(self, s: float) -> datetime:
        return self.t0 + timedelta(seconds=s)

    def ev(self, data: EventData, at: float) -> Event[Any]:
        return new_event(data, source="tests", time=self.t(at))

    def launched(self, node: str, at: float, *, spot: bool = True, **fields: Any) -> Event[Any]:
        values: dict[str, Any] = {
            "node": node,
            "pool": "gpu-spot" if spot else "gpu-on-demand",
            "capacity": CapacityClass.SPOT if spot else CapacityClass.ON_DEMAND,
            "gpus": 2,
            "cpus": 2,
            "price_per_hour_usd": SPOT_PRICE if spot else ON_DEMAND_PRICE,
            "on_demand_pool": "gpu-on-demand",
            "on_demand_price_per_hour_usd": ON_DEMAND_PRICE,
            "launched_at": self.t(at),
        }
        return self.ev(NodeLaunched(**(values | fields)), at)

    def requested(self, job: str, owner: str, experiment: str | None, gpus: int = 1) -> Event[Any]:
        data = JobRequested(
            job_id=job,
            owner=owner,
            experiment=experiment,
            entrypoint=("python", "train.py"),
            worker=Bundle(gpus=gpus),
        )
        return self.ev(data, 0)

    def started(self, job: str, attempt: int, node: str, at: float) -> Event[Any]:
        return self.ev(
            JobStarted(
                job_id=job, attempt=attempt, submission_id=f"{job}-{attempt}", nodes=(node,)
            ),
            at,
        )

    def events(self) -> list[Event[Any]]:
        """The hand-computed story (seconds from t0; now is 1800):

        - spot-1 (2 GPUs, $0.72/h) lives 0-700, when it is preempted;
        - job-a (alice, exp-1, 1 GPU) runs on it 100-700, is resumed having lost 20 of the 60
          steps it ran, and its attempt 2 runs on od-1 760-1360;
        - job-b (bob, exp-2, 1 GPU) runs on spot-1 400-600;
        - od-1 (2 GPUs, on-demand, $1.80/h) lives 710-1600.
        """
        return [
            self.launched("spot-1", 0),
            self.requested("job-a", "alice", "exp-1"),
            self.ev(
                JobQueued(
                    job_id="job-a",
                    attempt=1,
                    bundles=(Bundle(gpus=1),),
                    capacity=CapacityClass.ANY,
                    priority=5,
                ),
                1,
            ),
            self.started("job-a", 1, "spot-1", 100),
            self.requested("job-b", "bob", "exp-2"),
            self.started("job-b", 1, "spot-1", 400),
            self.ev(JobSucceeded(job_id="job-b", attempt=1), 600),
            self.ev(NodeLost(node="spot-1", source=NoticeSource.LOCAL, lost_at=self.t(700)), 701),
            self.ev(
                JobInterrupted(
                    job_id="job-a", attempt=1, node="spot-1", cause=InterruptionCause.PREEMPTED
                ),
                702,
            ),
            self.ev(
                JobResumed(
                    job_id="job-a",
                    attempt=2,
                    from_step=40,
                    steps_lost=20,
                    capacity=CapacityClass.ON_DEMAND,
                ),
                705,
            ),
            self.launched("od-1", 710, spot=False),
            self.started("job-a", 2, "od-1", 760),
            self.ev(JobSucceeded(job_id="job-a", attempt=2), 1360),
            self.ev(
                NodeReleased(
                    node="od-1",
                    pool="gpu-on-demand",
                    reason=ReleaseReason.SCALED_DOWN,
                    released_at=self.t(1600),
                ),
                1600,
            ),
        ]


STORY = Story()
t, ev, launched, requested, started = (
    STORY.t,
    STORY.ev,
    STORY.launched,
    STORY.requested,
    STORY.started,
)
scenario_events = STORY.events


NOW_S = 1800


def figures(by: GroupBy, **kwargs: Any) -> dict[Any, tuple[Fraction, ...]]:
    """(cost, GPU-hours, waste, saving) per row key; idle rows keyed by their pool."""
    since = kwargs.pop("since", None)
    prices = kwargs.pop("prices", None)
    events = kwargs.pop("events", None) or scenario_events()
    result = ledger(events, now=t(NOW_S), since=since, prices=prices)
    return {
        (f"idle:{row.idle_pool}" if row.idle_pool else row.key): (
            row.cost_usd,
            row.gpu_hours,
            row.waste_usd,
            row.saving_vs_on_demand_usd,
        )
        for row in cost_rows(result, by, **kwargs)
    }


F = Fraction


def test_costs_by_job_match_the_hand_computation() -> None:
    """spot-1: 700 s = $0.14; job-a holds half of it for 600 s ($0.06, a third lost), job-b
    for 200 s ($0.02), the rest idle. od-1: 890 s = $0.445; job-a holds half for 600 s."""
    assert figures(GroupBy.JOB) == {
        "job-a": (F("0.21"), F(1, 3), F("0.02"), F("0.09")),
        "job-b": (F("0.02"), F(200, 3600), F(0), F("0.03")),
        "idle:gpu-on-demand": (F("0.295"), F(1180, 3600), F(0), F(0)),
        "idle:gpu-spot": (F("0.06"), F(600, 3600), F(0), F("0.09")),
    }


def test_rows_add_up_to_the_bill_in_every_view() -> None:
    for by in GroupBy:
        assert sum(cost for cost, *_ in figures(by).values()) == F("0.585"), by


def test_costs_by_experiment_owner_and_pool() -> None:
    assert {k: v[0] for k, v in figures(GroupBy.EXPERIMENT).items()} == {
        "exp-1": F("0.21"),
        "exp-2": F("0.02"),
        "idle:gpu-on-demand": F("0.295"),
        "idle:gpu-spot": F("0.06"),
    }
    assert {k: v[0] for k, v in figures(GroupBy.OWNER).items() if k} == {
        "alice": F("0.21"),
        "bob": F("0.02"),
        "idle:gpu-on-demand": F("0.295"),
        "idle:gpu-spot": F("0.06"),
    }
    assert figures(GroupBy.POOL) == {
        "gpu-on-demand": (F("0.445"), F(1780, 3600), F(0), F(0)),
        "gpu-spot": (F("0.14"), F(1400, 3600), F("0.02"), F("0.21")),
    }


def test_one_experiment_leaves_idle_capacity_out() -> None:
    assert figures(GroupBy.POOL, experiment="exp-1") == {
        "gpu-on-demand": (F("0.15"), F(600, 3600), F(0), F(0)),
        "gpu-spot": (F("0.06"), F(600, 3600), F("0.02"), F("0.09")),
    }


def test_since_bills_only_the_node_seconds_after_it() -> None:
    """From 1000 on only od-1 is up, to 1600: $0.30, job-a's half of 360 s is $0.09."""
    assert {k: v[0] for k, v in figures(GroupBy.JOB, since=t(1000)).items()} == {
        "job-a": F("0.09"),
        "idle:gpu-on-demand": F("0.21"),
    }


def test_repeated_events_change_nothing() -> None:
    twice = [e for e in scenario_events() for _ in range(2)]
    assert figures(GroupBy.JOB, events=twice) == figures(GroupBy.JOB)


def test_a_node_ends_at_the_first_of_its_release_and_its_loss() -> None:
    events = [
        launched("spot-1", 0),
        ev(NodeLost(node="spot-1", source=NoticeSource.K8S), 300),
        ev(
            NodeReleased(
                node="spot-1", pool="gpu-spot", reason=ReleaseReason.GONE, released_at=t(302)
            ),
            302,
        ),
    ]
    [bill] = ledger(events, now=t(NOW_S)).attribution.bills
    assert bill.node_seconds == 300


def test_a_running_node_and_attempt_are_billed_up_to_now() -> None:
    events = [launched("spot-1", 0), requested("job-a", "alice", None, gpus=2)]
    events.append(started("job-a", 1, "spot-1", 0))
    costs = job_costs(ledger(events, now=t(NOW_S)))
    assert costs["job-a"].cost_usd == F(NOW_S) * F("0.0002")
    assert costs["job-a"].waste_usd == 0


@pytest.mark.parametrize(
    ("tail", "waste"),
    [
        pytest.param([], F(1), id="lost-and-not-resumed-loses-everything"),
        pytest.param(
            [
                ev(
                    JobResumed(
                        job_id="job-a",
                        attempt=2,
                        from_step=0,
                        steps_lost=0,
                        capacity=CapacityClass.SPOT,
                    ),
                    701,
                )
            ],
            F(1),
            id="lost-before-its-first-step",
        ),
        pytest.param(
            [
                ev(
                    JobResumed(
                        job_id="job-a",
                        attempt=2,
                        from_step=90,
                        steps_lost=0,
                        capacity=CapacityClass.SPOT,
                    ),
                    701,
                )
            ],
            F(0),
            id="checkpointed-on-notice-loses-nothing",
        ),
    ],
)
def test_waste_of_a_lost_attempt(tail: list[Event[Any]], waste: Fraction) -> None:
    events = [
        launched("spot-1", 0),
        requested("job-a", "alice", None, gpus=2),
        started("job-a", 1, "spot-1", 100),
        ev(NodeLost(node="spot-1", source=NoticeSource.LOCAL, lost_at=t(700)), 700),
        *tail,
    ]
    spent = job_costs(ledger(events, now=t(NOW_S)))["job-a"]
    assert spent.cost_usd == F(600) * F("0.0002")
    assert spent.waste_usd == spent.cost_usd * waste


def test_a_job_that_succeeded_before_its_node_went_wasted_nothing() -> None:
    events = [
        launched("spot-1", 0),
        requested("job-a", "alice", None),
        started("job-a", 1, "spot-1", 0),
        ev(JobSucceeded(job_id="job-a", attempt=1), 500),
        ev(NodeLost(node="spot-1", source=NoticeSource.LOCAL, lost_at=t(500)), 500),
    ]
    assert job_costs(ledger(events, now=t(NOW_S)))["job-a"].waste_usd == 0


def test_an_attempt_ends_when_the_job_is_cancelled_or_the_next_attempt_starts() -> None:
    events = [
        launched("spot-1", 0),
        requested("job-a", "alice", None, gpus=2),
        started("job-a", 1, "spot-1", 0),
        started("job-a", 2, "spot-1", 100),
        ev(JobCancelled(job_id="job-a"), 300),
    ]
    result = ledger(events, now=t(NOW_S))
    held = {c.attempt: c.node_seconds for c in result.attribution.charges if not c.idle}
    assert held == {1: 100, 2: 200}


def test_an_override_reprices_a_pool_and_its_on_demand_baseline() -> None:
    prices = {
        "gpu-spot": PoolPrice(price_per_hour_usd=0.36),
        "gpu-on-demand": PoolPrice(price_per_hour_usd=3.6),
    }
    rows = figures(GroupBy.POOL, prices=prices)
    assert rows["gpu-spot"][0] == F("0.07")  # 700 s at $0.0001
    assert rows["gpu-spot"][3] == F("0.7") - F("0.07")  # against 700 s at $0.001
    assert rows["gpu-on-demand"][0] == F("0.89")


def test_a_machine_type_takes_both_prices_from_the_catalog() -> None:
    a100 = packaged_catalog().machine("a2-highgpu-1g")
    rows = figures(GroupBy.POOL, prices={"gpu-spot": PoolPrice(machine=a100)})
    spot = F(700, 3600)
    assert rows["gpu-spot"][0] == spot * F(repr(a100.spot_per_hour_usd))
    assert rows["gpu-spot"][3] == spot * (
        F(repr(a100.on_demand_per_hour_usd)) - F(repr(a100.spot_per_hour_usd))
    )


def test_a_spot_pool_without_an_on_demand_counterpart_saves_nothing_and_is_named() -> None:
    events = [launched("spot-1", 0, on_demand_pool=None, on_demand_price_per_hour_usd=None)]
    result = ledger(events, now=t(NOW_S))
    assert result.inputs.pools_without_baseline == {"gpu-spot"}
    [row] = cost_rows(result, GroupBy.POOL)
    assert row.saving_vs_on_demand_usd == 0


def test_json_rows_carry_the_key_and_the_four_figures() -> None:
    result = ledger(scenario_events(), now=t(NOW_S))
    rows = [row.as_json(GroupBy.JOB) for row in cost_rows(result, GroupBy.JOB)]
    assert rows[0] == {
        "job": "job-a",
        "idle": False,
        "cost_usd": 0.21,
        "gpu_hours": 0.333333,
        "waste_usd": 0.02,
        "saving_vs_on_demand_usd": 0.09,
    }
    assert rows[-1]["idle"] is True
    assert rows[-1]["pool"] == "gpu-spot"
    pools = [row.as_json(GroupBy.POOL) for row in cost_rows(result, GroupBy.POOL)]
    assert {p["pool"]: p["idle_usd"] for p in pools} == {"gpu-on-demand": 0.295, "gpu-spot": 0.06}


def resized(
    at: float, previous: int | None, workers: int, nodes: tuple[str, ...], *, step: int, lost: int
) -> Event[Any]:
    reason = "counted" if previous is None else ("grew" if workers > previous else "shrank")
    return ev(
        JobResized(
            job_id="job-e",
            attempt=1,
            workers=workers,
            previous=previous,
            min_workers=2,
            max_workers=3,
            reason=ResizeReason(reason),
            worker=Bundle(gpus=1),
            capacity=CapacityClass.SPOT,
            step=step,
            nodes=nodes,
            steps_lost=lost,
        ),
        at,
    )


def elastic_story(*tail: Event[Any]) -> list[Event[Any]]:
    """job-e (2..3 workers of 1 GPU) starts at 100, its driver on the head (no bill);
    its workers are on w-1..w-3 (1 GPU each, $0.72/h: $0.0002 a second, up 0-800 but
    w-3, lost at 400). Its group restarts on 2 at 410, back 10 of the 50 steps it ran."""
    return [
        *(launched(node, 0, gpus=1) for node in ("w-1", "w-2", "w-3")),
        ev(
            JobRequested(
                job_id="job-e",
                owner="erin",
                entrypoint=("python", "train_ddp.py"),
                worker=Bundle(gpus=1),
                num_workers=2,
                max_workers=3,
            ),
            0,
        ),
        started("job-e", 1, "head", 100),
        resized(110, None, 3, ("w-1", "w-2", "w-3"), step=0, lost=0),
        ev(NodeLost(node="w-3", source=NoticeSource.LOCAL, lost_at=t(400)), 401),
        resized(410, 3, 2, ("w-1", "w-2"), step=40, lost=10),
        *tail,
        *(
            ev(
                NodeReleased(
                    node=node, pool="gpu-spot", reason=ReleaseReason.SCALED_DOWN, released_at=t(800)
                ),
                800,
            )
            for node in ("w-1", "w-2")
        ),
    ]


def test_an_elastic_attempt_is_charged_for_every_worker_node_it_held() -> None:
    """Until 410 it holds w-1 and w-2 (310 s each) and w-3 up to its loss (300 s): $0.184,
    a fifth of it lost (10 of the 50 steps, redone by the whole group); then w-1 and w-2
    to its end at 710 (300 s each): $0.12. The rest of the $0.40 bill is idle."""
    events = elastic_story(ev(JobSucceeded(job_id="job-e", attempt=1), 710))
    rows = figures(GroupBy.JOB, events=events)
    cost, gpu_hours, waste, _ = rows["job-e"]
    assert (cost, waste) == (F("0.304"), F("0.0368"))
    assert gpu_hours == F(920 + 600, 3600)
    assert sum(row[0] for row in rows.values()) == F("0.40")


def test_an_elastic_attempt_that_was_lost_wastes_only_its_last_segment_s_lost_steps() -> None:
    """Lost at 710 and resumed from step 60 having lost 20: its last segment ran 40 to 80,
    half of it lost; the first segment's waste stays a fifth."""
    events = elastic_story(
        ev(
            JobInterrupted(
                job_id="job-e", attempt=1, node="head", cause=InterruptionCause.PREEMPTED
            ),
            710,
        ),
        ev(
            JobResumed(
                job_id="job-e",
                attempt=2,
                from_step=60,
                steps_lost=20,
                capacity=CapacityClass.SPOT,
            ),
            711,
        ),
    )
    _, _, waste, _ = figures(GroupBy.JOB, events=events)["job-e"]
    assert waste == F("0.0368") + F("0.12") / 2


def test_a_resize_without_the_nodes_charges_no_node_for_its_segment() -> None:
    """Ray's state API could not say where the workers went: that stretch is idle."""
    events = elastic_story(ev(JobSucceeded(job_id="job-e", attempt=1), 710))
    events = [
        e.model_copy(update={"data": e.data.model_copy(update={"nodes": ()})})
        if isinstance(e.data, JobResized) and e.data.previous == 3
        else e
        for e in events
    ]
    cost, *_ = figures(GroupBy.JOB, events=events)["job-e"]
    assert cost == F("0.184")
