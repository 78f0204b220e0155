"""The capacity search: the largest spread level meeting the goal, found by growing then bisecting."""

from __future__ import annotations

import time

from benchmarks.capacity import meets_goal, search


def row(sessions: int, p95: float, underruns: int = 0, errors: int = 0, arrivals: str = "spread") -> dict:
    return {
        "sessions": sessions,
        "arrivals": arrivals,
        "ttfa_from_speech_stopped_ms": {"p50": p95 / 2, "p95": p95},
        "underruns": {"total_with_100ms_buffer": underruns},
        "errors": {"count": errors},
        "turns_planned": 4 * sessions,
        "turns_completed": 4 * sessions,
    }


def server_holding(capacity: int, probed: list[int]):
    """A fake level runner: p95 stays at 40 ms up to `capacity` sessions, then climbs."""

    def run(count: int) -> dict:
        probed.append(count)
        return row(count, 40.0 if count <= capacity else 400.0)

    return run


def test_the_goal_needs_p95_within_twice_one_session_no_underrun_no_error_every_turn():
    assert meets_goal(row(64, 50.0), 25.0)
    assert not meets_goal(row(64, 51.0), 25.0)
    assert not meets_goal(row(64, 40.0, underruns=1), 25.0)
    assert not meets_goal(row(64, 40.0, errors=1), 25.0)
    short = row(64, 40.0)
    short["turns_completed"] -= 1
    assert not meets_goal(short, 25.0)


def test_search_grows_past_the_measured_levels_then_bisects_to_the_resolution():
    probed: list[int] = []
    found = search(server_holding(100, probed), [row(64, 40.0)], 25.0, time.monotonic() + 60, limit=160, resolution=8)
    assert probed[:2] == [96, 144]  # x1.5 from the largest pass, until a level fails
    assert found["sessions"] <= 100 < found["first_failing"] and found["first_failing"] - found["sessions"] <= 8
    assert found["complete"] and found["tried"]["64"] is True and found["tried"]["144"] is False


def test_search_starts_from_a_measured_failure_and_stops_at_the_limit():
    probed: list[int] = []
    found = search(server_holding(40, probed), [row(64, 900.0)], 25.0, time.monotonic() + 60, limit=160)
    assert probed[0] == 32 and found["sessions"] == 40 and found["first_failing"] == 48
    everything: list[int] = []
    capped = search(server_holding(1000, everything), [], 25.0, time.monotonic() + 60, limit=20)
    assert capped["sessions"] == 20 and max(everything) == 20 and capped["complete"]


def test_search_reports_what_it_found_when_the_deadline_passes():
    probed: list[int] = []
    found = search(server_holding(100, probed), [row(16, 40.0)], 25.0, time.monotonic() - 1, limit=160)
    assert probed == [] and found["sessions"] == 16 and not found["complete"]
