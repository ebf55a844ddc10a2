"""The errors of the handoff Agent (Go: worker.ErrStopping and its siblings)."""

from __future__ import annotations

__all__ = ["HandoffError", "Stopping", "Canceled", "HandedBack", "ClaimDone", "NotLeader", "ReturnClaimsError"]


class HandoffError(Exception):
    """The base of the Agent's errors."""


class Stopping(HandoffError):
    """Claiming has stopped: raised by ``receive()`` and ``begin()`` from stop-claiming on; the ``cause`` of a Receive it ended."""

    def __init__(self, message: str = "handoff: claiming has stopped") -> None:
        super().__init__(message)


class Canceled(HandoffError):
    """The ``cause`` of a Claim canceled by the sidecar's ``cancel`` fallback at the drain deadline."""

    def __init__(self, message: str = "handoff: in-flight work canceled at the drain deadline") -> None:
        super().__init__(message)


class HandedBack(HandoffError):
    """Raised by ``Claim.start()`` for an unstarted claim that stop-claiming took to hand back: drop the message."""

    def __init__(self, message: str = "handoff: unstarted claim handed back at stop-claiming") -> None:
        super().__init__(message)


class ClaimDone(HandoffError):
    """Raised by ``Claim.start()`` after ``Claim.done()``."""

    def __init__(self, message: str = "handoff: claim is done") -> None:
        super().__init__(message)


class NotLeader(HandoffError):
    """Raised by ``begin_leading()`` when this worker does not lead the Lease (or its term has run out)."""

    def __init__(self, message: str = "handoff: not the leader of this Lease") -> None:
        super().__init__(message)


class ReturnClaimsError(HandoffError):
    """Raise it from a ``return_claims`` callback that handed back some claims and failed on others.

    ``returned`` is how many it handed back; the message goes to the
    sidecar as ReturnResult ``error``. Any other exception counts as 0
    handed back.
    """

    def __init__(self, returned: int, message: str) -> None:
        super().__init__(message)
        self.returned = returned
