"""The egress proxy's own failures (error class `proxy`) say nothing of the receiver: they
neither open a hook's circuit nor close one."""

from __future__ import annotations

from efd.delivery.circuit import Change, Circuits
from efd.delivery.retry import AttemptResult, Verdict

URL = "https://hooks.example/x"


def proxy_failure() -> AttemptResult:
    return AttemptResult(URL, 0.0, 0.01, Verdict.RETRY, error_class="proxy")


def receiver_failure() -> AttemptResult:
    return AttemptResult(URL, 0.0, 0.01, Verdict.RETRY, status_code=503)


def test_proxy_failures_never_open_the_receivers_circuit() -> None:
    circuits = Circuits(threshold=2, probe_seconds=30)
    for delivery in range(1, 50):
        assert circuits.record(proxy_failure(), 100, delivery) is None
    assert not circuits.is_open(URL)
    assert circuits.record(receiver_failure(), 100, 50) is None
    assert circuits.record(receiver_failure(), 100, 51) is Change.OPENED


def test_a_probe_the_proxy_refused_told_nothing() -> None:
    circuits = Circuits(threshold=1, probe_seconds=30)
    assert circuits.record(receiver_failure(), 100, 1) is Change.OPENED
    assert circuits.take_probe(URL, 130)
    assert circuits.record(proxy_failure(), 130, 2) is None
    assert circuits.is_open(URL)
    assert circuits.take_probe(URL, 130)  # the probe may go again at once
