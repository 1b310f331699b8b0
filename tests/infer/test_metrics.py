"""summarize: τ, acceptance by draft position (every position up to the tree depth), the accepted-length
histogram and the time split, on hand-made results with hand-computed figures."""
import pytest

from toolkit.infer.metrics import summarize
from toolkit.infer.sequence import Result


def results() -> list[Result]:
    # accepted over both: [2, 0, 3, 1] -> 4 verify steps, 6 draft tokens accepted
    a = Result(list(range(7)), 3, [2, 0, 3], {"prefill": 0.5, "draft": 1.0, "verify": 2.0})
    b = Result([9, 9, 9], 1, [1], {"prefill": 0.25, "draft": 0.25, "verify": 0.5})
    return [a, b]


def test_tau_rates_and_histogram_cover_every_draft_position():
    s = summarize(results(), 6.0, positions=5)
    assert s["requests"] == 2 and s["tokens"] == 10 and s["verify_steps"] == 4
    assert s["tau"] == pytest.approx((6 + 4) / 4)  # 2.5
    # >= 1: 3 of 4 steps, >= 2: 2, >= 3: 1; positions 4 and 5 never accepted but still reported
    assert s["accept_rate_by_position"] == pytest.approx([0.75, 0.5, 0.25, 0.0, 0.0])
    assert s["accepted_length_histogram"] == [1, 1, 1, 1, 0, 0]


def test_without_positions_the_rates_stop_at_the_longest_accepted_length():
    s = summarize(results())
    assert s["accept_rate_by_position"] == pytest.approx([0.75, 0.5, 0.25])
    assert s["accepted_length_histogram"] == [1, 1, 1, 1]


def test_no_verify_step_reports_zeros_for_every_position():
    s = summarize([Result([4])], positions=3)
    assert s["tau"] == 0.0 and s["verify_steps"] == 0
    assert s["accept_rate_by_position"] == [0.0, 0.0, 0.0] and s["accepted_length_histogram"] == [0, 0, 0, 0]


def test_other_time_is_the_wall_time_the_phases_do_not_cover():
    s = summarize(results(), 6.0, positions=5)
    # prefill 0.75 + draft 1.25 + verify 2.5 = 4.5 of a 6.0 s wall
    assert s["seconds"] == {"prefill": 0.75, "draft": 1.25, "verify": 2.5, "other": 1.5}
    assert s["wall_seconds"] == 6.0 and s["tokens_per_second"] == pytest.approx(10 / 6.0)


def test_without_a_wall_time_other_is_unknown_not_zero():
    s = summarize(results())
    assert s["seconds"]["other"] is None
    assert s["wall_seconds"] == 4.5 and s["tokens_per_second"] == pytest.approx(10 / 4.5)


def test_a_wall_time_shorter_than_the_phases_is_refused():
    with pytest.raises(ValueError, match="wall time 4.0000s is shorter than the 4.5000s"):
        summarize(results(), 4.0)
