"""The trace replay: small hand-made traces whose cost, waits and launches are known."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from services.scaler.model import PoolSpec, ScalerConfig
from services.scaler.policy.decision import PLACED_GRACE_S
from services.scaler.simulation.cluster import ClusterState, Decision
from services.scaler.simulation.replay import (
    Simulation,
    load_pools,
    main,
    make_policy,
    simulate,
    split_bundles,
)
from services.scaler.simulation.traces import TraceJob, read_trace
from shared.events.types import CapacityClass

CONFIG = ScalerConfig(budget_per_hour_usd=1e6, idle_timeout_s=300.0, max_launch_per_pool=100)


def pool(name: str = "spot", gpus: int = 2, price: float = 1.0, **kw: object) -> PoolSpec:
    fields: dict[str, object] = {
        "name": name,
        "capacity": CapacityClass.SPOT,
        "gpus": gpus,
        "cpus": float(max(gpus, 1)),
        "price_per_hour_usd": price,
        "boot_time_s": 60.0,
        "max_nodes": 100,
    } | kw
    return PoolSpec.model_validate(fields, strict=False)


def test_one_job_costs_boot_run_and_idle_timeout() -> None:
    """A 1-hour 2-GPU job on a $1/h 2-GPU node: it waits the boot, and the node is paid
    from launch to release, an idle timeout after the job ends."""
    result = simulate([TraceJob("a", 0.0, 2, 3600.0)], "spotrain", [pool()], CONFIG)
    assert result.wait_p95_s == 60.0
    assert result.cost_usd == pytest.approx((60 + 3600 + 300) / 3600, abs=0.01)
    assert result.nodes_launched == 1
    assert result.jobs_unfinished == 0


def test_lower_bound_prices_every_gpu_second_at_the_cheapest_gpu() -> None:
    """The bound is the trace's GPU-seconds at the lowest price per GPU of any pool."""
    pools = [pool("big", gpus=8, price=4.0), pool("small", gpus=1, price=1.0)]
    trace = [TraceJob("a", 0.0, 2, 3600.0), TraceJob("b", 0.0, 1, 7200.0)]
    result = simulate(trace, "spotrain", pools, CONFIG)
    assert result.lower_bound_usd == pytest.approx((2 * 3600 + 7200) * 0.5 / 3600)
    assert result.cost_over_lower_bound == pytest.approx(
        result.cost_usd / result.lower_bound_usd, rel=1e-3
    )


class _Staggered:
    """A fake policy: one node at the first decision, a second 100 s later."""

    name = "staggered"
    watches_queue = True
    told_advice = False
    places_jobs = False
    interval_s = 10.0

    def __init__(self) -> None:
        self.launched = 0

    def decide(self, state: ClusterState) -> Decision:
        if self.launched == 0 or (self.launched == 1 and state.now_s >= 100):
            self.launched += 1
            return Decision(launch={"spot8": 1})
        return Decision()


def test_gang_job_waits_for_all_its_nodes() -> None:
    """A 16-GPU job on 8-GPU nodes is two bundles; it starts only when the second is ready."""
    sim = Simulation(
        [TraceJob("g", 0.0, 16, 600.0)],
        _Staggered(),
        [pool("spot8", gpus=8)],
        CONFIG,
        interval_s=50.0,
    )
    sim.run()
    result = sim.result(0.0)
    assert result.wait_p50_s == 100.0 + 60.0
    assert result.jobs_unfinished == 0


def test_jobs_bigger_than_a_node_split_into_node_sized_bundles() -> None:
    pools = [pool("spot8", gpus=8), pool("spot1", gpus=1)]
    assert split_bundles(4, pools) == (4,)
    assert split_bundles(16, pools) == (8, 8)
    assert split_bundles(12, pools) == (8, 4)


def test_a_job_queued_after_a_launch_grows_the_pool_at_the_next_decision() -> None:
    """The policy sees each node's age afresh at every tick, as the live scaler does: the
    first node (launched at 0 s, still settling when the second job queues at 5 s) holds
    back only demand queued before it was launched, so the second job's node is launched at
    the next decision (on the 10 s grid asked for here), not when the settle time is over
    (20 s) nor when the first node is ready (60 s)."""
    trace = [TraceJob("a", 0.0, 2, 3600.0), TraceJob("b", 5.0, 2, 3600.0)]
    result = simulate(trace, "spotrain", [pool()], CONFIG, interval_s=10.0)
    assert result.nodes_launched == 2
    assert result.wait_max_s == 10.0 + 60.0 - 5.0


def test_each_policy_decides_as_often_as_it_does_live() -> None:
    """A job that needs a node waits for the next decision, then the boot (60 s): spotrain's
    scaler decides every pass (`pass_interval_s`), Ray's autoscaler every 5 s, the naive
    one at the cluster autoscaler's 10 s scan; one grid for all when asked."""
    trace = [TraceJob("a", 1.0, 2, 3600.0)]
    fast = CONFIG.model_copy(update={"pass_interval_s": 3.0})
    waits = {
        name: simulate(trace, name, [pool()], fast).wait_max_s - 60.0 + 1.0
        for name in ("spotrain", "ray", "naive")
    }
    assert waits == {"spotrain": 3.0, "ray": 5.0, "naive": 10.0}
    assert simulate(trace, "spotrain", [pool()], fast, interval_s=10.0).wait_max_s == 69.0


def test_preempted_spot_node_requeues_its_job() -> None:
    """A lost spot node kills its job, which queues again, starts over and finishes; the
    work done before the loss is counted as lost."""
    result = simulate(
        [TraceJob("a", 0.0, 2, 3600.0)],
        "spotrain",
        [pool()],
        CONFIG,
        seed=1,
        preemption_rate_per_hour=2.0,
        preemption_group=1,
    )
    assert result.preempted_nodes >= 1
    assert result.requeued_attempts >= 1
    assert result.lost_gpu_hours > 0
    assert result.jobs_unfinished == 0
    assert result.nodes_launched == result.preempted_nodes + 1


def test_naive_launches_more_nodes_than_spotrain() -> None:
    """Ten 1-GPU jobs a second apart: ours packs them onto few 8-GPU nodes, naive launches
    one node per job."""
    trace = [TraceJob(str(i), float(i), 1, 1800.0) for i in range(10)]
    pools = [pool("spot8", gpus=8)]
    ours = simulate(trace, "spotrain", pools, CONFIG)
    naive = simulate(trace, "naive", pools, CONFIG)
    assert naive.nodes_launched == 10
    assert ours.nodes_launched == 2
    assert ours.cost_usd < naive.cost_usd


def test_static_keeps_a_pool_sized_to_mean_demand() -> None:
    """Mean demand of 8 GPUs over the span → one 8-GPU node, launched once, never released."""
    trace = [TraceJob("a", 0.0, 8, 3600.0), TraceJob("b", 3600.0, 8, 3600.0)]
    result = simulate(trace, "static", [pool("spot8", gpus=8)], CONFIG)
    assert result.nodes_launched == 1
    assert result.jobs_unfinished == 0


def test_a_job_no_pool_can_ever_hold_is_counted_not_replayed() -> None:
    result = simulate([TraceJob("huge", 0.0, 64, 60.0)], "spotrain", [pool(max_nodes=2)], CONFIG)
    assert result.jobs_unschedulable == 1
    assert result.jobs == 0


def test_reads_the_philly_format_with_header_and_limit(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "#job id,arrival time (sec),topology,shape,size,duration (sec)\n"
        "1,5.0,CLOS,2,2,60.0\n0,0.0,CLOS,1,1,30.0\n2,9.0,CLOS,1,1,10.0\n"
    )
    assert read_trace(trace) == [
        TraceJob("0", 0.0, 1, 30.0),
        TraceJob("1", 5.0, 2, 60.0),
        TraceJob("2", 9.0, 1, 10.0),
    ]
    assert len(read_trace(trace, limit=2)) == 2


def test_default_pools_load_with_a_scaler_table() -> None:
    pools, config = load_pools()
    assert {p.capacity for p in pools} == {CapacityClass.SPOT, CapacityClass.ON_DEMAND}
    assert config.idle_timeout_s == 300.0


def test_json_output_has_one_object_per_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("0,0.0,CLOS,1,1,600.0\n1,30.0,CLOS,4,4,600.0\n")
    assert main(["--trace", str(trace), "--policy", "spotrain,naive", "--json"]) == 0
    objects = json.loads(capsys.readouterr().out)
    assert [o["policy"] for o in objects] == ["spotrain", "naive"]
    for key in (
        "cost_usd",
        "cost_over_lower_bound",
        "utilisation",
        "wait_p50_s",
        "wait_p95_s",
        "nodes_launched",
        "saving_vs_on_demand",
    ):
        assert key in objects[0]


def test_spotrains_jobs_start_where_its_plan_placed_them() -> None:
    """The 8-GPU node the plan launched for the 8-GPU job is up before the 1-GPU node: the
    1-GPU job queued first does not take it (as Ray's placement would, leaving the big job
    to wait another boot); each job starts on the node launched for it, at the first
    decision after that node is up."""
    pools = [pool("one", gpus=1, boot_time_s=120.0), pool("eight", gpus=8, price=8.0)]
    trace = [TraceJob("small", 0.0, 1, 3600.0), TraceJob("big", 1.0, 8, 3600.0)]
    sim = Simulation(trace, make_policy("spotrain", trace, pools, CONFIG), pools, CONFIG)
    sim.run()
    assert sim.result(0.0).nodes_launched == 2
    small, big = sim.jobs
    every_s = CONFIG.pass_interval_s
    assert big.started_s == math.ceil((1.0 + 60.0) / every_s) * every_s
    assert small.started_s == math.ceil(120.0 / every_s) * every_s


def test_a_node_spotrain_placed_on_is_kept_a_while_however_short_its_learnt_timeout() -> None:
    """Sixty 10 s jobs far apart teach the keep-alive that work never comes back (a learnt
    timeout of 0 s). Then job x runs 10 s and job y comes 30 s after x was placed: y takes x's
    node, kept for `PLACED_GRACE_S` after the placement as the live scaler keeps it (work
    placed there shows in Ray only seconds after), rather than waiting for a new one."""
    learning = [TraceJob(f"l{i}", 1000.0 * i, 2, 10.0) for i in range(60)]
    x_s = 1000.0 * 60
    trace = [*learning, TraceJob("x", x_s, 2, 10.0), TraceJob("y", x_s + 60.0 + 30.0, 2, 10.0)]
    sim = Simulation(trace, make_policy("spotrain", trace, [pool()], CONFIG), [pool()], CONFIG)
    sim.run()
    assert sim.idle_timeouts == {"spot": 0.0}
    assert sim.result(0.0).nodes_launched == 61
    x, y = sim.jobs[-2:]
    assert x.started_s is not None
    assert y.started_s is not None
    assert y.started_s - x.started_s < PLACED_GRACE_S
    assert y.waited_s <= CONFIG.pass_interval_s
