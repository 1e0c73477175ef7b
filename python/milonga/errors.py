"""Milonga's exceptions: one base, :class:`Error`, and a subclass per cause.

Where a built-in exception means the same thing, the subclass derives from it
too, so ``except TimeoutError`` and ``except KeyError`` work as expected.
"""

from __future__ import annotations

import builtins

__all__ = [
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
]


class Error(Exception):
    """The base of every error Milonga raises."""


class ConfigError(Error, ValueError):
    """A locator, configuration key or QoS value is not valid."""


class OpenError(Error, OSError):
    """A node or one of its sockets could not be opened."""


class InvalidKey(Error, builtins.KeyError):
    """A key or key expression breaks the key rules (docs/protocol.md)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AlreadyDeclared(Error):
    """The key is already published or served by this node."""


class EncodeError(Error, TypeError):
    """The value cannot be encoded."""


class TooLarge(Error, ValueError):
    """The message would exceed ``max_message_bytes``."""


class WouldBlock(Error):
    """A reliable publisher's subscriber has no room (``try_put``)."""


class TimeoutError(Error, builtins.TimeoutError):
    """Nothing came, or the call did not end, before the timeout."""

    key: str | None = None
    server: str | None = None


class Closed(Error):
    """The node, publisher, subscription or service is closed."""


class NoServer(Error):
    """No server of the key is known (raised at once, not after a timeout)."""

    key: str | None = None


class RemoteError(Error):
    """The handler raised an error: ``kind`` and ``remote_message`` say which."""

    server: str = ""
    kind: str = ""
    remote_message: str = ""


class ServerLost(Error):
    """The server's process went away while the call was in flight."""

    server: str = ""


class CallDenied(Error, PermissionError):
    """The server's node refused the caller: its security is on and the
    caller's key is not in its trust directory."""

    server: str = ""


class Rejected(Error):
    """The call was refused before a handler ran: ``kind`` is ``too_large``,
    ``overload``, ``bad_request`` or ``wrong_domain``."""

    server: str | None = None
    kind: str = ""


class BadReply(Error):
    """The reply arrived but cannot be used (it does not decode, or is
    larger than this node's ``max_message_bytes``)."""

    server: str = ""


class ServiceError(Error):
    """Raise this in a service handler to choose the error's ``kind``; any
    other exception is sent with its class name as the kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
