// Linking AbortSignals without a listener per child: many claims share one
// parent signal (a worker's shutdown signal given to every receive), and
// Node warns past 10 listeners on one EventTarget. One listener per parent
// signal aborts every child linked to it.

type Child = (reason: unknown) => void;

const children = new WeakMap<AbortSignal, Set<Child>>();

/**
 * link calls abort(parent.reason) once parent aborts (at once, if it has),
 * and returns the function that unlinks it. At most one listener is added
 * to parent, however many children are linked.
 */
export function link(parent: AbortSignal | undefined, abort: Child): () => void {
  if (!parent) return noop;
  if (parent.aborted) {
    abort(parent.reason);
    return noop;
  }
  let set = children.get(parent);
  if (!set) {
    const s = new Set<Child>();
    set = s;
    children.set(parent, s);
    parent.addEventListener(
      'abort',
      () => {
        children.delete(parent);
        for (const c of [...s]) c(parent.reason);
        s.clear();
      },
      { once: true },
    );
  }
  set.add(abort);
  const s = set;
  return () => {
    s.delete(abort);
  };
}

function noop(): void {}

/** abortReason is the reason a signal aborted with, as an Error when it is not one. */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException('This operation was aborted', 'AbortError');
}
