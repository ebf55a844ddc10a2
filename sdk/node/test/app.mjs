// An Agent served on a temporary socket, and the sidecar's calls to it.
import { join } from 'node:path';
import { Agent } from '../dist/index.js';
import { call, grantBody, revokeBody, tempDir, token } from './helpers.mjs';

/** newAgent makes an Agent with the test token (and options), served for the test's length. */
export async function serve(t, options = {}) {
  const agent = options instanceof Agent ? options : new Agent({ token, ...options });
  const dir = tempDir(t);
  const url = `unix://${join(dir, 'app.sock')}`;
  const server = await agent.listen({ url });
  t.after(() => server.close());
  const ok = async (method, target, body = '') => {
    const r = await call(url, method, target, body);
    if (r.status !== 200) throw new Error(`${method} ${target} ${body} = ${r.status} ${r.body}`);
    return r.json;
  };
  return {
    agent,
    url,
    server,
    stopClaiming: () => ok('POST', '/handoff/v1/stop-claiming', '{}'),
    drain: (waitMillis = 0) => ok('GET', `/handoff/v1/drain?waitMillis=${waitMillis}`),
    return: (cancel = false, cancelWaitMillis = 0) =>
      ok('POST', '/handoff/v1/return', JSON.stringify({ cancel, cancelWaitMillis })),
    grant: (lease, seq, opts) => ok('PUT', `/handoff/v1/leases/${lease}`, grantBody(lease, seq, opts)),
    revoke: (lease, seq) => ok('PUT', `/handoff/v1/leases/${lease}`, revokeBody(lease, seq)),
    lead: (lease, body) => call(url, 'PUT', `/handoff/v1/leases/${lease}`, body),
  };
}
