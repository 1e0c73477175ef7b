"""Recordings written by `milonga record` read by the `mcap` package, the
reader that MCAP's own tools and Foxglove build on (docs/recording.md): a
finished file, and one whose recorder was killed with -9."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mcap.exceptions import EndOfFile
from mcap.reader import NonSeekingReader, make_reader

from conftest import REPO, Domain, next_sample, wait_for

# Built by `cargo test` (and `make test`) before the Python tests run.
MILONGA = Path(os.environ.get("MILONGA_BIN", REPO / "target" / "debug" / "milonga"))


def milonga(domain: Domain, *args: str) -> list[str]:
    if not MILONGA.exists():
        pytest.fail(f"{MILONGA} is missing: build it first (cargo build -p milonga-cli)")
    return [str(MILONGA), "--locator", domain.locator, *args]


def start(domain: Domain, *args: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        milonga(domain, *args),
        env=domain.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    domain.children.append(child)
    return child


def test_the_mcap_package_reads_a_recording(domain: Domain, tmp_path: Path) -> None:
    start(domain, "pub", "py/rec/a", "5", "--rate", "200")
    start(domain, "pub", "py/rec/b", '"text"', "--rate", "50")
    out = tmp_path / "run.mcap"
    done = domain.run(milonga(domain, "record", "py/rec/**", "--duration", "2", "-o", str(out)))
    assert done.returncode == 0, done.stderr
    with open(out, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary is not None and summary.statistics is not None
        seen: dict[str, list[bytes]] = {}
        encodings = set()
        publishers = set()
        for _schema, channel, message in reader.iter_messages():
            if channel.topic == "/milonga/events":
                assert channel.message_encoding == "json"
                continue
            encodings.add(channel.message_encoding)
            publishers.add(channel.metadata["milonga.publisher"])
            seen.setdefault(channel.topic, []).append(message.data)
            assert message.publish_time > 0 and message.log_time >= message.publish_time - 10**9
    assert encodings == {"cbor"}
    assert len(publishers) == 2 and all(len(p) == 32 for p in publishers)
    # The values as CBOR: 5 is one byte, "text" a text string of four.
    assert set(seen["py/rec/a"]) == {b"\x05"}
    assert set(seen["py/rec/b"]) == {b"\x64text"}
    assert len(seen["py/rec/a"]) > 150
    total = sum(len(v) for v in seen.values())
    assert summary.statistics.message_count >= total


def test_a_recording_cut_by_kill_9_reads_up_to_the_cut(domain: Domain, tmp_path: Path) -> None:
    start(domain, "pub", "py/kill/x", "[1, 2, 3]", "--rate", "500")
    out = tmp_path / "run.mcap"
    rec = start(domain, "record", "py/kill/x", "-o", str(out))
    # A chunk is written out every second.
    wait_for("two chunks on disk", lambda: out.exists() and out.stat().st_size > 8000, 20)
    rec.send_signal(signal.SIGKILL)
    rec.wait(timeout=10)
    n = 0
    with open(out, "rb") as f:
        with pytest.raises(EndOfFile):
            # In file order: a reader sorting by time would read to the
            # end before it yields anything.
            for _schema, channel, _message in NonSeekingReader(f).iter_messages(
                log_time_order=False
            ):
                if channel.topic == "py/kill/x":
                    n += 1
    assert n > 300


def test_a_replayed_sample_says_so_and_keeps_its_timestamp(
    domain: Domain, tmp_path: Path
) -> None:
    start(domain, "pub", "py/rp/x", "7", "--rate", "100")
    out = tmp_path / "run.mcap"
    done = domain.run(milonga(domain, "record", "py/rp/x", "--duration", "1", "-o", str(out)))
    assert done.returncode == 0, done.stderr
    for c in domain.children:
        c.kill()
    with open(out, "rb") as f:
        times = [m.publish_time for _s, ch, m in make_reader(f).iter_messages() if ch.topic == "py/rp/x"]
    node = domain.open("replay-reader")
    sub = node.subscribe("py/rp/x")
    replay = start(domain, "replay", "--speed", "max", "--wait-subscribers", "1", str(out))
    got = []
    while len(got) < len(times):
        s = next_sample(sub)
        got.append(s)
    assert replay.wait(timeout=30) == 0
    assert all(s.replayed and s.value == 7 for s in got)
    assert [s.timestamp_ns for s in got] == times


def test_open_recording_yields_the_events_a_live_subscription_yields(
    domain: Domain, tmp_path: Path
) -> None:
    import numpy as np

    import milonga

    out = tmp_path / "run.mcap"
    rec = start(domain, "record", "py/or/**", "--duration", "3", "-o", str(out))
    node = domain.open("arrays")
    pub = node.publisher("py/or/wave")
    wave = np.arange(20000, dtype=np.float64)
    wait_for("the recorder's subscription", lambda: pub.subscriber_count() > 0, 20)
    for i in range(5):
        pub.put(wave + i)
    node.close()
    assert rec.wait(timeout=30) == 0
    with milonga.open_recording(out) as r:
        events = list(r)
        assert r.complete and r.truncated is None
        assert r.metadata["expressions"] == "py/or/**"
        assert r.received_ns > 0
    samples = [e for e in events if isinstance(e, milonga.Sample)]
    assert [s.seq for s in samples] == [1, 2, 3, 4, 5]
    for i, s in enumerate(samples):
        assert isinstance(s.value, np.ndarray) and not s.value.flags.writeable
        assert np.array_equal(s.value, wave + i)
        assert not s.replayed
    kinds = {type(e).__name__ for e in events}
    assert "PublisherAlive" in kinds and "PublisherLost" in kinds, kinds


def test_open_recording_refuses_what_is_not_a_recording(tmp_path: Path) -> None:
    import milonga

    bad = tmp_path / "bad.mcap"
    bad.write_bytes(b"not MCAP at all")
    # At open, not at the first read (a program that opens a list of files
    # first learned only later which was not one).
    with pytest.raises(milonga.OpenError, match="not a readable MCAP"):
        milonga.open_recording(bad)
    (tmp_path / "empty.mcap").write_bytes(b"")
    for path in (tmp_path / "empty.mcap", tmp_path):
        with pytest.raises(milonga.OpenError, match="not a recording"):
            milonga.open_recording(path)
    with pytest.raises(milonga.OpenError, match="missing.mcap"):
        milonga.open_recording(tmp_path / "missing.mcap")
    # A file:/// node has none to read there: its subscription says so.
    with milonga.open(f"file://{tmp_path / 'missing.mcap'}") as node:
        with pytest.raises(milonga.OpenError, match="missing.mcap"):
            node.subscribe("**")


def test_put_with_a_source_timestamp_arrives_with_it(domain: Domain) -> None:
    import milonga

    node = domain.open("stamps")
    sub = node.subscribe("py/ts/**")
    for reliable in (False, True):
        key = f"py/ts/{reliable}"
        pub = node.publisher(key, milonga.PublisherQos(reliable=reliable))
        wait_for("the subscription", lambda: pub.subscriber_count() > 0)
        pub.put(1.5, timestamp_ns=1_700_000_000_123_456_789)
        s = next_sample(sub)
        assert (s.key, s.timestamp_ns, s.replayed) == (key, 1_700_000_000_123_456_789, False)


def test_the_file_locator_writes_and_reads_a_recording(tmp_path: Path) -> None:
    import numpy as np

    import milonga

    path = tmp_path / "run.mcap"
    with milonga.open(f"file://{path}", name="writer") as node:
        pub = node.publisher("py/file/wave")
        for i in range(3):
            pub.put(np.full(50000, float(i)))
        pub.put(7, timestamp_ns=123)
    # Read back as a live subscription would, then the iteration ends.
    with milonga.open(f"file://{path}", name="reader") as node:
        got = [e for e in node.subscribe("py/file/**") if isinstance(e, milonga.Sample)]
    assert [s.seq for s in got] == [1, 2, 3, 4]
    for i, s in enumerate(got[:3]):
        assert isinstance(s.value, np.ndarray) and float(s.value[0]) == float(i)
    assert (got[3].value, got[3].timestamp_ns) == (7, 123)
    # open_recording reads the same file.
    assert sum(isinstance(e, milonga.Sample) for e in milonga.open_recording(path)) == 4
    with pytest.raises(milonga.ConfigError, match="no such recording"):
        milonga.open(f"file://{tmp_path}/no/such/dir/x.mcap")


def test_a_recording_read_in_one_thread_is_closed_from_another(tmp_path: Path) -> None:
    """A reading thread and a closing one: the reader gets its events, then
    Closed, before the end (close does not wait for the whole file); its
    properties read meanwhile; never a RuntimeError of a borrow, nor a
    deadlock (a hang guard on the threads)."""
    import threading

    import milonga

    path = tmp_path / "run.mcap"
    with milonga.open(f"file://{path}", name="writer") as node:
        pub = node.publisher("py/two/x")
        for i in range(20000):
            pub.put(i)
    rec = milonga.open_recording(path)
    seen: list[object] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for e in rec:
                seen.append(e)
                # A slow reader (a millisecond an event, 20 s for the
                # file): close comes long before the end, whatever the
                # machine's speed.
                time.sleep(0.001)
        except milonga.Closed:
            pass
        except BaseException as e:  # noqa: BLE001 - kept for the assertion
            errors.append(e)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    wait_for("some events read", lambda: len(seen) > 100)
    assert isinstance(rec.complete, bool) and rec.received_ns > 0
    rec.close()
    t.join(timeout=10)
    assert not t.is_alive(), "the reader still reads after close"
    assert not errors, errors
    assert len(seen) < 20000, "close waited for the whole file to be read"
    with pytest.raises(milonga.Closed):
        next(rec)


def test_a_damaged_chunk_is_skipped_and_the_read_goes_on(tmp_path: Path) -> None:
    import numpy as np

    import milonga

    path = tmp_path / "run.mcap"
    with milonga.open(f"file://{path}", name="writer") as node:
        pub = node.publisher("py/dmg/wave")
        # 1.6 MB each: a chunk each (a chunk ends past 1 MiB).
        for i in range(6):
            pub.put(np.full(200_000, float(i)))
    data = bytearray(path.read_bytes())
    # The records after the 8-byte magic: opcode, u64 length, body; one
    # byte in the third chunk (opcode 6) changes.
    at, chunks = 8, []
    while at + 9 <= len(data):
        length = int.from_bytes(data[at + 1 : at + 9], "little")
        if data[at] == 6:
            chunks.append((at, length))
        at += 9 + length
    assert len(chunks) >= 5, chunks
    start, length = chunks[2]
    data[start + 9 + length - 5] ^= 0x10
    path.write_bytes(bytes(data))
    with milonga.open_recording(path) as r:
        events = list(r)
        assert not r.complete
        assert r.damage is not None, r.truncated
        assert r.truncated is None
    seqs = [e.seq for e in events if isinstance(e, milonga.Sample)]
    assert seqs[-1] == 6 and 1 in seqs and len(seqs) < 6, seqs
    # What the damaged chunk held is said lost where the gap shows.
    lost = [e for e in events if isinstance(e, milonga.Lost)]
    assert sum(e.count for e in lost) == 6 - len(seqs), lost
