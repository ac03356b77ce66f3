"""The README's pipeline example runs as written, against a test node."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import REPO, BrokerProcess

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def test_readme_pipeline_runs(reader_broker: BrokerProcess, tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    found = re.search(r"<!-- pipeline-example -->\n```python\n(.*?)```", readme, re.S)
    assert found is not None, "the README lost its pipeline example"
    script = tmp_path / "pipeline.py"
    script.write_text(found.group(1))
    environment = dict(os.environ)
    environment.update(
        KRILL_BROKERS=reader_broker.bootstrap,
        KRILL_READER=reader_broker.reader_address,
        KRILL_CHECKPOINT=str(tmp_path / "ckpt"),
        PYTHONPATH=str(REPO),
    )
    run = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # Batch: seven customers; streaming: 10,000 orders in micro-batches of at most 4,000.
    assert len(re.findall(r"^\|customer-\d", run.stdout, re.M)) == 7  # show()'s table
    batches = re.findall(r"micro-batch \d+: (\d+) orders, value total (\d+)", run.stdout)
    assert [int(n) for n, _ in batches] == [4000, 4000, 2000]
    assert sum(int(total) for _, total in batches) == sum(i % 100 for i in range(10_000))
    # Back into Krill and out through a Kafka consumer: each customer's total, once.
    totals = dict(re.findall(r"total (customer-\d): (\d+)", run.stdout))
    assert totals == {f"customer-{c}": str(sum(i % 100 for i in range(c, 10_000, 7)))
                      for c in range(7)}
