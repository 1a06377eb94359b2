import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, promises as fsp, createWriteStream } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { KubeConfig } from '@kubernetes/client-node';
import { freeTestSubnet } from './cluster/network.js';

const run = promisify(execFile);

/** The environment variable naming the directory with `kube-apiserver` and `etcd` (controller-runtime's envtest). */
export const ENVTEST_ASSETS_VAR = 'KUBEBUILDER_ASSETS';

/**
 * The directory holding `kube-apiserver` and `etcd`, from `KUBEBUILDER_ASSETS`, or undefined (with the reason) when
 * the variable is unset or a binary is missing. Suites use it to decide between running and skipping.
 */
export function envtestAssets(env: NodeJS.ProcessEnv = process.env): { dir?: string; reason?: string } {
  const dir = env[ENVTEST_ASSETS_VAR];
  if (!dir) {
    return { reason: `${ENVTEST_ASSETS_VAR} is not set (a directory with kube-apiserver and etcd, e.g. from setup-envtest or .ci/run)` };
  }
  for (const bin of ['kube-apiserver', 'etcd']) {
    if (!existsSync(path.join(dir, bin))) return { reason: `${ENVTEST_ASSETS_VAR}=${dir} has no ${bin}` };
  }
  return { dir };
}

export interface ControlPlaneOptions {
  /** Directory with `kube-apiserver` and `etcd` (default: `KUBEBUILDER_ASSETS`). */
  assetsDir?: string;
  /** Extra kube-apiserver flags (e.g. `--watch-cache=false`). */
  apiServerArgs?: string[];
  /** How long to wait for etcd health and the API server's `/readyz`. Default 120 s. */
  readyTimeoutMs?: number;
  /**
   * The range Services take their cluster IP from (`--service-cluster-ip-range`). Default: a /24 of the private test
   * range 10.214.0.0/16 that no address or route of this host uses, so that a test cluster can put its Services'
   * addresses on its bridge without hiding a real network.
   */
  serviceClusterIpRange?: string;
  /** Picks a free loopback port for etcd and the API server (default: one the OS chose, closed again before use). */
  pickPort?: () => Promise<number>;
}

/** A /24 in 10.214.0.0/16 that no address or route of this host uses (chosen from the pid, so parallel runs differ). */
async function freeServiceRange(): Promise<string> {
  return `10.214.${await freeTestSubnet('10.214')}.0/24`;
}

/** How many times a process is started on new ports after one of its ports was taken. */
const PORT_ATTEMPTS = 4;

/** A start that failed because a port was taken between `freePort()` and the server's bind. */
function isPortClash(err: unknown): boolean {
  return /address already in use/.test(err instanceof Error ? err.message : String(err));
}

/** Free TCP port on 127.0.0.1 (the OS picks it; closed again before use). */
async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

function httpsGet(url: string, ca: string, token?: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = https.get(url, { ca, timeout: 5000, headers: token ? { authorization: `Bearer ${token}` } : {} }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
  });
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Every process group still running, killed when Node exits (a crashed test run leaves nothing behind). */
const liveGroups = new Set<number>();
let exitHookInstalled = false;
function track(child: ChildProcess): void {
  if (child.pid === undefined) return;
  liveGroups.add(child.pid);
  child.once('exit', () => liveGroups.delete(child.pid as number));
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.once('exit', () => {
      for (const pgid of liveGroups) {
        try {
          process.kill(-pgid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
    });
  }
}

async function stopGroup(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const signal = (sig: NodeJS.Signals): void => {
    try {
      process.kill(-(child.pid as number), sig);
    } catch {
      // the group is gone
    }
  };
  signal('SIGTERM');
  const t = setTimeout(() => signal('SIGKILL'), 10_000);
  await exited;
  clearTimeout(t);
  liveGroups.delete(child.pid);
}

/**
 * A local Kubernetes control plane for tests, like controller-runtime's envtest: etcd and kube-apiserver on free
 * loopback ports, with a per-run CA and serving certificate (openssl), a static token file with an admin token
 * (`system:masters`) and a token for a user with no rights, RBAC authorization and ServiceAccount token signing (the
 * TokenRequest API works). There is no controller-manager, scheduler or kubelet: no garbage collection, namespaces
 * stay Terminating, no default ServiceAccount, pods stay Pending.
 *
 * Start one per test file (`beforeAll`, generous timeout: 10-30 s) and `stop()` it in `afterAll`.
 */
export class ControlPlane {
  private constructor(
    readonly workDir: string,
    /** `https://127.0.0.1:<port>` */
    readonly url: string,
    /** `http://127.0.0.1:<port>` (etcd's client URL, with the v3 HTTP gateway) */
    readonly etcdUrl: string,
    readonly caPem: string,
    readonly adminToken: string,
    /** Authenticated as user `alice`, no group, no RBAC rights. */
    readonly userToken: string,
    private readonly etcd: ChildProcess,
    private readonly apiServer: ChildProcess,
    /** Where Services take their cluster IP from (`--service-cluster-ip-range`). */
    readonly serviceClusterIpRange: string,
  ) {}

  static async start(opts: ControlPlaneOptions = {}): Promise<ControlPlane> {
    const assets = opts.assetsDir ?? envtestAssets().dir;
    if (!assets) throw new Error(envtestAssets().reason);
    const timeout = opts.readyTimeoutMs ?? 120_000;
    const pickPort = opts.pickPort ?? freePort;
    const wd = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-envtest-'));
    let etcd: ChildProcess | undefined;
    let apiServer: ChildProcess | undefined;
    try {
      const serviceRange = opts.serviceClusterIpRange ?? (await freeServiceRange());
      const pki = path.join(wd, 'pki');
      await fsp.mkdir(pki);
      await makePki(pki);
      const adminToken = randomBytes(24).toString('hex');
      const userToken = randomBytes(24).toString('hex');
      await fsp.writeFile(path.join(wd, 'tokens.csv'), `${adminToken},admin,admin-uid,"system:masters"\n${userToken},alice,alice-uid\n`, { mode: 0o600 });

      // Each process gets its ports just before it starts, and starts again on new ports when one was taken
      // meanwhile (another test's process may bind a port between our check and the server's own bind).
      let etcdUrl = '';
      const etcdReady = await startUntilReady(timeout, async () => {
        const [etcdPort, peerPort] = [await pickPort(), await pickPort()];
        const clientUrl = `http://127.0.0.1:${etcdPort}`;
        const peerUrl = `http://127.0.0.1:${peerPort}`;
        const dataDir = path.join(wd, 'etcd-data');
        await fsp.rm(dataDir, { recursive: true, force: true });
        etcdUrl = clientUrl;
        etcd = startProcess(path.join(assets, 'etcd'), [
          '--name=default',
          `--data-dir=${dataDir}`,
          `--listen-client-urls=${clientUrl}`,
          `--advertise-client-urls=${clientUrl}`,
          `--listen-peer-urls=${peerUrl}`,
          `--initial-advertise-peer-urls=${peerUrl}`,
          `--initial-cluster=default=${peerUrl}`,
          '--listen-metrics-urls=',
          '--unsafe-no-fsync',
        ], path.join(wd, 'etcd.log'));
        return {
          child: etcd,
          logFile: path.join(wd, 'etcd.log'),
          ready: async () => {
            const res = await fetch(`${clientUrl}/health`, { signal: AbortSignal.timeout(5000) });
            return res.ok && ((await res.json()) as { health?: string }).health === 'true';
          },
        };
      });

      const ca = await fsp.readFile(path.join(pki, 'ca.crt'), 'utf8');
      let url = '';
      const apiServerReady = await startUntilReady(timeout, async () => {
        const apiPort = await pickPort();
        const apiUrl = `https://127.0.0.1:${apiPort}`;
        url = apiUrl;
        apiServer = startProcess(path.join(assets, 'kube-apiserver'), [
          `--etcd-servers=${etcdUrl}`,
          '--bind-address=127.0.0.1',
          '--advertise-address=127.0.0.1',
          `--secure-port=${apiPort}`,
          '--endpoint-reconciler-type=none',
          `--cert-dir=${pki}`,
          `--tls-cert-file=${path.join(pki, 'apiserver.crt')}`,
          `--tls-private-key-file=${path.join(pki, 'apiserver.key')}`,
          `--client-ca-file=${path.join(pki, 'ca.crt')}`,
          `--token-auth-file=${path.join(wd, 'tokens.csv')}`,
          '--authorization-mode=RBAC',
          '--service-account-issuer=https://kubernetes.default.svc',
          `--service-account-key-file=${path.join(pki, 'sa.pub')}`,
          `--service-account-signing-key-file=${path.join(pki, 'sa.key')}`,
          `--service-cluster-ip-range=${serviceRange}`,
          '--disable-admission-plugins=ServiceAccount',
          '--allow-privileged=true',
          ...(opts.apiServerArgs ?? []),
        ], path.join(wd, 'kube-apiserver.log'));
        return {
          child: apiServer,
          logFile: path.join(wd, 'kube-apiserver.log'),
          ready: async () => {
            const res = await httpsGet(`${apiUrl}/readyz`, ca);
            return res.status === 200 && res.body === 'ok';
          },
        };
      });
      return new ControlPlane(wd, url, etcdUrl, ca, adminToken, userToken, etcdReady, apiServerReady, serviceRange);
    } catch (err) {
      await stopGroup(apiServer);
      await stopGroup(etcd);
      await fsp.rm(wd, { recursive: true, force: true });
      throw err;
    }
  }

  /** A KubeConfig for a bearer token (default: the admin token), with the per-run CA. */
  kubeConfig(token: string = this.adminToken): KubeConfig {
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'envtest', server: this.url, caData: Buffer.from(this.caPem).toString('base64'), skipTLSVerify: false }],
      users: [{ name: 'envtest', token }],
      contexts: [{ name: 'envtest', cluster: 'envtest', user: 'envtest' }],
      currentContext: 'envtest',
    });
    return kc;
  }

  /** The kubeconfig as a YAML file in the work dir (for child processes: `--kubeconfig` / `KUBECONFIG`). */
  async writeKubeConfig(name: string, token: string = this.adminToken): Promise<string> {
    const file = path.join(this.workDir, `${name}.kubeconfig`);
    await fsp.writeFile(file, this.kubeConfig(token).exportConfig(), { mode: 0o600 });
    return file;
  }

  /**
   * A raw JSON request to the API server (default: as admin). Used where client-node's typed serializer would drop
   * fields it does not model under their wire names (CRD schemas' `x-kubernetes-*` keys) or for `Accept` variants
   * (Table output). Answers the status and the parsed body (or the text when it is not JSON).
   */
  async request(method: string, apiPath: string, opts: RawRequestOptions = {}): Promise<{ status: number; body: unknown }> {
    return rawRequest(this.url, this.caPem, method, apiPath, { token: this.adminToken, ...opts });
  }

  /** The current etcd revision (the API server's resourceVersion counter). */
  async etcdRevision(): Promise<number> {
    const res = await fetch(`${this.etcdUrl}/v3/kv/range`, { method: 'POST', body: JSON.stringify({ key: Buffer.from('/').toString('base64'), limit: 1 }) });
    if (!res.ok) throw new Error(`etcd range: HTTP ${res.status}`);
    return Number(((await res.json()) as { header: { revision: string } }).header.revision);
  }

  /** Compacts etcd's history up to `revision` (watches from older resourceVersions then get 410 Gone). */
  async compact(revision: number): Promise<void> {
    const res = await fetch(`${this.etcdUrl}/v3/kv/compaction`, { method: 'POST', body: JSON.stringify({ revision: String(revision), physical: true }) });
    if (!res.ok) {
      const text = await res.text();
      // Compacting to an already compacted revision is not an error for our purposes.
      if (!/already been compacted/.test(text)) throw new Error(`etcd compaction to ${revision}: HTTP ${res.status} ${text}`);
    }
  }

  /** The API server's log so far (for diagnosing a failed test). */
  async apiServerLog(): Promise<string> {
    return fsp.readFile(path.join(this.workDir, 'kube-apiserver.log'), 'utf8').catch(() => '');
  }

  /** Stops the API server and etcd (their whole process groups) and removes the work dir. Safe to call twice. */
  async stop(): Promise<void> {
    await stopGroup(this.apiServer);
    await stopGroup(this.etcd);
    await fsp.rm(this.workDir, { recursive: true, force: true });
  }
}

export interface RawRequestOptions {
  token?: string;
  body?: unknown;
  /** Default `application/json`. */
  contentType?: string;
  accept?: string;
  query?: Record<string, string>;
}

function rawRequest(base: string, ca: string, method: string, apiPath: string, opts: RawRequestOptions): Promise<{ status: number; body: unknown }> {
  const url = new URL(apiPath, base);
  for (const [k, v] of Object.entries(opts.query ?? {})) url.searchParams.set(k, v);
  const payload = opts.body === undefined ? undefined : typeof opts.body === 'string' ? opts.body : JSON.stringify(opts.body);
  return new Promise((resolve, reject) => {
    const req = https.request(
      url,
      {
        method,
        ca,
        // One connection per request, with a Content-Length body: a long run of requests over Node's keep-alive
        // agent ended with every request answered "400 Bad Request" by the 1.20 server.
        agent: false,
        headers: {
          ...(opts.token ? { authorization: `Bearer ${opts.token}` } : {}),
          accept: opts.accept ?? 'application/json',
          ...(payload !== undefined ? { 'content-type': opts.contentType ?? 'application/json', 'content-length': String(Buffer.byteLength(payload)) } : {}),
        },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => {
          let body: unknown = text;
          try {
            body = JSON.parse(text);
          } catch {
            // not JSON
          }
          resolve({ status: res.statusCode ?? 0, body });
        });
      },
    );
    req.on('error', reject);
    if (payload !== undefined) req.write(payload);
    req.end();
  });
}

function startProcess(bin: string, args: string[], logFile: string): ChildProcess {
  const log = createWriteStream(logFile);
  // detached: its own process group, so stop() can signal everything it started.
  const child = spawn(bin, args, { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout?.pipe(log, { end: false });
  child.stderr?.pipe(log, { end: false });
  child.once('exit', () => log.end());
  child.once('error', () => log.end());
  track(child);
  return child;
}

/**
 * Starts a server with `launch` (which picks its ports and spawns it) and waits until `ready` (returns the started process); when it failed because
 * a port was taken between the pick and its bind, stops it and launches again on new ports (up to PORT_ATTEMPTS).
 */
async function startUntilReady(
  timeoutMs: number,
  launch: () => Promise<{ child: ChildProcess; logFile: string; ready: () => Promise<boolean> }>,
): Promise<ChildProcess> {
  for (let attempt = 1; ; attempt++) {
    const { child, logFile, ready } = await launch();
    try {
      await waitUntil(timeoutMs, child, logFile, ready);
      return child;
    } catch (err) {
      if (attempt >= PORT_ATTEMPTS || !isPortClash(err)) throw err;
      await stopGroup(child);
    }
  }
}

async function waitUntil(timeoutMs: number, child: ChildProcess, logFile: string, ready: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const name = path.basename(logFile, '.log');
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      const log = await fsp.readFile(logFile, 'utf8').catch(() => '');
      throw new Error(`${name} exited (${child.exitCode ?? child.signalCode}):\n${log.split('\n').slice(-30).join('\n')}`);
    }
    if (await ready().catch(() => false)) return;
    if (Date.now() > deadline) {
      const log = await fsp.readFile(logFile, 'utf8').catch(() => '');
      throw new Error(`${name} not ready after ${timeoutMs} ms:\n${log.split('\n').slice(-30).join('\n')}`);
    }
    await sleep(200);
  }
}

/** Per-run PKI with the openssl CLI: CA, API serving certificate (127.0.0.1, ::1, localhost), ServiceAccount key pair. */
async function makePki(dir: string): Promise<void> {
  const ssl = (...args: string[]): Promise<unknown> => run('openssl', args, { cwd: dir });
  await ssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2', '-subj', '/CN=bis-envtest-ca');
  await ssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'apiserver.key', '-out', 'apiserver.csr', '-subj', '/CN=kube-apiserver');
  await fsp.writeFile(
    path.join(dir, 'server.ext'),
    'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n',
  );
  await ssl('x509', '-req', '-in', 'apiserver.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', 'apiserver.crt', '-days', '2', '-extfile', 'server.ext');
  await ssl('genrsa', '-out', 'sa.key', '2048');
  await ssl('rsa', '-in', 'sa.key', '-pubout', '-out', 'sa.pub');
}

/**
 * Creates (or replaces) CustomResourceDefinitions, given as plain manifests (wire field names), and waits until each
 * is `Established`; a CRD used before that answers 404.
 */
export async function installCrds(cp: ControlPlane, crds: readonly Record<string, unknown>[], timeoutMs = 60_000): Promise<void> {
  const base = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions';
  const nameOf = (crd: Record<string, unknown>): string => (crd.metadata as { name: string }).name;
  for (const crd of crds) {
    const name = nameOf(crd);
    let res = await cp.request('POST', base, { body: crd });
    if (res.status === 409) {
      const cur = (await cp.request('GET', `${base}/${name}`)).body as { metadata: { resourceVersion: string } };
      res = await cp.request('PUT', `${base}/${name}`, { body: { ...crd, metadata: { ...(crd.metadata as object), resourceVersion: cur.metadata.resourceVersion } } });
    }
    if (res.status >= 300) throw new Error(`CRD ${name}: HTTP ${res.status}: ${JSON.stringify(res.body)}`);
  }
  const deadline = Date.now() + timeoutMs;
  for (const crd of crds) {
    const name = nameOf(crd);
    for (;;) {
      const cur = (await cp.request('GET', `${base}/${name}`)).body as { status?: { conditions?: { type: string; status: string }[] } };
      if (cur.status?.conditions?.some((c) => c.type === 'Established' && c.status === 'True')) break;
      if (Date.now() > deadline) throw new Error(`CRD ${name} not Established after ${timeoutMs} ms`);
      await sleep(100);
    }
  }
}
