/**
 * `@handoff-dev/worker`: the app side of the handoff protocol for Node queue
 * workers (docs/protocol.md), the counterpart of the Go package
 * `github.com/handoff-dev/handoff/worker`.
 *
 * ```ts
 * import { Agent, StoppingError } from '@handoff-dev/worker';
 *
 * const agent = new Agent({ returnClaims: (signal) => queue.returnAll(signal) });
 * await agent.listen(); // on $HANDOFF_APP_URL
 * for (;;) {
 *   let r;
 *   try { r = agent.receive(); } catch (e) { if (e instanceof StoppingError) break; throw e; }
 *   const msg = await queue.receive(r.signal).catch(() => undefined);
 *   if (!msg) { r.end(); continue; }
 *   const c = r.hold(); // held: in flight until done, even after stop-claiming
 *   r.end();
 *   try {
 *     await handle(msg, c.signal); // aborted by the cancel fallback
 *     await queue.ack(msg);
 *   } catch {
 *     // unfinished: still claimed; returnClaims hands it back
 *   } finally {
 *     c.done();
 *   }
 * }
 * ```
 * @module
 */
export { Agent } from './agent.js';
export { Claim, Receive } from './claims.js';
export { type Leadership, type LeaderWork } from './leadership.js';
export {
  type AgentOptions,
  type Logger,
  type ReturnClaimsError,
  type ReturnResult,
  leaseDurationEnv,
  maxLeaseDurationMillis,
  parseGoDuration,
  shardsEnv,
  shardsFromEnv,
} from './options.js';
export {
  authScheme,
  bodyDigest,
  checkToken,
  maxNonces,
  newNonce,
  nonceHeader,
  readTokenFile,
  Refusal,
  signHeaders,
  signature,
  timestampHeader,
  tokenFile,
  tokenFileEnv,
  Verifier,
} from './auth.js';
export { realClock, type Clock } from './clock.js';
export { appSocket, appURLEnv, endpointString, parseEndpoint, socketMode, type Endpoint } from './endpoint.js';
export {
  CanceledError,
  ClaimDoneError,
  ConfigError,
  HandedBackError,
  HandoffError,
  NotLeaderError,
  ReturnOverdueError,
  StoppingError,
} from './errors.js';
export { maxBodyBytes, maxDrainWaitMillis, maxSequenceAheadNanos, parseWaitMillis, type AppHandler, type AppServer } from './server.js';
/** The protocol's wire types and operations, generated from docs/protocol.yaml. */
export * as protocol from './protocol.gen.js';

