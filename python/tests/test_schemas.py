"""Schema'd publishers from Python (docs/schemas.md): dataclasses as
schemas, values sent by position and received as the maps (or dataclasses)
put, a reader's schema across versions, an incompatible writer refused."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

import milonga
from conftest import Domain, next_sample, wait_for


class Status(enum.Enum):
    TENTATIVE = 1
    CONFIRMED = 2


@dataclass
class Position:
    x: float
    y: float


@dataclass
class Track:
    track_id: int
    position: Position
    status: Status
    callsign: str
    samples: list[float]
    plots: list[Position]
    note: str | None = None


@dataclass
class TrackV2:
    """A later reader: `track_id` renamed `ident`, a field added, several
    left out."""

    ident: int = field(metadata={"aliases": ["track_id"]})
    position: Position
    quality: str = "unknown"


def track(i: int) -> Track:
    return Track(
        track_id=i,
        position=Position(1.5, float(i)),
        status=Status.CONFIRMED,
        callsign="AZA1234",
        samples=[0.25, 0.5],
        plots=[Position(0.0, 1.0)],
    )


def test_schema_of_a_dataclass() -> None:
    s = milonga.schema_of(Track)
    assert s["name"] == "Track"
    types = {f["name"]: f["type"] for f in s["fields"]}
    assert types["track_id"] == "i64"
    assert types["status"] == {"enum": ["TENTATIVE", "CONFIRMED"]}
    assert types["samples"] == {"array": "f64"}
    assert types["note"] == {"optional": "text"}
    assert s["fields"][-1]["default"] is None
    assert milonga.schema_of(TrackV2)["fields"][0]["aliases"] == ["track_id"]


def test_dataclass_values_arrive_as_maps_and_back_as_dataclasses(domain: Domain) -> None:
    a = domain.open("pub")
    b = domain.open("sub")
    pub = a.publisher(
        "radar/t", milonga.PublisherQos(reliable=True, history=2, schema=Track)
    )
    pub.put(track(1))
    sub = b.subscribe("radar/t", qos=milonga.SubscriberQos(last=1, reliable=True))
    for i in (1, 2):
        # The kept one first; the live one is put only then (put before
        # the join is answered, it would be the last one kept instead).
        s = next_sample(sub)
        assert s.value["callsign"] == "AZA1234"
        assert s.value["status"] == "CONFIRMED"
        assert isinstance(s.value["samples"], np.ndarray)
        assert milonga.as_dataclass(Track, s.value) == track(i)
        pub.put(track(i + 1))
    assert b.stats()["schemas_learned"] == 1
    # A value that does not fit is refused at the put, naming the field.
    with pytest.raises(milonga.EncodeError, match="callsign"):
        pub.put({**track(3).__dict__, "callsign": 5})
    with pytest.raises(milonga.ConfigError, match="invalid schema"):
        a.publisher("radar/bad", milonga.PublisherQos(schema={"name": "x", "fields": 3}))


def test_a_reader_schema_reads_an_older_writer_and_refuses_an_incompatible_one(
    domain: Domain,
) -> None:
    a = domain.open("pub")
    b = domain.open("sub")

    @dataclass
    class Narrowed:
        track_id: str
        position: Position

    old = a.publisher("radar/old", milonga.PublisherQos(reliable=True, schema=Track))
    bad = a.publisher("radar/bad", milonga.PublisherQos(reliable=True, schema=Narrowed))
    sub = b.subscribe("radar/**", qos=milonga.SubscriberQos(schema=TrackV2))
    wait_for(
        "the subscriptions",
        lambda: old.subscriber_count() == 1 and bad.subscriber_count() == 1,
    )
    bad.put(Narrowed("x", Position(0.0, 0.0)))
    old.put(track(9))
    samples: list[milonga.Sample] = []
    refused: list[milonga.IncompatibleQos] = []
    end = time.monotonic() + 10
    while not (samples and refused) and time.monotonic() < end:
        try:
            e = sub.recv(timeout=0.2)
        except milonga.TimeoutError:
            continue
        if isinstance(e, milonga.Sample):
            samples.append(e)
        elif isinstance(e, milonga.IncompatibleQos):
            refused.append(e)
    assert [s.key for s in samples] == ["radar/old"], "the incompatible writer's samples are refused"
    assert milonga.as_dataclass(TrackV2, samples[0].value) == TrackV2(
        9, Position(1.5, 9.0), "unknown"
    )
    assert refused and refused[0].policy == "schema" and refused[0].key == "radar/bad"
    assert "ident" in refused[0].detail and "track_id" in refused[0].detail
    wait_for("the refusal counted", lambda: b.stats()["samples_schema_refused"] == 1)


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass
class Alarm:
    level: Level
    history: list[Level]


def test_enum_members_go_by_name_and_an_integer_is_never_read_as_a_variant(
    domain: Domain,
) -> None:
    a = domain.open("pub")
    b = domain.open("sub")
    pub = a.publisher("lab/alarm", milonga.PublisherQos(reliable=True, schema=Alarm))
    sub = b.subscribe("lab/alarm")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    pub.put({"level": "HIGH", "history": ["LOW", "HIGH"]})
    s = next_sample(sub)
    assert milonga.as_dataclass(Alarm, s.value) == Alarm(Level.HIGH, [Level.LOW, Level.HIGH])
    # A dataclass field's member goes by its name; an IntEnum member
    # inside a list goes as its int, which an enum refuses (its index
    # would be another variant).
    with pytest.raises(milonga.EncodeError, match="history"):
        pub.put(Alarm(Level.HIGH, [Level.LOW]))
