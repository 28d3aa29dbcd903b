"""The web page in a real headless Chromium (Debian's, driven by Playwright) against the
shared local stack: a job submitted with the CLI appears in the open list, its node is
killed, and its open page shows the lost attempt, the resume and the steps run again, as
they happen, with the figures `spotrain show` prints. A job is cancelled from its page.

Screenshots of each page go to the test's folder, and to `SPOTRAIN_UI_SCREENSHOTS` when it
names one (how `docs/images/ui-*.png` are made)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from shared.policy.cost import format_usd
from tests.browser import CHROMIUM_FLAGS, chromium
from tests.e2e.stack import spotrain

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]

WAIT_MS = 90_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


class Watched:
    """A page and what went wrong in it: a script error or a failed load fails the test."""

    def __init__(self, browser: Browser) -> None:
        self.page = browser.new_page(viewport={"width": 1300, "height": 1000})
        self.problems: list[str] = []
        self.page.on("pageerror", lambda error: self.problems.append(str(error)))
        self.page.on("console", self._console)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.problems.append(message.text)


def screenshot(page: Page, name: str, folder: Path) -> None:
    page.screenshot(path=str(folder / f"ui-{name}.png"), full_page=True)
    wanted = os.environ.get("SPOTRAIN_UI_SCREENSHOTS")
    if wanted:
        page.screenshot(path=str(Path(wanted) / f"ui-{name}.png"), full_page=True)


def chart_option(page: Page, element_id: str) -> dict[str, Any]:
    option: dict[str, Any] = page.evaluate(
        "(id) => echarts.getInstanceByDom(document.getElementById(id)).getOption()", element_id
    )
    return option


def wait_for_chart(page: Page, element_id: str, condition: str) -> dict[str, Any]:
    """The chart's option once `condition` (JS, of `option`) holds: charts are drawn again
    as the page's event stream says the job changed, never by a reload."""
    page.wait_for_function(
        """([id, condition]) => {
            const element = document.getElementById(id);
            // Drawn at least once: a chart set up but still fetching its option has none.
            if (!element || !Number(element.dataset.drawn || 0)) return false;
            const chart = echarts.getInstanceByDom(element);
            const option = chart && chart.getOption();
            if (!option || !option.series) return false;
            return new Function("option", "return " + condition)(option);
        }""",
        arg=[element_id, condition],
        timeout=WAIT_MS,
    )
    return chart_option(page, element_id)


def until_shown(page: Page, selector: str, text: str, env: dict[str, str], job_id: str) -> None:
    """Waits for the element to say `text`; fails with what `spotrain show` says then."""
    try:
        page.locator(selector, has_text=text).wait_for(timeout=WAIT_MS)
    except PlaywrightTimeoutError:
        shown = spotrain(env, "show", job_id).stdout
        on_page = page.locator(selector).all_inner_texts()
        pytest.fail(f"{selector} never said {text!r} (it says {on_page}); show says:\n{shown}")


def show_figures(env: dict[str, str], job_id: str) -> dict[str, str]:
    """The dollar figures `spotrain show` prints for the job."""
    shown = spotrain(env, "show", job_id)
    assert shown.returncode == 0, shown.stderr
    cost = re.search(
        r"cost so far: (\$[\d.,]+), ([\d.]+) GPU-hours, (\$[\d.,]+) of it", shown.stdout
    )
    saved = re.search(r"saved: (-?\$[\d.,]+) against on-demand", shown.stdout)
    assert cost is not None, shown.stdout
    assert saved is not None, shown.stdout
    return {
        "cost": cost.group(1),
        "gpu-hours": cost.group(2),
        "waste": cost.group(3),
        "saving": saved.group(1),
    }


def page_figures(page: Page) -> dict[str, str]:
    return {
        name: page.locator(f"#{name}").inner_text()
        for name in ("cost", "gpu-hours", "waste", "saving")
    }


def test_a_preempted_job_tells_its_story_on_the_page_as_it_happens(
    local_stack: dict[str, str], browser: Browser, tmp_path: Path
) -> None:
    opened = spotrain(local_stack, "ui", "--url")
    assert opened.returncode == 0, opened.stderr
    url = opened.stdout.strip()
    assert url == f"http://127.0.0.1:{local_stack['SPOTRAIN_LOCAL_UI_PORT']}"

    listing = Watched(browser)
    listing.page.goto(f"{url}/jobs?experiment=ui-story")
    submitted = spotrain(
        local_stack,
        *("submit", "train_digits.py", "--workdir", str(REPO / "examples")),
        *("--spot", "--experiment", "ui-story", "--"),
        *("--steps", "240", "--step-delay-s", "0.08", "--checkpoint-every", "20"),
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    # In the list already open, without a reload.
    row = listing.page.locator(f'tr[data-job="{job_id}"]')
    row.wait_for(timeout=WAIT_MS)

    watched = Watched(browser)
    page = watched.page
    page.goto(f"{url}/jobs/{job_id}")
    # Training reports: past its second checkpoint, its node is killed without notice.
    wait_for_chart(
        page, "metric", "option.series.length > 0 && option.series[0].data.some(p => p[0] >= 60)"
    )
    preempted = spotrain(local_stack, "preempt", "--job", job_id, "--notice", "0")
    assert preempted.returncode == 0, preempted.stderr

    # The open page tells it: the lost attempt, the next resumed from its checkpoint.
    page.locator('#attempts tr[data-attempt="2"]').wait_for(timeout=WAIT_MS)
    lost = page.locator('#attempts tr[data-attempt="1"]')
    assert lost.locator(".state").inner_text() == "lost"
    until_shown(page, "#state", "succeeded", local_stack, job_id)
    metric = wait_for_chart(
        page, "metric", "option.series.length == 2 && option.series[1].data.length > 0"
    )
    timeline = wait_for_chart(page, "timeline", "option.yAxis[0].data.length == 2")

    record = json.loads(spotrain(local_stack, "show", job_id, "--output", "json").stdout)
    first, second = record["attempts"]
    assert first["state"] == "lost"
    assert second["from_step"] > 0, "resumed from a checkpoint"
    marks = metric["series"][0]["markLine"]
    assert [line["xAxis"] for line in marks["data"]] == [first["step"], second["from_step"]]
    if first["step"] > second["from_step"]:
        [[start, end]] = metric["series"][0]["markArea"]["data"]
        assert (start["xAxis"], end["xAxis"]) == (second["from_step"], first["step"])
        assert start["name"] == f"{first['step'] - second['from_step']} steps lost"
    assert lost.locator(".lost").inner_text() == str(first["step"] - second["from_step"])
    assert [row for row in timeline["yAxis"][0]["data"]] == [
        f"#1 {first['nodes'][0]}",
        f"#2 {second['nodes'][0]}",
    ]
    # The list, still open, followed it to the end.
    row.locator(".state", has_text="succeeded").wait_for(timeout=WAIT_MS)

    # Its figures are `spotrain show`'s: read again until the attempt's record is closed
    # on both sides (the page reads the scaler's node sightings every few seconds).
    deadline = time.monotonic() + 30
    while (shown := show_figures(local_stack, job_id)) != (on_page := page_figures(page)):
        assert time.monotonic() < deadline, f"page {on_page} never matched show {shown}"
        time.sleep(1)
        page.reload()
    screenshot(page, "job", tmp_path)
    screenshot(listing.page, "jobs", tmp_path)

    experiments = Watched(browser)
    experiments.page.goto(f"{url}/experiments?experiment=ui-story")
    # As above: both settle once the scaler has seen the nodes past the attempts' ends.
    deadline = time.monotonic() + 30
    while True:
        costs = json.loads(spotrain(local_stack, "cost", "--by", "experiment", "--json").stdout)
        [row_figures] = [r for r in costs if r["experiment"] == "ui-story"]
        cell = experiments.page.locator('#experiment-costs tr[data-experiment="ui-story"] .cost')
        if cell.inner_text() == format_usd(row_figures["cost_usd"]):
            break
        assert time.monotonic() < deadline, f"{cell.inner_text()} never matched {row_figures}"
        time.sleep(1)
        experiments.page.reload()
    for chart in ("by-experiment", "spend"):
        wait_for_chart(experiments.page, chart, "option.series.length > 0")
    screenshot(experiments.page, "experiments", tmp_path)

    pools = Watched(browser)
    pools.page.goto(f"{url}/pools")
    pools.page.locator('#pools tr[data-pool="gpu-spot"]').wait_for(timeout=WAIT_MS)
    wait_for_chart(pools.page, "nodes", "option.series.length > 0")
    screenshot(pools.page, "pools", tmp_path)

    for each in (listing, watched, experiments, pools):
        assert each.problems == [], each.problems


def test_a_job_is_cancelled_from_its_page_and_bad_addresses_get_a_clear_page(
    local_stack: dict[str, str], browser: Browser
) -> None:
    url = f"http://127.0.0.1:{local_stack['SPOTRAIN_LOCAL_UI_PORT']}"
    submitted = spotrain(
        local_stack,
        *(
            "submit",
            "train_digits.py",
            "--workdir",
            str(REPO / "examples"),
            "--experiment",
            "ui-cancel",
        ),
        *("--", "--steps", "100000", "--step-delay-s", "0.05"),
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]

    watched = Watched(browser)
    page = watched.page
    page.on("dialog", lambda dialog: dialog.accept())
    # The page asks for its job again as its event stream opens: what changed between its
    # render and its stream is shown (a queued job may be cancelled within that second).
    summary = f"{url}/jobs/{job_id}/summary"
    with page.expect_request(lambda request: request.url == summary):
        page.goto(f"{url}/jobs/{job_id}")
    with page.expect_response(lambda response: response.url.endswith("/cancel")) as answer:
        page.locator("#cancel").click()
    assert answer.value.status == 200
    until_shown(page, "#state", "cancelled", local_stack, job_id)
    assert page.locator("#cancel").count() == 0, "a cancelled job offers no cancel"

    missing = page.goto(f"{url}/jobs/no-such-job")
    assert missing is not None
    assert missing.status == 404
    assert page.locator("h1").inner_text() == "no job no-such-job that you may see"
    malformed = page.goto(f"{url}/jobs?state=sideways")
    assert malformed is not None
    assert malformed.status == 400
    assert page.locator("h1").inner_text().startswith("state must be one of")
    assert "Traceback" not in page.content()
    assert all("status of 40" in p for p in watched.problems), watched.problems
