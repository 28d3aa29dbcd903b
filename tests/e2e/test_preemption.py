"""Preemption end to end on the local stack: real Ray nodes killed under a real training run,
the job resumed from its checkpoint on another node, its result the uninterrupted one's.
(A preemption with a notice is test_observability's run.)"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from shared.localstack.nodes import kill_node
from shared.localstack.processes import ProcessRecord
from tests.e2e.stack import CLI, demo_figures, spotrain

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_two_preemptions_in_a_row_with_the_checkpointer_down_during_the_second(
    local_stack: dict[str, str],
) -> None:
    home = Path(local_stack["SPOTRAIN_LOCAL_HOME"])
    lines: list[str] = []
    preempting, restarted = 0, False
    deadline = time.monotonic() + 300
    with subprocess.Popen(
        [*CLI, "demo", "--preemptions", "2"],
        env=local_stack,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as demo:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            assert time.monotonic() < deadline, "".join(lines)
            if "preempting" in line:
                preempting += 1
                if preempting == 2:
                    # The checkpointer crashes just before the second loss...
                    path = home / "run/checkpointer.json"
                    assert kill_node(ProcessRecord(**json.loads(path.read_text()))) > 0
            if preempting == 2 and "killed" in line and not restarted:
                # ...and comes back after it: the loss waits for it on the bus.
                time.sleep(1)
                up = spotrain(local_stack, "up")
                assert up.returncode == 0, up.stderr
                restarted = True
        returncode = demo.wait(timeout=30)
    output = "".join(lines)
    assert returncode == 0, output
    assert restarted, output
    figures = demo_figures(output)
    assert figures["preemptions"] == "2"
    assert figures["result_matches_uninterrupted"] == "true", output
    assert output.count("resumed as attempt") == 2, "each loss resumed exactly once"
