"""The golden /jupyter-gpu/api/metrics reply, which the TypeScript tests read too, is what the server makes."""

from __future__ import annotations

import json

from golden_metrics import GOLDEN, PAYLOAD, build_payload


def test_the_server_reply_matches_the_golden_fixture_byte_for_byte_in_json() -> None:
    # On a deliberate API change: python tests/fixtures/golden_metrics.py --write, and update the TS tests.
    assert build_payload() == json.loads(GOLDEN.read_text())


def test_the_golden_fixture_covers_what_the_panel_shows() -> None:
    payload = json.loads(GOLDEN.read_text())
    assert len(payload["latest"]["devices"]) == 8
    assert [s["timestamp"] for s in payload["history"]] == [1_790_000_002.0, 1_790_000_003.0]
    assert payload["latest"]["timestamp"] == 1_790_000_004.0
    summaries = [h["summary"] for h in payload["holders"]]
    assert "Untitled3.ipynb holds 20.5 GiB on GPU 4, idle for 3 h" in summaries
    assert f"experiments/{PAYLOAD}.ipynb holds 7.5 GiB on GPU 4, busy for 2 min" in summaries
    assert f"{PAYLOAD} holds 2.0 GiB on GPU 7" in summaries
    assert "hunter2" not in GOLDEN.read_text()  # other users' command lines never leave the server
    assert {a["code"] for a in payload["alerts"]} == {"MEMORY_NEARLY_FULL", "THROTTLED", "GPU_IDLE_DURING_CELL"}
