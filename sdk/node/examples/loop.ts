// The claim loop of the README, in TypeScript, type-checked by
// `npm run typecheck:examples` (test.sh): `using` ends the receive and the
// claim whatever happens, the claim's signal carries the cancel fallback,
// and leader work ends with its term.
import { Agent, NotLeaderError, StoppingError, type Claim } from '@handoff-dev/worker';

interface Message {
  id: string;
  body: string;
}

interface Queue {
  receive(signal: AbortSignal): Promise<Message | undefined>;
  ack(m: Message): Promise<void>;
  releaseAll(signal: AbortSignal): Promise<number>;
  release(ms: Message[], signal: AbortSignal): Promise<void>;
}

declare const queue: Queue;
declare function handle(m: Message, signal: AbortSignal): Promise<void>;
declare function compactWhileLeading(fencingToken: bigint, signal: AbortSignal): Promise<void>;

export async function main(): Promise<void> {
  const agent = new Agent({
    returnClaims: (signal) => queue.releaseAll(signal),
    handBack: (claims: Claim[], signal) => queue.release(claims.map((c) => c.value as Message), signal),
  });
  await using server = await agent.listen(); // on $HANDOFF_APP_URL
  console.log(`serving ${server.url}`);

  // Leader-only work: runs while this pod leads the Lease "compactor",
  // fenced by its token, and stops when the term ends (revoked, run out).
  const leader = async () => {
    for (;;) {
      let work;
      try {
        work = agent.beginLeading('compactor');
      } catch (err) {
        if (!(err instanceof NotLeaderError)) throw err;
        await agent.leadershipChanged();
        continue;
      }
      using w = work;
      await compactWhileLeading(w.fencingToken, w.signal); // returns once w.signal aborts
    }
  };
  void leader();

  for (;;) {
    let msg: Message | undefined;
    let claim: Claim | undefined;
    try {
      using r = agent.receive();
      msg = await queue.receive(r.signal).catch(() => undefined);
      if (!msg) continue;
      claim = r.hold();
    } catch (err) {
      if (err instanceof StoppingError) break;
      throw err;
    }
    using c = claim;
    await handle(msg, c.signal);
    await queue.ack(msg);
  }
  await agent.waitDrained();
}
