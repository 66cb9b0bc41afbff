"""`Claims`: the Ray-hosted buffer's segments held by writers on leases, on a clock of the test's."""

from __future__ import annotations

import pytest

from tfbuffers.remote.ray import claims as claims_lib
from tfbuffers.remote.ray.claims import Claims


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(claims_lib.time, "monotonic", lambda: now[0])
    return now


def test_a_lease_runs_out_without_renewals_and_a_late_writer_takes_its_segments_back(clock):
    claims = Claims(3, lease=2.0)
    assert claims.claim(2, "a") == [0, 1]
    clock[0] += 1.5
    assert claims.renew({"a": [0, 1]}) == []  # renewed: good for 2 s from now
    clock[0] += 1.9
    assert claims.holders() == {0: "a", 1: "a"}
    clock[0] += 0.2  # 2.1 s since the renewal
    assert claims.report() == {"claims": {}, "closed": 0, "dropped": 0, "lost_adds": 0, "expired": 1}
    claims.check("a", [0, 1])  # its next add: nobody took them, so they are its again
    assert claims.report() == {"claims": {0: "a", 1: "a"}, "closed": 0, "dropped": 0, "lost_adds": 0, "expired": 0}


def test_a_lapsed_claim_taken_by_another_writer_refuses_the_late_writer_s_adds(clock):
    claims = Claims(2, lease=2.0)
    claims.claim(1, "a")
    clock[0] += 3.0
    assert claims.claim(2, "b") == [0, 1]  # a's lease ran out: its segment is free
    with pytest.raises(ValueError) as raised:
        claims.check("a", [0])
    assert str(raised.value) == (
        "RayWriter a: its claim on segment(s) [0] expired (no renewal for writer_lease=2 s: its process was taken "
        "for dead) and segment(s) [0] went to another writer"
    )
    assert claims.renew({"a": [0], "b": [0, 1]}) == ["a"]
    assert claims.holders() == {0: "b", 1: "b"}


def test_a_renewal_that_arrives_after_the_release_takes_nothing_back(clock):
    # The heartbeat reads the claims, the writer closes, then the renewal reaches the actor.
    claims = Claims(2, lease=2.0)
    claims.claim(1, "a")
    claims.release("a", "closed")
    assert claims.renew({"a": [0]}) == ["a"]
    assert claims.holders() == {}
    assert claims.claim(2, "b") == [0, 1]
    assert claims.report()["closed"] == 1


def test_without_a_lease_claims_last_until_released(clock):
    claims = Claims(2, lease=None)
    claims.claim(2, "a")
    clock[0] += 1e6
    assert claims.holders() == {0: "a", 1: "a"}
    with pytest.raises(ValueError, match=r"^num_envs: expected at most the 0 free segment\(s\) of the buffer's 2"):
        claims.claim(1, "b")
    claims.release("a", "dropped")
    assert claims.report() == {"claims": {}, "closed": 0, "dropped": 1, "lost_adds": 0, "expired": 0}


def test_a_claim_takes_the_free_segments_first_in_the_order_given_and_returns_them_sorted(clock):
    claims = Claims(4, lease=None)
    assert claims.claim(1, "a", order=[2, 0, 3, 1]) == [2]
    assert claims.claim(2, "b", order=[2, 3, 1, 0]) == [1, 3]  # 2 is a's
    claims.release("a", "closed")
    assert claims.claim(2, "c", order=[1, 3, 0, 2]) == [0, 2]
