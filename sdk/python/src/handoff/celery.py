"""handoff for Celery workers: stop consuming at stop-claiming, drain, hand back at the deadline.

.. code-block:: python

    from celery import Celery
    import handoff.celery

    app = Celery("orders", broker="amqp://...")
    app.conf.task_acks_late = True                 # a running task's message stays unacked,
    app.conf.task_reject_on_worker_lost = True     # so it can be handed back
    integration = handoff.celery.install(app)      # serves $HANDOFF_APP_URL in the worker

``install`` adds two bootsteps to the app, so ``celery worker`` serves the
app side of the handoff protocol from its main process (the one that holds
the broker connection); prefork and threads pools (solo, eventlet and
gevent are warned about):

- **Every task message the worker receives is a claim**, held unstarted at
  Celery's ``task_received`` signal (prefetched messages, ETA and
  rate-limited tasks included) and started when the pool starts it: for
  ``prefork`` and ``solo`` when Celery hands the request to the pool (prefork
  only does so when a process is free), for ``threads`` when a pool thread
  picks it up. A claim ends once the task is over *and* its message is
  acknowledged or rejected.
- **stop-claiming** is answered at once; on the consumer's loop the task
  consumer then drops every queue (``Consumer.cancel_by_queue``:
  ``basic.cancel``, and no later ``consume()``, after a reconnection say,
  subscribes again), and the messages received and not started are handed
  back (``Request.reject(requeue=True)``), so another worker gets them
  within milliseconds; they are dropped here when their turn comes.
- **drain** counts the tasks running; drained when they are over.
- **return** (the drain deadline) rejects with ``requeue`` every message the
  worker has not acknowledged: tasks still running (with ``acks_late``) and
  anything received since. A task that completes after its message went back
  does not acknowledge it again (Celery marks the request acknowledged at the
  reject), but it did run: the task must be idempotent, as with any
  ``acks_late`` task.
- **leader work**: :meth:`Handoff.lead` and :meth:`Handoff.periodic` run
  functions in the worker's main process only while it leads a Lease, with
  the term's fencing token.

Every acknowledgement and rejection the worker makes for its task messages
runs on the consumer's event loop, woken through a pipe: an ack from a
``threads`` pool thread, or a hand-back from the Agent's threads, never
touches the broker connection from another thread, and never waits for the
loop's next poll timeout. One whose channel has closed (a reconnection) is
not sent: the broker has the message back.

Importing this module imports Celery; ``import handoff`` does not.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, TypeVar

from celery import bootsteps, signals
from celery.worker import state as _worker_state

from ._agent import Agent, Claim, LeaderWork, Receive
from ._errors import HandedBack, NotLeader, ReturnClaimsError, Stopping
from ._wire import DrainStatus

__all__ = ["Handoff", "install", "HandBackHook", "LeaderJob"]

_log = logging.getLogger("handoff.celery")

#: Called on the consumer's event loop once messages went back to the broker,
#: with why (``"stop-claiming"``: received and not started; ``"deadline"``:
#: not acknowledged at the drain deadline), their task ids, and when the
#: first was sent (:func:`time.time`).
HandBackHook = Callable[[str, Sequence[str], float], None]
#: Leader work: runs while the term lasts and returns once ``work.stopping`` is set.
LeaderJob = Callable[[LeaderWork], None]
F = TypeVar("F", bound=Callable[..., Any])

_APP_ATTR = "_handoff_integration"


def install(
    app: Any,
    *,
    url: Optional[str] = None,
    token: Optional[str] = None,
    token_file: Optional[str] = None,
    insecure_no_token: bool = False,
    lease_duration: Optional[float] = None,
    on_hand_back: Optional[HandBackHook] = None,
    loop_timeout: float = 10.0,
    logger: Optional[logging.Logger] = None,
) -> "Handoff":
    """Add handoff to a Celery app: its workers serve the app API (``$HANDOFF_APP_URL``, or ``url``).

    Call it once per app, where the app is defined (the worker imports it).
    ``token``, ``token_file``, ``insecure_no_token`` and ``lease_duration`` are
    :class:`handoff.Agent`'s. ``on_hand_back`` is told of every hand-back
    (:data:`HandBackHook`). ``loop_timeout`` bounds each wait of the Agent's
    threads for the consumer's event loop (a hand-back, the return): past
    it the call fails and the SDK's fallback takes over. Returns the
    :class:`Handoff`; its :attr:`~Handoff.agent` exists in the worker
    process once the worker starts.
    """
    if getattr(app, _APP_ATTR, None) is not None:
        raise RuntimeError("handoff.celery: install was called for this app already")
    h = Handoff(
        app,
        url=url,
        token=token,
        token_file=token_file,
        insecure_no_token=insecure_no_token,
        lease_duration=lease_duration,
        on_hand_back=on_hand_back,
        loop_timeout=loop_timeout,
        logger=logger,
    )
    setattr(app, _APP_ATTR, h)
    app.steps["worker"].add(_WorkerStep)
    app.steps["consumer"].add(_ConsumerStep)
    return h


class _Skip(Exception):
    """Raised by the accept gate of a thread pool: the request was handed back, do not run it."""


class _Held:
    """One task message the worker holds, from ``task_received`` until the task is over and the message settled."""

    __slots__ = ("req", "message", "claim", "dispatched", "applied", "over", "settled", "gone", "__weakref__")

    def __init__(self, req: Any) -> None:
        self.req = req
        self.message: Any = req._message
        self.claim: Optional[Claim] = None
        self.dispatched = False  # handed to the pool
        self.applied = False  # the pool took it (apply_async)
        self.over = False  # the task is over (result, failure, dropped)
        self.settled = False  # the message is acknowledged or rejected
        self.gone = False  # forgotten: claim done, or the connection it came on is gone

    @property
    def task_id(self) -> str:
        return str(self.req.id)


class _Loop:
    """Runs functions on the consumer's event loop (kombu's Hub), from any thread.

    A function posted is queued, and a byte written to a pipe the Hub reads
    wakes the loop at once. Without a Hub (a transport with no asynchronous
    support), Celery's pending operations run them, at the loop's next turn.
    """

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._ops: Deque[Callable[[], None]] = deque()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._hub: Any = None
        self._consumer: Any = None
        self._woken = False
        self.thread: Optional[int] = None

    def register(self, consumer: Any, hub: Any) -> None:
        """Called on the loop (at every start of the consumer's loop: a reconnection resets the Hub)."""
        self._consumer = consumer
        self._hub = hub
        self.thread = threading.get_ident()
        if hub is not None:
            hub.add_reader(self._rfd, self.run)
        self.run()

    def unregister(self) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            try:
                hub.remove_reader(self._rfd)
            except Exception:  # the Hub closed already
                pass

    def post(self, fn: Callable[[], None]) -> None:
        with self._mu:
            self._ops.append(fn)
            wake = not self._woken
            self._woken = True
            hub, consumer = self._hub, self._consumer
        if not wake:
            return
        if hub is not None:
            try:
                os.write(self._wfd, b"\0")
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise
        elif consumer is not None:
            consumer.call_soon(self.run)

    def call(self, fn: Callable[[], None], timeout: float) -> bool:
        """Run fn on the loop and wait up to timeout seconds for it to have run; True if it has."""
        done = threading.Event()

        def op() -> None:
            try:
                fn()
            finally:
                done.set()

        if self.thread == threading.get_ident():
            op()
            return True
        self.post(op)
        return done.wait(timeout)

    def run(self, *_: Any) -> None:
        """Run every function posted, on the loop."""
        try:
            while os.read(self._rfd, 4096):
                pass
        except OSError:
            pass
        while True:
            with self._mu:
                if not self._ops:
                    self._woken = False
                    return
                fn = self._ops.popleft()
            try:
                fn()
            except Exception:
                _log.exception("handoff: an operation on the consumer's loop failed")


class Handoff:
    """The handoff integration of one Celery app (see the module's doc). Made by :func:`install`."""

    def __init__(
        self,
        app: Any,
        *,
        url: Optional[str],
        token: Optional[str],
        token_file: Optional[str],
        insecure_no_token: bool,
        lease_duration: Optional[float],
        on_hand_back: Optional[HandBackHook],
        loop_timeout: float,
        logger: Optional[logging.Logger],
    ) -> None:
        self.app = app
        self._url = url
        self._agent_opts: Dict[str, Any] = dict(
            token=token, token_file=token_file, insecure_no_token=insecure_no_token, lease_duration=lease_duration
        )
        self._on_hand_back = on_hand_back
        self._loop_timeout = loop_timeout
        self._log = logger or _log
        #: The Agent, in the worker's main process once the worker has started; else None.
        self.agent: Optional[Agent] = None
        self._jobs: List[Callable[[Agent, threading.Event], None]] = []
        self._rt: Optional[_Runtime] = None

    # Leader work.

    def lead(self, lease: str, job: LeaderJob) -> None:
        """Run ``job(work)`` in a thread of the worker's main process for each term as leader of ``lease``.

        ``work`` is a :class:`handoff.LeaderWork`: ``work.fencing_token`` for
        the writes the job makes, ``work.stopping`` set when the term ends
        (revoked, replaced, or run out on the worker's clock). The job must
        return once it is set: the sidecar releases the Lease, and the next
        leader begins, only after that. Register before the worker starts.
        """

        def run(agent: Agent, stop: threading.Event) -> None:
            while not stop.is_set():
                changed = agent.leadership_changed()
                try:
                    with agent.begin_leading(lease) as work:
                        self._log.info("handoff: leading %s (fencing token %d)", lease, work.fencing_token)
                        try:
                            job(work)
                        except Exception:
                            self._log.exception("handoff: leader work of %s failed", lease)
                            work.stopping.wait(1.0)
                        self._log.info("handoff: leader work of %s over", lease)
                except NotLeader:
                    changed.wait(1.0)

        self._jobs.append(run)

    def periodic(self, lease: str, every: float) -> Callable[[F], F]:
        """A decorator: call ``fn(work)`` every ``every`` seconds while leading ``lease`` (beat-like, fenced).

        The first call is at the start of each term; a call under way when
        the term ends finishes before the Lease is released (the revoke
        waits for it). Pass ``work.fencing_token`` to what the call writes
        to (or to the tasks it sends), so a store refuses an older leader.
        """

        def deco(fn: F) -> F:
            def job(work: LeaderWork) -> None:
                while not work.stopping.is_set():
                    fn(work)
                    work.stopping.wait(every)

            self.lead(lease, job)
            return fn

        return deco

    # The worker's side.

    def _worker_init(self, w: Any) -> "_Runtime":
        rt = _Runtime(self, w)
        self._rt = rt
        self.agent = rt.agent
        return rt


class _CeleryAgent(Agent):
    """The Agent, told at stop-claiming (also the return's) to stop the consumer."""

    def __init__(self, on_stop: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._on_stop = on_stop

    def stop_claiming(self) -> DrainStatus:
        st = super().stop_claiming()
        self._on_stop()
        return st


class _Runtime:
    """The integration in one worker process: the Agent, the claims, the gates."""

    def __init__(self, h: Handoff, w: Any) -> None:
        from celery.concurrency.thread import TaskPool as ThreadPool

        self.h = h
        self.w = w
        self.log = h._log
        self.loop = _Loop()
        self.agent = _CeleryAgent(
            self._stop_soon, return_claims=self._return_claims, hand_back=self._hand_back, logger=logging.getLogger("handoff"), **h._agent_opts
        )
        self._mu = threading.Lock()
        self._held: Dict[int, _Held] = {}  # id(request) -> held, until the claim is done
        self._receive: Optional[Receive] = None
        self._last_receive: Optional[Receive] = None
        self._consumer: Any = None
        self._stopping = False  # the consumer must stop consuming
        self._canceled = False  # the task consumer of this connection is canceled
        self._stop = threading.Event()  # the worker is shutting down
        pool_cls = w.pool_cls
        # Where a claim starts: when a pool thread picks the request up
        # (threads: requests queue in the executor), else when Celery hands
        # it to the pool (prefork: only once a process is free; solo: runs it).
        self.accept_gate = isinstance(pool_cls, type) and issubclass(pool_cls, ThreadPool)
        # Wrapped before the Pool step binds w.process_task to it; the
        # semaphore path (_process_task_sem) looks it up at each call.
        orig = w._process_task
        w._process_task = lambda req: self._process_task(orig, req)
        conf = h.app.conf
        if getattr(pool_cls, "__module__", "").endswith((".solo", ".eventlet", ".gevent")):
            self.log.warning(
                "handoff: the %s pool is not supported: solo runs each task on the consumer's event loop "
                "(stop-claiming and hand-backs wait for it), eventlet and gevent have no event loop to wake "
                "(they wait up to 2s); use prefork or threads",
                pool_cls.__module__.rsplit(".", 1)[-1],
            )
        if not conf.task_acks_late:
            self.log.warning(
                "handoff: task_acks_late is off: a task's message is acknowledged when the task starts, "
                "so a task still running at the drain deadline cannot be handed back (set task_acks_late=True)"
            )

    # Serving.

    def start(self) -> None:
        self.agent.start(self.h._url)
        self.log.info("handoff: serving %s (instance %s)", self.agent.url, self.agent.instance)
        for job in self.h._jobs:
            threading.Thread(target=job, args=(self.agent, self._stop), name="handoff-leader", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.agent.close()

    # The consumer.

    def consumer_started(self, c: Any) -> None:
        """The task consumer exists and is about to consume (on the loop thread, before the loop)."""
        self._consumer = c
        self._canceled = False
        try:
            self._receive = self.agent.receive()
            self._last_receive = self._receive
        except Stopping:
            # Reconnected after stop-claiming: subscribe to nothing (the
            # event loop's consume() finds no queue).
            self._receive = None
            self._stopping = True
            self._stop_consuming()

    def register(self, c: Any, hub: Any) -> None:
        self.loop.register(c, hub)

    def consumer_stopped(self, c: Any) -> None:
        """The consumer stops: a reconnection (its channel is gone) or the worker's shutdown (the connection stays until the end)."""
        self.loop.run()
        self.loop.unregister()
        r, self._receive = self._receive, None
        if r is not None:
            r.end()
        with self._mu:
            held = list(self._held.values())
        for hd in held:
            if not _channel_open(hd.message):
                hd.settled = True  # unacknowledged on a channel that closed: the broker has it back
            if not hd.dispatched and not hd.applied:
                hd.over = True  # Celery drops the requests it had not handed to the pool (Consumer.on_close)
            self._maybe_done(hd)

    def _stop_soon(self) -> None:
        with self._mu:
            if self._stopping:
                return
            self._stopping = True
        self.loop.post(self._stop_consuming)

    def _stop_consuming(self) -> None:
        """On the loop: cancel the task consumer, so the broker sends nothing more; then end the wait."""
        if self._canceled:
            return
        self._canceled = True
        c = self._consumer
        tc = getattr(c, "task_consumer", None) if c is not None else None
        if tc is not None:
            t0 = time.monotonic()
            for q in list(tc.queues):
                try:
                    # basic.cancel, waiting for cancel-ok (deliveries before it are
                    # handled); the queue is dropped, so no later consume() takes it up.
                    tc.cancel_by_queue(q.name)
                except Exception as e:
                    self.log.warning("handoff: canceling the task consumer of %s failed: %s", q.name, e)
            self.log.info("handoff: stopped consuming (%.1f ms)", (time.monotonic() - t0) * 1000)
        r, self._receive = self._receive, None
        if r is not None:
            r.end()

    # Claims.

    def received(self, req: Any) -> None:
        """task_received, on the loop: hold the message unstarted."""
        hd = _Held(req)
        on_ack, on_reject = req._on_ack, req._on_reject
        if on_ack is None or on_reject is None:
            return
        # Celery acknowledges from the pool's result handler or a pool
        # thread, through consumer.call_soon; settle on the loop instead,
        # at once, and know when the message is settled.
        def ack(logger: Any, errors: Any, multiple: bool = False) -> None:
            def op() -> None:
                hd.message.ack_log_error(logger, errors, multiple=multiple)

            self.loop.post(lambda: self._settle(hd, op))

        def reject(logger: Any, errors: Any, requeue: bool = False) -> None:
            def op() -> None:
                hd.message.reject_log_error(logger, errors, requeue=requeue)

            self.loop.post(lambda: self._settle(hd, op))

        req._on_ack, req._on_reject = ack, reject
        r = self._receive or self._last_receive
        if r is None:  # not consuming through this integration (cannot happen once started)
            return
        req._handoff_held = hd
        with self._mu:
            self._held[id(req)] = hd
        hd.claim = r.hold_unstarted(hd)  # taken at once if claiming has stopped

    def _lookup(self, req: Any) -> Optional[_Held]:
        hd = getattr(req, "_handoff_held", None)
        return hd if isinstance(hd, _Held) else None

    def _settle(self, hd: _Held, op: Callable[[], None]) -> None:
        try:
            if not hd.settled and _channel_open(hd.message):
                op()
            # else: settled already, or its channel closed and the broker has it back
        finally:
            hd.settled = True
            self._maybe_done(hd)

    def _over(self, hd: _Held) -> None:
        hd.over = True
        self._maybe_done(hd)

    def _maybe_done(self, hd: _Held) -> None:
        with self._mu:
            if hd.gone or not (hd.over and hd.settled):
                return
            hd.gone = True
            if self._held.get(id(hd.req)) is hd:
                del self._held[id(hd.req)]
        if hd.claim is not None:
            hd.claim.done()

    def _drop(self, hd: _Held) -> None:
        """A request handed back reached the pool's door: it does not run."""
        _worker_state.task_ready(hd.req)
        self._over(hd)

    def _start(self, hd: Optional[_Held]) -> bool:
        """Start the claim; False if it was handed back."""
        if hd is None or hd.claim is None:
            return True
        try:
            hd.claim.start()
        except HandedBack:
            return False
        return True

    def _process_task(self, orig: Callable[[Any], None], req: Any) -> None:
        """Celery hands a request to the pool (Worker._process_task), on the loop."""
        hd = self._lookup(req)
        if hd is None:
            orig(req)
            return
        if not self.accept_gate and not self._start(hd):
            self._drop(hd)
            w = self.w
            if getattr(w.process_task, "__func__", None) is type(w)._process_task_sem:
                w._quick_release()  # pass the pool's slot on, as Celery does for a revoked request
            return
        hd.dispatched = True
        try:
            orig(req)
        finally:
            if not hd.applied:  # revoked or expired: Celery acknowledged it and it never runs
                self._over(hd)

    def apply_async(self, orig: Callable[..., Any], target: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """The pool's apply_async: the task is over at its result, its failure, or its hard time limit."""
        accept = options.get("accept_callback")
        req = getattr(accept, "__self__", None)
        found = self._lookup(req) if req is not None else None
        if found is None:
            return orig(target, args, kwargs, **options)
        hd: _Held = found
        hd.applied = True

        def over_after(fn: Optional[Callable[..., Any]]) -> Optional[Callable[..., Any]]:
            if fn is None:
                return None
            f: Callable[..., Any] = fn

            def cb(*a: Any, **kw: Any) -> Any:
                try:
                    return f(*a, **kw)
                finally:
                    self._over(hd)

            return cb

        on_timeout: Optional[Callable[..., Any]] = options.get("timeout_callback")
        options["callback"] = over_after(options.get("callback"))
        options["error_callback"] = over_after(options.get("error_callback"))
        if on_timeout is not None:
            t: Callable[..., Any] = on_timeout

            def timeout_cb(soft: bool, timeout: Any) -> Any:
                try:
                    return t(soft, timeout)
                finally:
                    if not soft:
                        self._over(hd)

            options["timeout_callback"] = timeout_cb
        if self.accept_gate and accept is not None:
            a0: Callable[..., Any] = accept

            def gate(*a: Any, **kw: Any) -> Any:
                if not self._start(hd):  # in the pool's thread, before the task
                    self._drop(hd)
                    raise _Skip()
                return a0(*a, **kw)

            options["accept_callback"] = gate
        return orig(target, args, kwargs, **options)

    # The Agent's callbacks (in its threads).

    def _hand_back(self, claims: List[Claim]) -> None:
        """Stop-claiming: reject (requeue) the messages received and not started, so another worker gets them now."""
        held = [c.value for c in claims if isinstance(c.value, _Held)]

        def op() -> None:
            self._stop_consuming()  # first: a message rejected must not come back here
            ids = []
            at = time.time()
            for hd in held:
                _worker_state.task_ready(hd.req)  # no longer reserved here
                if not hd.req.acknowledged:
                    hd.req.reject(requeue=True)
                    ids.append(hd.task_id)
            self.loop.post(lambda: self._handed_back("stop-claiming", ids, at))

        # op posts the rejects; the second call returns once they have run.
        if not self.loop.call(op, self.h._loop_timeout) or not self.loop.call(lambda: None, self.h._loop_timeout):
            raise TimeoutError("the consumer's event loop did not send the hand-back within %gs" % self.h._loop_timeout)
        for hd in held:
            hd.settled = True
            self._over(hd)

    def _return_claims(self) -> int:
        """The drain deadline: reject (requeue) every message not acknowledged, running or not."""
        n = [0]

        def op() -> None:
            self._stop_consuming()
            with self._mu:
                held = list(self._held.values())
            ids = []
            at = time.time()
            for hd in held:
                if hd.settled or hd.req.acknowledged:
                    continue
                hd.req.reject(requeue=True)
                ids.append(hd.task_id)
            n[0] = len(ids)
            if ids:
                self.loop.post(lambda: self._handed_back("deadline", ids, at))

        if not self.loop.call(op, self.h._loop_timeout) or not self.loop.call(lambda: None, self.h._loop_timeout):
            raise ReturnClaimsError(n[0], "the consumer's event loop did not run the return within %gs" % self.h._loop_timeout)
        return n[0]

    def _handed_back(self, why: str, ids: List[str], at: float) -> None:
        if not ids:
            return
        self.log.info("handoff: handed back %d task message(s) (%s)", len(ids), why)
        hook = self.h._on_hand_back
        if hook is not None:
            try:
                hook(why, ids, at)
            except Exception:
                self.log.exception("handoff: on_hand_back failed")


def _channel_open(message: Any) -> bool:
    """Whether the channel a message came on is still open (py-amqp's is_open, kombu's virtual channels' closed)."""
    ch = getattr(message, "channel", None)
    if ch is None:
        return False
    if getattr(ch, "is_open", True) is False or getattr(ch, "closed", False) is True:
        return False
    return getattr(ch, "connection", True) is not None


def _integration(app: Any) -> Optional[Handoff]:
    h = getattr(app, _APP_ATTR, None)
    return h if isinstance(h, Handoff) else None


class _WorkerStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """The worker's step: the Agent, the gates on the pool. After the Pool step, before the Consumer."""

    label = "handoff"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, w: Any, **kwargs: Any) -> None:
        # Every step's __init__ runs before any step creates its service:
        # the gate on w._process_task is in place before the Pool step reads it.
        h = _integration(w.app)
        self.rt: Optional[_Runtime] = h._worker_init(w) if h is not None else None
        super().__init__(w, **kwargs)

    def create(self, w: Any) -> None:
        rt = self.rt
        if rt is not None:
            # The strategies read pool.apply_async when the consumer starts, after this.
            orig = w.pool.apply_async
            w.pool.apply_async = lambda target, args=None, kwargs=None, **options: rt.apply_async(orig, target, args, kwargs, **options)

    def start(self, w: Any) -> None:
        if self.rt is not None:
            self.rt.start()

    def stop(self, w: Any) -> None:
        pass  # keep serving: the sidecar may still call (the process's end closes it)

    def terminate(self, w: Any) -> None:
        pass

    def shutdown(self, w: Any) -> None:
        pass


class _ConsumerStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """The consumer's step: after the task consumer is made, before the event loop consumes."""

    label = "handoff consumer"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def _rt(self, c: Any) -> Optional[_Runtime]:
        h = _integration(c.app)
        return h._rt if h is not None else None

    def start(self, c: Any) -> None:
        rt = self._rt(c)
        if rt is not None:
            rt.consumer_started(c)

    def register_with_event_loop(self, c: Any, hub: Any) -> None:
        rt = self._rt(c)
        if rt is not None:
            rt.register(c, hub)

    def stop(self, c: Any) -> None:
        rt = self._rt(c)
        if rt is not None:
            rt.consumer_stopped(c)

    def shutdown(self, c: Any) -> None:
        self.stop(c)


def _on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    h = _integration(getattr(sender, "app", None))
    if h is not None and h._rt is not None and request is not None:
        h._rt.received(request)


def _on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    h = _integration(getattr(sender, "app", None))
    if h is not None and h._rt is not None:
        h._rt.close()


signals.task_received.connect(_on_task_received, weak=False)
signals.worker_shutdown.connect(_on_worker_shutdown, weak=False)
