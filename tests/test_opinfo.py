"""PyTorch's own op corpus (OpInfo), float32, on cpu and ipu."""
import json
from pathlib import Path

import pytest

from opinfo_corpus import run_corpus

REPORT = Path(__file__).resolve().parent.parent / "build" / "reports" / "opinfo.json"


@pytest.mark.slow
def test_opinfo_pass_rate_is_at_least_90_percent():
    report = run_corpus()
    report.write(REPORT)
    data = json.loads(REPORT.read_text())
    print(f"\nOpInfo: {data['ops_passed']}/{data['ops_counted']} ops pass "
          f"({100 * data['pass_rate']:.1f}%); report in {REPORT}")
    assert data["ops_counted"] > 500
    assert data["pass_rate"] >= 0.90, json.dumps(data["failures"], indent=1)
