// A small in-memory queue with a visibility timeout, as one worker sees an
// SQS-like queue: a message received is claimed, invisible to others, until
// it is acknowledged (deleted) or released (made visible again), or until
// its visibility timeout passes. Each claim has its own receipt, so an
// acknowledgement of a message handed back in the meantime fails, as with a
// real queue.

export class MemoryQueue {
  #visible = [];
  /** @type {Map<string, {msg: {id: string, body: string, receipt: number}, timer: NodeJS.Timeout}>} */
  #claimed = new Map();
  #waiters = new Set();
  #next = 0;
  #receipts = 0;

  /** @param {{visibilityTimeoutMillis?: number}} [options] */
  constructor(options = {}) {
    this.visibilityTimeoutMillis = options.visibilityTimeoutMillis ?? 30_000;
  }

  /** Puts messages with these bodies at the end of the queue. */
  publish(...bodies) {
    for (const body of bodies) this.#visible.push({ id: `m${++this.#next}`, body });
    this.#wake();
  }

  /**
   * Puts a message claimed by this worker at once: what a broker does when
   * it pushes a message to a prefetching consumer (the conformance hooks
   * use it to hold claims no claim loop can take). A producer uses publish.
   * @returns {{id: string, body: string, receipt: number}}
   */
  deliver(body) {
    const msg = { id: `m${++this.#next}`, body, receipt: ++this.#receipts };
    const timer = setTimeout(() => this.#expire(msg), this.visibilityTimeoutMillis);
    timer.unref();
    this.#claimed.set(msg.id, { msg, timer });
    return msg;
  }

  /**
   * Waits for a visible message and claims it (a long poll); rejects with
   * signal's reason if signal aborts first, having claimed nothing.
   * @param {AbortSignal} [signal]
   * @returns {Promise<{id: string, body: string, receipt: number}>}
   */
  receive(signal) {
    return new Promise((resolve, reject) => {
      const tryClaim = () => {
        const m = this.#visible.shift();
        if (!m) return false;
        const msg = { ...m, receipt: ++this.#receipts };
        const timer = setTimeout(() => this.#expire(msg), this.visibilityTimeoutMillis);
        timer.unref();
        this.#claimed.set(msg.id, { msg, timer });
        resolve(msg);
        return true;
      };
      if (signal?.aborted) return reject(signal.reason);
      if (tryClaim()) return;
      const waiter = () => {
        if (tryClaim()) done();
      };
      const onAbort = () => {
        done();
        reject(signal.reason);
      };
      const done = () => {
        this.#waiters.delete(waiter);
        signal?.removeEventListener('abort', onAbort);
      };
      this.#waiters.add(waiter);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Acknowledges a message: deleted. False when the claim is over (handed back, or timed out). */
  ack(msg) {
    const c = this.#claimed.get(msg.id);
    if (!c || c.msg.receipt !== msg.receipt) return false;
    clearTimeout(c.timer);
    this.#claimed.delete(msg.id);
    return true;
  }

  /** Releases a message: visible again at the head of the queue. False when the claim is over. */
  release(msg) {
    const c = this.#claimed.get(msg.id);
    if (!c || c.msg.receipt !== msg.receipt) return false;
    clearTimeout(c.timer);
    this.#claimed.delete(msg.id);
    this.#visible.unshift({ id: msg.id, body: msg.body });
    this.#wake();
    return true;
  }

  /** Hands back every message claimed and not acknowledged; returns how many. Safe to repeat. */
  releaseAll() {
    const all = [...this.#claimed.values()].map((c) => c.msg);
    for (const m of all) this.release(m);
    return all.length;
  }

  /** Messages claimed and not acknowledged. */
  get claimed() {
    return this.#claimed.size;
  }

  /** Messages visible. */
  get visible() {
    return this.#visible.length;
  }

  #expire(msg) {
    this.release(msg);
  }

  #wake() {
    for (const w of [...this.#waiters]) {
      if (this.#visible.length === 0) return;
      w();
    }
  }
}
