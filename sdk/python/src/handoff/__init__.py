"""handoff: the app side of the handoff protocol, for Python queue workers.

The handoff sidecar stops a worker's claiming at shutdown, waits for the
work in flight to drain, hands back what is left at the deadline, and tells
the worker which Leases it leads. This package is the worker's end of that
protocol (docs/protocol.md), with the semantics of the Go package
``worker``:

.. code-block:: python

    import handoff

    with handoff.Agent(return_claims=queue.make_claimed_visible) as agent:
        while True:
            try:
                r = agent.receive()           # handoff.Stopping once claiming has stopped
            except handoff.Stopping:
                break
            with r:
                msg = queue.poll(stop=r.ended)  # a wait cut off at stop-claiming
                if msg is None:
                    continue
                claim = r.hold()             # in flight from here, even after stop-claiming
            with claim:                      # claim.done() at the end of the block
                handle(msg, claim.canceled)
                queue.ack(msg)

The asyncio twin is :mod:`handoff.aio`; wire messages, signing and checking
calls are in :mod:`handoff.protocol`; a fake clock and a signed client for
tests in :mod:`handoff.testing`.
"""

from ._agent import Agent, Claim, LeaderWork, Receive
from ._clock import Clock, RealClock, Timer
from ._config import ConfigError, shards_from_env
from ._core import Term
from ._endpoint import EndpointError
from ._errors import Canceled, ClaimDone, HandedBack, HandoffError, NotLeader, ReturnClaimsError, Stopping
from ._wire import DrainStatus, ReturnResult

# The release version: "0.0.0" in the tree; the release builds the
# packages at its own (hack/release.sh sdk stamps this line).
__version__ = "0.0.0"

__all__ = [
    "Agent",
    "Receive",
    "Claim",
    "LeaderWork",
    "Term",
    "DrainStatus",
    "ReturnResult",
    "HandoffError",
    "Stopping",
    "Canceled",
    "HandedBack",
    "ClaimDone",
    "NotLeader",
    "ReturnClaimsError",
    "ConfigError",
    "EndpointError",
    "Clock",
    "RealClock",
    "Timer",
    "shards_from_env",
]
