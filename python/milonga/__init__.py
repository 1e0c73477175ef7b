"""Milonga: event and messaging middleware for control systems and data
acquisition, in Python.

>>> import milonga
>>> with milonga.open("milonga:///lab", name="ps-1") as node:   # doctest: +SKIP
...     current = node.publisher("sr/ps/1/current")
...     current.put(12.5)

The names are those of the Rust API (docs/python.md). Values are CBOR: None,
bool, int, float, str, bytes, list, tuple, dict, and numpy arrays (RFC 8746
typed arrays, received as read-only arrays viewing the message: no copy).
Every blocking call releases the GIL and is interrupted by Ctrl-C.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import json
import logging
import math
import operator
import os
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import _native
from ._native import (
    BrokerChanged,
    Buffer,
    DeadlineMissed,
    IncompatibleQos,
    Loan,
    Lost,
    PendingCall,
    PermissionDenied,
    Publisher,
    PublisherAlive,
    PublisherLost,
    Recording,
    Request,
    Sample,
    ServerReply,
    Service,
    SubscriptionLive,
    Tagged,
    UnknownEvent,
)
from .schema import as_dataclass, schema_of
from .errors import (
    AlreadyDeclared,
    BadReply,
    Closed,
    ConfigError,
    EncodeError,
    Error,
    InvalidKey,
    NoServer,
    OpenError,
    Rejected,
    RemoteError,
    ServerLost,
    CallDenied,
    ServiceError,
    TimeoutError,
    TooLarge,
    WouldBlock,
)

__all__ = [
    "open",
    "keygen",
    "open_recording",
    "Recording",
    "Node",
    "Publisher",
    "Loan",
    "Subscription",
    "Service",
    "PendingCall",
    "ServerReply",
    "Request",
    "PublisherQos",
    "SubscriberQos",
    "schema_of",
    "as_dataclass",
    "Sample",
    "Lost",
    "PublisherAlive",
    "PublisherLost",
    "DeadlineMissed",
    "SubscriptionLive",
    "IncompatibleQos",
    "PermissionDenied",
    "BrokerChanged",
    "UnknownEvent",
    "Event",
    "Tagged",
    "Buffer",
    "Error",
    "ConfigError",
    "OpenError",
    "InvalidKey",
    "AlreadyDeclared",
    "EncodeError",
    "TooLarge",
    "WouldBlock",
    "TimeoutError",
    "Closed",
    "NoServer",
    "RemoteError",
    "ServerLost",
    "CallDenied",
    "Rejected",
    "BadReply",
    "ServiceError",
    "__version__",
]

__version__: str = _native.version()

log = logging.getLogger("milonga")

#: What a subscription yields.
Event = (
    Sample
    | Lost
    | PublisherAlive
    | PublisherLost
    | DeadlineMissed
    | SubscriptionLive
    | IncompatibleQos
    | PermissionDenied
    | BrokerChanged
    | UnknownEvent
)


def _check_int(what: str, v: object, low: int, none_ok: bool = True) -> None:
    if v is None and none_ok:
        return
    # Any integer (numpy's too, through __index__), not a bool or a float.
    try:
        n = None if isinstance(v, bool) else operator.index(v)  # type: ignore[arg-type]
    except TypeError:
        n = None
    if n is None or n < low or n > 2**63 - 1:
        raise ConfigError(f"{what} must be an integer from {low} to 2**63-1, not {v!r}")


def _check_seconds(what: str, v: object, positive: bool = False) -> None:
    if v is None:
        return
    try:
        s = None if isinstance(v, (bool, str, bytes)) else float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        s = None
    if s is None or not math.isfinite(s) or s < 0 or (positive and s == 0):
        low = "> 0" if positive else ">= 0"
        raise ConfigError(f"{what} must be a number of seconds {low}, not {v!r}")


@dataclass(frozen=True)
class PublisherQos:
    """QoS of a publisher.

    reliable: never drop; ``put`` waits (at most ``put_timeout`` seconds, or
        forever if None) until the slowest subscriber has room.
    history: samples kept per key for late joiners and repair.
    compression: ``"none"``, ``"lz4"`` or ``"zstd"`` on the wire (None: the
        node's ``compression`` setting); ``compression_threshold`` bytes and
        ``compression_level`` as the keys of docs/config.md;
        ``compression_dictionary``: zstd with a dictionary per key, trained
        from its first 128 samples (docs/compression.md, "Dictionaries").
        With it, lower ``compression_threshold``: small samples are what it
        is for.
    schema: a dataclass (or TypedDict, or :func:`schema_of`'s dict): values
        are sent by position without field names (docs/schemas.md); ``put``
        takes an instance or a dict of its fields.
    """

    reliable: bool = False
    history: int = 0
    put_timeout: float | None = None
    compression: str | None = None
    compression_threshold: int | None = None
    compression_level: int | None = None
    schema: type | dict[str, Any] | None = None
    compression_dictionary: bool | None = None

    def __post_init__(self) -> None:
        # Said as a ConfigError (a milonga.Error and a ValueError) here,
        # rather than as an OverflowError or TypeError of the native call.
        _check_int("history", self.history, 0, none_ok=False)
        _check_seconds("put_timeout", self.put_timeout)
        if self.compression not in (None, "none", "lz4", "zstd"):
            raise ConfigError(
                f"compression {self.compression!r}: expected 'none', 'lz4' or 'zstd'"
            )
        _check_int("compression_threshold", self.compression_threshold, 0)
        if self.compression_level is not None:
            _check_int("compression_level", self.compression_level, -(2**31))


@dataclass(frozen=True)
class SubscriberQos:
    """QoS of a subscription (see docs/python.md and the Rust SubscriberQos).

    reliable: repair gaps from the publishers' history.
    last: on joining, first receive the last ``last`` samples kept per key.
    deadline: seconds; report ``DeadlineMissed`` for a key silent longer.
    queue_depth: messages queued per publisher before back-pressure/drops.
    keep_all / keep_last: read at once into an application queue that keeps
        every sample (at most ``keep_all``) or the newest ``keep_last`` per key.
    filter / abs_change / rel_change / min_period_ms: a filter the
        publishers apply before sending (docs/filters.md).
    schema: the reader's schema (a dataclass, TypedDict or
        :func:`schema_of`'s dict): schema'd samples arrive in its shape, and
        a publisher whose schema does not agree is reported as
        ``IncompatibleQos`` (policy ``"schema"``), its samples refused.
    """

    reliable: bool = False
    last: int = 0
    deadline: float | None = None
    queue_depth: int | None = None
    keep_all: int | None = None
    keep_last: int | None = None
    filter: str | None = None
    abs_change: float | None = None
    rel_change: float | None = None
    min_period_ms: int | None = None
    schema: type | dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _check_int("last", self.last, 0, none_ok=False)
        _check_seconds("deadline", self.deadline, positive=True)
        _check_int("queue_depth", self.queue_depth, 1)
        _check_int("keep_all", self.keep_all, 1)
        _check_int("keep_last", self.keep_last, 1)
        _check_int("min_period_ms", self.min_period_ms, 0)


# The threads `async for` receives in (a tenth of a second at a time), so
# that quiet subscriptions never hold the threads of the event loop's
# default executor, which `run_in_executor(None, ...)`, `to_thread` and
# name lookups wait for. At most this many subscriptions wait at once;
# more wait their turn (docs/python.md "asyncio").
FILL_THREADS = 128
_fills: ThreadPoolExecutor | None = None
_fills_lock = threading.Lock()


def _fill_executor() -> ThreadPoolExecutor:
    global _fills
    with _fills_lock:
        if _fills is None:
            _fills = ThreadPoolExecutor(FILL_THREADS, thread_name_prefix="milonga-async")
        return _fills


def _forget_fills() -> None:
    # A forked child has the pool's object but none of its threads: a
    # receive queued there would never run. It makes its own.
    global _fills, _fills_lock
    _fills = None
    _fills_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_fills)


def _not_async(what: str, f: Callable[..., object]) -> None:
    # Called from a thread with no event loop, a coroutine function returns
    # a coroutine nobody awaits: the callback would never run, the handler
    # would reply with what it cannot send.
    if inspect.iscoroutinefunction(f):
        raise TypeError(
            f"the {what} is a coroutine function (async def): it is called on a "
            "thread of its own, with no event loop; give a plain function (use "
            "`async for` on the subscription, or call_async, for asyncio)"
        )


def _retrieve(f: asyncio.Future[bool]) -> None:
    # A fill nobody awaits any more (its await was cancelled): its outcome
    # is taken here, so that asyncio does not log it as never retrieved.
    if not f.cancelled():
        f.exception()


class Subscription:
    """A subscription's events (samples and status events), in order.

    ``recv(timeout=None)`` returns the next one (``milonga.TimeoutError`` after
    ``timeout`` seconds), iteration blocks for each, ``async for`` awaits
    them. With a callback, events are delivered to it on a dispatcher
    thread instead; an exception raised by the callback is logged with the
    key and the subscription goes on.
    """

    def __init__(self, native: _native.Subscription) -> None:
        self._native = native
        # The native methods themselves: no Python frame per event.
        self.recv: Callable[..., Event] = native.recv
        self.try_recv: Callable[[], Event | None] = native.try_recv
        self._dispatcher: threading.Thread | None = None
        self._stopping = threading.Event()
        # The one receive in a worker thread that awaits share: a cancelled
        # await leaves it running, and the next await waits for it rather
        # than start another.
        self._filling: asyncio.Future[bool] | None = None
        self._node: object = None

    @property
    def key_expr(self) -> str:
        """The key expression."""
        return self._native.key_expr

    @property
    def lost(self) -> int:
        """Samples lost so far, over all publishers."""
        return self._native.lost

    @property
    def squashed(self) -> int:
        """Samples squashed by ``keep_last`` so far."""
        return self._native.squashed

    def lost_by_publisher(self) -> dict[str, int]:
        """Lost samples per publisher node id."""
        return dict(self._native.lost_by_publisher())

    def __iter__(self) -> Iterator[Event]:
        return iter(self._native)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        loop = asyncio.get_running_loop()
        while True:
            try:
                event = self._native.try_recv()
                if event is not None:
                    return event
                # Received in a worker thread into the subscription's own
                # stash: a cancelled await loses nothing. At most one at a
                # time: an await cancelled (a `wait_for` timeout) leaves it
                # running, and the next await waits for that one.
                fill = self._filling
                if fill is None or fill.done() or fill.get_loop() is not loop:
                    fill = loop.run_in_executor(_fill_executor(), self._native._fill, 0.1)
                    fill.add_done_callback(_retrieve)
                    self._filling = fill
                await asyncio.shield(fill)
            except Closed:
                raise StopAsyncIteration from None

    def _start(self, callback: Callable[[Event], object]) -> None:
        self._dispatcher = threading.Thread(
            target=self._dispatch,
            args=(callback,),
            name=f"milonga-sub {self.key_expr}",
            daemon=True,
        )
        self._dispatcher.start()

    def _dispatch(self, callback: Callable[[Event], object]) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                event = self._native.recv(0.1)
            except TimeoutError:
                continue
            except Closed:
                return
            except Exception:
                # An event that cannot be made a Python object (a map key
                # Python cannot hash, an array of more dimensions than
                # numpy takes): logged (the first ten, then every
                # 1,000th), and the subscription goes on.
                failures += 1
                if failures <= 10 or failures % 1000 == 0:
                    log.exception(
                        "subscription %r: an event could not be received (%d so far)",
                        self.key_expr,
                        failures,
                    )
                # An error that comes back at once (not a value's) must
                # not spin: a short pause before the next receive.
                self._stopping.wait(0.01)
                continue
            try:
                callback(event)
            except Exception:
                key = getattr(event, "key", self.key_expr)
                log.exception("the callback of subscription %r raised on key %r", self.key_expr, key)

    def close(self) -> None:
        """Ends the subscription (and its dispatcher thread, if any)."""
        self._stopping.set()
        t = self._dispatcher
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
        self._native.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<milonga.Subscription {self.key_expr!r}>"


_open_nodes: weakref.WeakSet[Node] = weakref.WeakSet()


class Node(_native.Node):
    """A node: this program's handle on a domain. Use :func:`open`."""

    def __init__(self, locator: str, name: str, config: dict[str, Any] | None = None) -> None:
        # (The native constructor opened the node.)
        self._services: list[Service] = []

    def publisher(self, key: str, qos: PublisherQos | None = None) -> Publisher:
        """Declares a publisher of ``key``."""
        q = qos or PublisherQos()
        return self._publisher(
            key,
            q.reliable,
            q.history,
            q.put_timeout,
            q.compression,
            q.compression_threshold,
            q.compression_level,
            _schema(q.schema),
            q.compression_dictionary,
        )

    def subscribe(
        self,
        expr: str,
        callback: Callable[[Event], object] | None = None,
        qos: SubscriberQos | None = None,
    ) -> Subscription:
        """Subscribes to the keys matching ``expr`` (``*`` one chunk, ``**``
        any number). With ``callback``, events go to it on a dispatcher thread."""
        if callback is not None:
            _not_async("callback", callback)
        q = qos or SubscriberQos()
        native = self._subscribe(
            expr,
            q.reliable,
            q.last,
            q.deadline,
            q.queue_depth,
            q.keep_all,
            q.keep_last,
            q.filter,
            q.abs_change,
            q.rel_change,
            q.min_period_ms,
            _schema(q.schema),
        )
        sub = Subscription(native)
        # Its node lives as long as it does (as a publisher's).
        sub._node = self
        if callback is not None:
            sub._start(callback)
        return sub

    def serve(
        self,
        key: str,
        handler: Callable[[Request], object],
        workers: int = 4,
        max_queued: int = 1024,
    ) -> Service:
        """Serves ``key``: ``handler(request)`` returns the reply value or
        raises (the caller gets ``RemoteError`` with the exception's class
        name as ``kind``; raise ``ServiceError(kind, message)`` to choose).

        The service lives as long as the node, or until ``close()`` on the
        returned :class:`Service`."""
        _not_async("handler", handler)
        _check_int("workers", workers, 1, none_ok=False)
        _check_int("max_queued", max_queued, 0, none_ok=False)
        service = self._serve(key, handler, workers, max_queued)
        self._services.append(service)
        return service

    def close(self) -> None:
        """Closes the node: its services are withdrawn, its publishers and
        subscriptions stop."""
        for service in self._services:
            service.close()
        super().close()

    async def call_async(self, key: str, value: Any, timeout: float = 5.0) -> Any:
        """Calls ``key`` without blocking the event loop."""
        pending = self.call_start(key, value, timeout)
        return await asyncio.get_running_loop().run_in_executor(None, pending.wait)

    def peers(self) -> list[dict[str, Any]]:
        """The nodes discovery knows (their announcements)."""
        peers: list[dict[str, Any]] = json.loads(self._peers_json())
        return peers

    def stats(self) -> dict[str, int]:
        """The node's counters (docs/guarantees.md names each)."""
        stats: dict[str, int] = json.loads(self._stats_json())
        return stats

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<milonga.Node {self.name!r} in {self.domain!r}>"


def _schema(s: type | dict[str, Any] | None) -> dict[str, Any] | None:
    """A QoS's schema as the native layer takes it."""
    if s is None or isinstance(s, dict):
        return s
    return schema_of(s)


def _default_name() -> str:
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{prog or 'python'}-{os.getpid()}"


def keygen(name: str, directory: str | os.PathLike[str]) -> tuple[str, str]:
    """Makes a CURVE identity for a node whose ``security`` is on
    (docs/security.md): ``directory/name.key`` (the secret key, mode 0600)
    and ``directory/name.pub`` (its public key, for other nodes' trust
    directories). Never overwrites a file. Returns both paths."""
    return _native.keygen(name, os.fspath(directory))


def open_recording(path: str | os.PathLike[str]) -> Recording:
    """Opens a recording made by ``milonga record`` (docs/recording.md).
    Iterating it yields its events in file order, as a live subscription
    yields them: ``Sample`` (arrays as read-only numpy views, as live),
    ``Lost``, ``PublisherAlive``, ``PublisherLost``, ...; ``received_ns``
    is when the last one yielded was received. A file cut short (a
    recorder killed) is read to its last complete record: ``complete`` is
    then false and, once read to its end, ``truncated`` says why. A
    damaged chunk is skipped and the read goes on: ``damage`` says why the
    first was. Raises ``OpenError`` for a missing file or one that is not
    a recording."""
    return Recording(os.fspath(path))


def open(locator: str, name: str | None = None, **config: Any) -> Node:
    """Opens a node on ``locator`` (``milonga:///lab``) named ``name``
    (default: the program's name and pid). ``config`` keys are those of
    docs/config.md (``transport="ipc"``, ``runtime_dir=...``,
    ``heartbeat_timeout_ms=500``, ...); the environment is read first
    (``MILONGA_LOCATOR``, when set, replaces ``locator``)."""
    node = Node(locator, name or _default_name(), config)
    _open_nodes.add(node)
    return node


@atexit.register
def _close_all() -> None:
    # Service workers need the interpreter: stop them before it goes.
    for node in list(_open_nodes):
        try:
            node.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass
