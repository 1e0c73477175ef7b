"""numpy arrays: RFC 8746 typed arrays, viewed without copies."""

from __future__ import annotations

import time

import numpy as np
import pytest

import milonga
from conftest import Domain, next_sample, wait_for


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize(
    "dtype", ["u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "f4", "f8"]
)
def test_every_element_type_round_trips(domain: Domain, dtype: str) -> None:
    a, b = domain.open("pub"), domain.open("sub")
    pub = a.publisher("np/x")
    sub = b.subscribe("np/x")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    sent = (np.arange(100) % 100).astype(dtype)
    pub.put(sent)
    got = next_sample(sub).value
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.dtype(dtype).newbyteorder("<")
    assert np.array_equal(got, sent)


def test_shapes_strides_and_byte_order_are_honoured(domain: Domain) -> None:
    a, b = domain.open("pub"), domain.open("sub")
    pub = a.publisher("np/y")
    sub = b.subscribe("np/y")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    image = np.arange(480 * 640, dtype=np.uint16).reshape(480, 640)
    cases = [
        image,  # 2-D: RFC 8746 tag 40, shape kept
        image[::2, ::3],  # not contiguous: sent as a contiguous copy
        np.arange(10, dtype=">f8"),  # big-endian: sent little-endian
        np.zeros((2, 0, 3)),  # empty
        np.array(3.5),  # 0-d: shape () kept (it came 1-D)
        np.float64(2.5),  # numpy scalars are numbers
        np.int32(-7),
    ]
    for c in cases:
        pub.put(c)
    for c in cases:
        got = next_sample(sub).value
        if isinstance(c, np.ndarray):
            assert got.shape == c.shape and np.array_equal(got, c)
        else:
            assert got == c and not isinstance(got, np.ndarray)
    with pytest.raises(milonga.EncodeError, match="complex"):
        pub.put(np.zeros(3, dtype=complex))
    with pytest.raises(milonga.EncodeError, match="bool"):
        pub.put(np.zeros(3, dtype=bool))


def test_a_received_array_views_the_message(domain: Domain) -> None:
    a, b = domain.open("pub"), domain.open("sub")
    pub = a.publisher("np/big")
    sub = b.subscribe("np/big")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    pub.put(np.ones(131072))  # 1 MiB of float64
    got = next_sample(sub).value
    assert not got.flags.owndata, "the array does not own its data"
    assert not got.flags.writeable, "the message is read-only"
    base = got
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, milonga.Buffer) and len(base) == 1 << 20
    with pytest.raises(ValueError):
        got[0] = 2.0


def test_in_process_the_receiver_sees_the_senders_memory(domain: Domain) -> None:
    """inproc hands the message itself to the subscriber: if neither side
    copied, the received array is the sent array's memory."""
    a = domain.open("pub", transport="inproc")
    b = domain.open("sub", transport="inproc")
    pub = a.publisher("np/same")
    sub = b.subscribe("np/same")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    sent = np.arange(1 << 17, dtype=np.float64)
    pub.put(sent)
    got = next_sample(sub).value
    assert np.shares_memory(got, sent), "sent and received without a copy"
    small = np.arange(4.0)  # under zero_copy_threshold_bytes: copied
    pub.put(small)
    assert not np.shares_memory(next_sample(sub).value, small)


def test_numpy_scalars_go_as_the_numbers_and_booleans_they_are(domain: Domain) -> None:
    # A numpy bool went as 1.0 (numpy's bool has no __index__, and fell
    # through to __float__), a complex scalar as its real part.
    a = domain.open("pub", transport="inproc")
    b = domain.open("sub", transport="inproc")
    pub = a.publisher("np/scalar")
    sub = b.subscribe("np/scalar")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    for sent, want in [
        (np.bool_(True), True),
        (np.float32(1.5) > 1, True),
        ({"ok": np.bool_(False)}, {"ok": False}),
        (np.int64(-3), -3),
        (np.uint8(200), 200),
        (np.float32(1.5), 1.5),
    ]:
        pub.put(sent)
        got = next_sample(sub).value
        assert got == want and type(got) is type(want), (sent, got)
    for bad in (np.complex128(1 + 2j), [np.complex64(1j)]):
        with pytest.raises(milonga.EncodeError, match="complex"):
            pub.put(bad)


def test_a_read_only_memoryview_is_sent_without_a_copy(domain: Domain) -> None:
    """Issue 10, finding 14: put(memoryview) of 1 MiB copied twice; a
    read-only view (of bytes, or a received value, so an echo) is now sent
    from its own memory, and a writable one is copied once."""
    a = domain.open("pub", transport="inproc")
    b = domain.open("sub", transport="inproc")
    pub = a.publisher("np/view")
    sub = b.subscribe("np/view")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    data = bytes(range(256)) * 4096  # 1 MiB
    pub.put(memoryview(data))
    got = next_sample(sub).value
    assert isinstance(got, memoryview) and got == data
    as_array = lambda m: np.frombuffer(m, dtype=np.uint8)  # noqa: E731
    assert np.shares_memory(as_array(got), as_array(data)), "sent without a copy"
    pub.put(got)  # an echo of what was received
    again = next_sample(sub).value
    assert np.shares_memory(as_array(again), as_array(data))
    # The caller's view released, and the bytes it viewed gone from the
    # caller: the message holds them still.
    view = memoryview(bytes(range(256)) * 4096)
    pub.put(view)
    view.release()
    del view
    assert next_sample(sub).value == data
    writable = bytearray(data)
    pub.put(memoryview(writable))
    copied = next_sample(sub).value
    assert copied == data
    assert not np.shares_memory(as_array(copied), as_array(writable)), "a writable view is copied"


def test_receiving_1_mib_arrays_costs_one_copy_each(domain: Domain) -> None:
    a, b = domain.open("pub"), domain.open("sub")
    pub = a.publisher("np/mem", milonga.PublisherQos(reliable=True))
    sub = b.subscribe("np/mem")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    payload = np.random.default_rng(1).random(131072)  # 1 MiB
    # Warm up allocators and sockets.
    for _ in range(5):
        pub.put(payload)
        next_sample(sub)
    n = 40
    before = rss_bytes()
    kept = []
    for _ in range(n):
        pub.put(payload)
        kept.append(next_sample(sub).value)
    grown = rss_bytes() - before
    assert all(np.array_equal(k, payload) for k in kept[:3])
    # Each kept array holds its message (1 MiB) and nothing more; a copy
    # would double it. Slack for the allocator and the publisher's side.
    assert grown < n * (1 << 20) * 1.5, f"{grown / n / (1 << 20):.2f} MiB per array"


def shm_mappings() -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of Milonga segments."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "/dev/shm/milonga-" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                spans.append((lo, hi))
    return spans


def test_a_large_array_arrives_as_a_view_of_the_publishers_shared_memory(
    domain: Domain,
) -> None:
    """docs/shared-memory.md: on one host, a large array is written once
    into the publisher's segment; the subscriber's numpy array is a
    read-only view of that segment, not a copy."""
    a, b = domain.open("pub"), domain.open("sub")
    pub = a.publisher("np/shm")
    sub = b.subscribe("np/shm")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    sent = np.arange(200_000, dtype="f8")  # 1.6 MB
    got = None

    def through_shared_memory() -> bool:
        # Its shared-memory marker follows the subscription: until the
        # publisher has it, arrays go through the socket.
        nonlocal got
        pub.put(sent)
        got = next_sample(sub).value
        return bool(a.stats()["shm_sent"] == 1)

    wait_for("an array through shared memory", through_shared_memory)
    assert isinstance(got, np.ndarray)
    assert np.array_equal(got, sent)
    assert not got.flags.writeable
    address = got.__array_interface__["data"][0]
    assert any(lo <= address < hi for lo, hi in shm_mappings()), (
        "the array's memory lies in a mapping of the publisher's segment"
    )
    assert b.stats()["shm_received"] == 1
    # An image (two dimensions) likewise: its elements travel as a 1-D
    # array's do, its shape with them.
    image = np.arange(300 * 400, dtype="<u2").reshape(300, 400)
    pub.put(image)
    got = next_sample(sub).value
    assert got.shape == (300, 400) and np.array_equal(got, image)
    address = got.__array_interface__["data"][0]
    assert any(lo <= address < hi for lo, hi in shm_mappings())
    assert b.stats()["shm_received"] == 2
