"""Loans (docs/python.md, "Loans"): a publisher's buffer filled in place
and published without a copy; refused while a view of it lives; handed
back when it could not be put."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

import milonga
from conftest import Domain, next_sample, wait_for
from test_numpy import shm_mappings


def test_a_loan_filled_through_numpy_arrives_as_the_array_written(domain: Domain) -> None:
    a, b = domain.open("pub"), domain.open("sub")
    pub = a.publisher("loan/image")
    sub = b.subscribe("loan/image")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    got = None
    frame = 0

    def one_frame() -> bool:
        # Until the subscription's shared-memory marker reaches the
        # publisher, loans go through the socket; either way they arrive.
        nonlocal got, frame
        frame += 1
        loan = pub.loan(480 * 640 * 2)
        assert loan.shared and len(loan) == 480 * 640 * 2
        image = np.frombuffer(loan, dtype="<u2").reshape(480, 640)
        assert image.flags.writeable
        image[:] = frame
        image[0, :3] = (1, 2, 3)
        del image
        pub.put_loan(loan, dtype="u2", shape=(480, 640))
        assert len(loan) == 0, "a put loan is the publisher's again"
        got = next_sample(sub).value
        assert isinstance(got, np.ndarray)
        assert got.shape == (480, 640) and got.dtype == np.dtype("<u2")
        assert got[0, :4].tolist() == [1, 2, 3, frame]
        assert int(got[1:, :].min()) == int(got[1:, :].max()) == frame
        return bool(a.stats()["shm_sent"] >= 1)

    wait_for("a loan through shared memory", one_frame)
    assert got is not None
    address = got.__array_interface__["data"][0]
    assert any(lo <= address < hi for lo, hi in shm_mappings()), (
        "the received array views the publisher's segment"
    )
    # As bytes, and as a flat typed array.
    loan = pub.loan(100_000)
    memoryview(loan)[:] = b"\x07" * 100_000
    pub.put_loan(loan)
    assert bytes(next_sample(sub).value) == b"\x07" * 100_000
    loan = pub.loan(8 * 20_000)
    np.frombuffer(loan, dtype="f8")[:] = np.arange(20_000)
    pub.put_loan(loan, dtype=np.float64)
    assert np.array_equal(next_sample(sub).value, np.arange(20_000, dtype="f8"))


def test_a_loan_is_refused_while_viewed_and_once_put(domain: Domain) -> None:
    a = domain.open("pub")
    pub = a.publisher("loan/views")
    loan = pub.loan(100_000)
    view = np.frombuffer(loan, dtype="u1")
    with pytest.raises(BufferError, match="still viewed"):
        pub.put_loan(loan)
    assert len(loan) == 100_000, "a refused loan stays the caller's"
    del view
    with memoryview(loan) as m:
        m[:2] = b"ok"
    with pytest.raises(milonga.EncodeError, match="little-endian"):
        pub.put_loan(loan, dtype=">f8")
    with pytest.raises(milonga.EncodeError):
        pub.put_loan(loan, dtype="u1", shape=(10, 10))
    with pytest.raises(ValueError, match="shape needs a dtype"):
        pub.put_loan(loan, shape=(100_000,))
    pub.put_loan(loan)
    with pytest.raises(BufferError, match="put already"):
        pub.put_loan(loan)
    with pytest.raises(BufferError, match="publisher's again"):
        memoryview(loan)
    assert repr(loan) == "Loan(put)"
    with pytest.raises(milonga.TooLarge, match="max_message_bytes"):
        pub.loan(1 << 40)


def test_a_loan_without_room_stays_the_callers_and_goes_out_later(domain: Domain) -> None:
    a = domain.open("pub", reliable_send_hwm=2)
    b = domain.open("sub", recv_hwm=2, shared_memory=False)
    pub = a.publisher("loan/full", milonga.PublisherQos(reliable=True))
    sub = b.subscribe("loan/full")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    # The subscriber reads nothing: loans go out until one times out.
    sent = 0
    while True:
        assert sent < 10_000, "the subscriber never filled up"
        loan = pub.loan(100_000)
        memoryview(loan)[:] = bytes([sent % 251]) * 100_000
        try:
            pub.put_loan(loan, timeout=0.05)
        except milonga.TimeoutError:
            # Full, or only slow on a busy machine: a second chance of a
            # second tells (the put without a timeout below must wait).
            try:
                pub.put_loan(loan, timeout=1.0)
            except milonga.TimeoutError:
                break
        sent += 1
    assert len(loan) == 100_000
    assert bytes(memoryview(loan)) == bytes([sent % 251]) * 100_000, "unchanged"

    # Interrupted while it waits (a signal handler that raises, as Ctrl-C's
    # does): the exception comes through, and the loan stays the caller's.
    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        started = time.monotonic()
        with pytest.raises(Interrupted):
            pub.put_loan(loan)  # no timeout: waits until interrupted
        assert time.monotonic() - started < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert len(loan) == 100_000 and repr(loan) == "Loan(100000 bytes, shared=True)"
    for i in range(sent):
        s = next_sample(sub)
        assert s.seq == i + 1
        assert bytes(s.value) == bytes([i % 251]) * 100_000
    pub.put_loan(loan, timeout=10)
    s = next_sample(sub)
    assert (s.seq, bytes(s.value)) == (sent + 1, bytes([sent % 251]) * 100_000)
    assert sub.lost == 0
