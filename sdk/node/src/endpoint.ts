// Where the app serves (docs/protocol.md, "Transport"): a Unix socket in
// the pod's handoff-run volume, or by opt-in a loopback TCP address.
import { chmodSync, lstatSync, unlinkSync } from 'node:fs';
import { connect, isIPv4, isIPv6, type Server } from 'node:net';
import { isAbsolute, normalize } from 'node:path';
import { ConfigError } from './errors.js';

/** The environment variable with the app API's address, which the injector sets in the worker container. */
export const appURLEnv = 'HANDOFF_APP_URL';
/** The app socket of an injected pod. */
export const appSocket = '/handoff-run/app.sock';
/** The mode the server gives its socket: the sidecar and the worker may run as different users. */
export const socketMode = 0o666;
/** A socket path holds at most this many bytes (sockaddr_un's 108, less the NUL). */
const maxSocketPath = 107;

/** An address of the app API: a Unix socket, or a loopback TCP host and port. */
export type Endpoint = { network: 'unix'; path: string } | { network: 'tcp'; host: string; port: number };

const forms = 'unix:// and an absolute socket path, like unix:///handoff-run/app.sock, or a loopback address, like http://127.0.0.1:7452 or 127.0.0.1:7450';

function isLoopback(host: string): boolean {
  if (isIPv4(host)) return host.split('.')[0] === '127';
  if (isIPv6(host)) {
    const h = host.toLowerCase();
    if (h === '::1' || h === '0:0:0:0:0:0:0:1') return true;
    const m = /^(?:0{0,4}:){0,5}(?:0{0,4}:)?:?ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h) ?? /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
    return !!m && isIPv4(m[1]!) && m[1]!.startsWith('127.');
  }
  return false;
}

/**
 * parseEndpoint reads an address in the protocol's one form: `unix://` and
 * an absolute, clean path of at most 107 bytes, or a loopback IP and port
 * (`http://127.0.0.1:7452`, `127.0.0.1:7450`, `[::1]:7452`; port 0 picks a
 * free one). `localhost` is refused: it names both 127.0.0.1 and ::1.
 */
export function parseEndpoint(s: string): Endpoint {
  const bad = (reason: string): never => {
    throw new ConfigError(`${JSON.stringify(s)}: ${reason}; want ${forms}`);
  };
  if (s.startsWith('unix://')) {
    const p = s.slice('unix://'.length);
    if (!isAbsolute(p)) bad('the socket path is not absolute');
    const clean = normalize(p).replace(/(.)\/+$/, '$1');
    if (clean !== p) bad(`the socket path is not clean (${clean})`);
    if (Buffer.byteLength(p) > maxSocketPath) {
      bad(`the socket path has ${Buffer.byteLength(p)} bytes, more than the ${maxSocketPath} a Unix socket address holds`);
    }
    return { network: 'unix', path: p };
  }
  let hostport = s;
  if (s.startsWith('http://')) {
    hostport = s.slice('http://'.length).replace(/\/+$/, '');
    if (/[/?#@]/.test(hostport)) bad('an http address has a host and port only (no user, path, query or fragment)');
  }
  const m = /^(?:\[([^\]]*)\]|([^:[\]]*)):([0-9]+)$/.exec(hostport);
  if (!m) return bad('not a host:port');
  const host = m[1] ?? m[2] ?? '';
  const port = Number(m[3]);
  if (!Number.isInteger(port) || port < 0 || port > 65535) bad(`port ${JSON.stringify(m[3])} is not a number from 0 to 65535`);
  if (host === 'localhost') {
    bad('localhost names both 127.0.0.1 and ::1, and a neighbour could serve the one the server does not bind: give the loopback address itself, like 127.0.0.1');
  }
  if (!isLoopback(host)) bad(`${JSON.stringify(host)} is not a loopback address: the protocol is never spoken beyond the pod's loopback`);
  return { network: 'tcp', host, port };
}

/** endpointString is the address in parseEndpoint's form. */
export function endpointString(e: Endpoint): string {
  if (e.network === 'unix') return `unix://${e.path}`;
  return `http://${e.host.includes(':') ? `[${e.host}]` : e.host}:${e.port}`;
}

/** Whether a process serves the socket at path: a connect succeeds (true), or is refused (false); other errors throw. */
function served(path: string): Promise<boolean> {
  return new Promise((resolve, reject) => {
    const c = connect({ path });
    const timer = setTimeout(() => {
      c.destroy();
      reject(new Error(`checking whether it is stale: no answer to a connect within 1s`));
    }, 1000);
    c.once('connect', () => {
      clearTimeout(timer);
      c.destroy();
      resolve(true);
    });
    c.once('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      if (err.code === 'ECONNREFUSED') resolve(false);
      else reject(new Error(`checking whether it is stale: ${err.message}`, { cause: err }));
    });
  });
}

/**
 * listenOn makes server listen on e. A socket is made at the path itself,
 * mode 0666: a path that exists and is not a socket (a file, a directory, a
 * symbolic link) is refused, never replaced; a socket another process
 * serves is refused; a stale one (a connect is refused) is removed first.
 * Closing the server removes the socket.
 */
export async function listenOn(server: Server, e: Endpoint): Promise<void> {
  if (e.network === 'unix') {
    let st;
    try {
      st = lstatSync(e.path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw new ConfigError(`socket ${e.path}: ${(err as Error).message}`, { cause: err });
    }
    if (st) {
      if (!st.isSocket()) {
        const what = st.isSymbolicLink() ? 'a symbolic link' : st.isDirectory() ? 'a directory' : st.isFile() ? 'a file' : 'not a socket';
        throw new ConfigError(`socket ${e.path}: the path exists and is not a socket (${what}); refusing to replace it`);
      }
      let busy: boolean;
      try {
        busy = await served(e.path);
      } catch (err) {
        throw new ConfigError(`socket ${e.path}: ${(err as Error).message}`, { cause: err });
      }
      if (busy) throw new ConfigError(`socket ${e.path}: another process serves it`);
      try {
        unlinkSync(e.path);
      } catch (err) {
        throw new ConfigError(`socket ${e.path}: removing the stale socket: ${(err as Error).message}`, { cause: err });
      }
    }
  }
  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error) => reject(err);
    server.once('error', onError);
    const done = () => {
      server.off('error', onError);
      resolve();
    };
    if (e.network === 'unix') server.listen({ path: e.path, exclusive: true }, done);
    else server.listen({ host: e.host, port: e.port, exclusive: true }, done);
  });
  if (e.network === 'unix') {
    try {
      chmodSync(e.path, socketMode);
    } catch (err) {
      server.close();
      throw new ConfigError(`socket ${e.path}: ${(err as Error).message}`, { cause: err });
    }
  }
}
