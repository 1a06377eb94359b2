import { execFile, spawnSync } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { promisify } from 'node:util';

const run = promisify(execFile);

/** Every network namespace, link and mount-point record of a test cluster starts with this (plus the run id). */
export const CLUSTER_NAME_PREFIX = 'bisc';

/** First two octets of the private test range: each run takes one /24 in 10.213.0.0/16 (its bridge subnet). */
const RANGE = '10.213';

/**
 * A /24 of `<prefix>.0.0/16` that no address or route of this host uses, as its third octet (1–250), chosen from the
 * pid so that parallel runs differ. Without `ip`, the pid's own choice.
 */
export async function freeTestSubnet(prefix: string): Promise<number> {
  const used = await Promise.all([sh('ip', ['-4', 'addr', 'show']), sh('ip', ['-4', 'route', 'show'])]).then(
    (r) => r.join('\n'),
    () => '', // no `ip`: nothing to avoid but the pid's own choice
  );
  for (let i = 0; i < 250; i++) {
    const o = ((process.pid + i) % 250) + 1;
    if (!used.includes(`${prefix}.${o}.`)) return o;
  }
  throw new Error(`no free /24 in ${prefix}.0.0/16 for the test cluster`);
}

/**
 * Whether this process can build a cluster in network namespaces: root, `ip netns`, `unshare`, `tc`. Answers the
 * reason when it cannot (for a skip message).
 */
export function clusterNetworkSupport(): { ok: boolean; reason?: string } {
  if (process.platform !== 'linux') return { ok: false, reason: 'not Linux' };
  if (process.getuid?.() !== 0) return { ok: false, reason: 'not running as root (network namespaces, veth pairs, bind mounts need it)' };
  for (const [cmd, args] of [
    ['ip', ['netns', 'list']],
    ['unshare', ['--version']],
    ['tc', ['-V']],
    ['nsenter', ['--version']],
  ] as const) {
    const r = spawnSync(cmd, [...args], { stdio: 'ignore' });
    if (r.error || r.status !== 0) return { ok: false, reason: `\`${cmd} ${args.join(' ')}\` is not available` };
  }
  return { ok: true };
}

export async function sh(cmd: string, args: readonly string[]): Promise<string> {
  try {
    const { stdout } = await run(cmd, [...args], { maxBuffer: 16 << 20 });
    return stdout;
  } catch (err) {
    const e = err as Error & { stderr?: string };
    throw new Error(`${cmd} ${args.join(' ')}: ${(e.stderr ?? '').trim() || e.message}`);
  }
}

const ip = (...args: string[]): Promise<string> => sh('ip', args);
const quiet = async (p: Promise<unknown>): Promise<void> => {
  await p.catch(() => undefined);
};

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
};

/** A link shape this kernel cannot apply (a delay without the netem qdisc). */
export class LinkShapeUnsupportedError extends Error {
  override name = 'LinkShapeUnsupportedError';
}

/** Link shaping of one node: `tc netem` rate and delay on both ends of each of its pods' veth pairs. */
export interface LinkShape {
  /** Rate cap, Mbit/s. */
  rateMbit?: number;
  /** One-way delay added at each end, ms. */
  delayMs?: number;
}

export interface PodNetwork {
  netns: string;
  ip: string;
  hostVeth: string;
}

/** Where a run records the mount points it created in the root filesystem (removed at stop or by a later sweep). */
const mountPointRecord = (runId: string): string => `/tmp/${CLUSTER_NAME_PREFIX}-${runId}-mountpoints`;

/**
 * The network of a test cluster: one Linux bridge in the root namespace holding the first address of a private /24
 * (the root namespace reaches every pod through it), and one network namespace per pod with a veth pair onto the
 * bridge. Names carry the run id (the pid in base 36), so a later run can sweep what a killed run left behind.
 */
export class ClusterNetwork {
  readonly runId = process.pid.toString(36);
  readonly bridge = `${CLUSTER_NAME_PREFIX}${this.runId}b`;
  private nextHost = 2;
  private nextIndex = 0;
  private readonly pods = new Map<string, PodNetwork>();
  private readonly createdMountPoints: string[] = [];
  private destroyed = false;

  private readonly serviceAddresses = new Set<string>();

  private constructor(
    /** The bridge's subnet, e.g. `10.213.42.0/24`. */
    readonly subnet: string,
    /** The bridge's address in the root namespace (pods reach the host's test servers there). */
    readonly gateway: string,
    /** The Services' cluster IP range (a /24): pods route it through the bridge, where the service proxy listens. */
    readonly serviceRange?: string,
  ) {}

  /**
   * Sweeps what dead runs left, then creates the bridge on a /24 of 10.213.0.0/16 that no route of this host uses.
   * With `serviceRange` (a /24, the API server's `--service-cluster-ip-range`), pods route it to the bridge.
   */
  static async create(serviceRange?: string): Promise<ClusterNetwork> {
    if (serviceRange !== undefined && !/^\d+\.\d+\.\d+\.0\/24$/.test(serviceRange)) throw new Error(`the service range must be a /24, not ${serviceRange}`);
    await sweepStale();
    const octet = await freeTestSubnet(RANGE);
    const net = new ClusterNetwork(`${RANGE}.${octet}.0/24`, `${RANGE}.${octet}.1`, serviceRange);
    try {
      await ip('link', 'add', net.bridge, 'type', 'bridge');
      await ip('addr', 'add', `${net.gateway}/24`, 'dev', net.bridge);
      await ip('link', 'set', net.bridge, 'up');
    } catch (err) {
      await net.destroy();
      throw err;
    }
    return net;
  }

  /** A network namespace for a pod (`key`: its uid), a veth pair onto the bridge, the next free address. */
  async addPod(key: string, opts: { down?: boolean; shape?: LinkShape } = {}): Promise<PodNetwork> {
    if (this.destroyed) throw new Error('the cluster network is gone');
    const existing = this.pods.get(key);
    if (existing) return existing;
    if (this.nextHost > 254) throw new Error(`the test subnet ${this.subnet} is full`);
    const n = this.nextIndex++;
    const host = this.nextHost++;
    const pn: PodNetwork = { netns: `${CLUSTER_NAME_PREFIX}-${this.runId}-${n}`, ip: this.subnet.replace(/\.0\/24$/, `.${host}`), hostVeth: `${CLUSTER_NAME_PREFIX}${this.runId}h${n}` };
    const peer = `${CLUSTER_NAME_PREFIX}${this.runId}p${n}`;
    this.pods.set(key, pn);
    await ip('netns', 'add', pn.netns);
    await ip('link', 'add', pn.hostVeth, 'type', 'veth', 'peer', 'name', peer);
    await ip('link', 'set', peer, 'netns', pn.netns);
    await ip('-n', pn.netns, 'link', 'set', peer, 'name', 'eth0');
    await ip('-n', pn.netns, 'addr', 'add', `${pn.ip}/24`, 'dev', 'eth0');
    await ip('-n', pn.netns, 'link', 'set', 'lo', 'up');
    await ip('-n', pn.netns, 'link', 'set', 'eth0', 'up');
    if (this.serviceRange) await ip('-n', pn.netns, 'route', 'add', this.serviceRange, 'via', this.gateway);
    await ip('link', 'set', pn.hostVeth, 'master', this.bridge);
    if (opts.shape) await this.shape(pn, opts.shape);
    await ip('link', 'set', pn.hostVeth, opts.down ? 'down' : 'up');
    return pn;
  }

  /** Whether `ip` is a cluster IP of the service range. */
  inServiceRange(address: string): boolean {
    return !!this.serviceRange && address.startsWith(this.serviceRange.replace(/0\/24$/, ''));
  }

  /** Puts a Service's cluster IP on the bridge (a /32): the test process and the pods reach listeners on it. */
  async addServiceAddress(address: string): Promise<void> {
    if (!this.inServiceRange(address)) throw new Error(`${address} is not in the service range ${this.serviceRange ?? '(none)'}`);
    if (this.serviceAddresses.has(address)) return;
    await ip('addr', 'add', `${address}/32`, 'dev', this.bridge);
    this.serviceAddresses.add(address);
  }

  pod(key: string): PodNetwork | undefined {
    return this.pods.get(key);
  }

  /** Kills whatever still runs in the pod's namespace and removes the namespace (the veth pair goes with it). */
  async removePod(key: string): Promise<void> {
    const pn = this.pods.get(key);
    if (!pn) return;
    this.pods.delete(key);
    await removeNetns(pn.netns);
    await quiet(ip('link', 'del', pn.hostVeth));
  }

  /**
   * Caps (or, with an empty shape, uncaps) both directions of a pod's link: `tc netem` (rate and delay). A kernel
   * without the netem qdisc (sch_netem) can still cap the rate, with a token bucket (`tbf`); a delay then cannot be
   * applied and is refused with the reason (`LinkShapeUnsupportedError`).
   */
  async shape(pn: PodNetwork, s: LinkShape): Promise<void> {
    const netem = ['netem', ...(s.delayMs ? ['delay', `${s.delayMs}ms`] : []), ...(s.rateMbit ? ['rate', `${s.rateMbit}mbit`] : [])];
    for (const prefix of [[], ['-n', pn.netns]] as string[][]) {
      const dev = prefix.length ? 'eth0' : pn.hostVeth;
      if (netem.length === 1) {
        await quiet(sh('tc', [...prefix, 'qdisc', 'del', 'dev', dev, 'root']));
        continue;
      }
      try {
        await sh('tc', [...prefix, 'qdisc', 'replace', 'dev', dev, 'root', ...netem]);
      } catch (err) {
        if (!/qdisc kind is unknown/i.test((err as Error).message)) throw err;
        if (s.delayMs) throw new LinkShapeUnsupportedError(`this kernel has no netem qdisc (sch_netem): a delay of ${s.delayMs} ms cannot be put on the link (a rate alone can: tbf)`);
        // tbf: the bucket holds at least one timer tick of the rate (1 MiB covers 1 Gbit/s at HZ 100), 50 ms of queue
        await sh('tc', [...prefix, 'qdisc', 'replace', 'dev', dev, 'root', 'tbf', 'rate', `${s.rateMbit}mbit`, 'burst', '1mb', 'latency', '50ms']);
      }
    }
  }

  /** Link up or down on the bridge side (down: the pod is cut off from everything, the host included). */
  async setLink(pn: PodNetwork, up: boolean): Promise<void> {
    await ip('link', 'set', pn.hostVeth, up ? 'up' : 'down');
  }

  /** Creates `dir` (and missing parents) in the root filesystem as a mount point; removed again by `destroy()`. */
  async ensureMountPoint(dir: string): Promise<void> {
    const missing: string[] = [];
    let d = dir.replace(/\/+$/, '') || '/';
    while (d !== '/') {
      try {
        await fsp.stat(d);
        break;
      } catch {
        missing.unshift(d);
        d = d.slice(0, d.lastIndexOf('/')) || '/';
      }
    }
    if (!missing.length) return;
    await fsp.mkdir(dir, { recursive: true });
    this.createdMountPoints.push(...missing);
    await fsp.appendFile(mountPointRecord(this.runId), missing.map((m) => `${m}\n`).join(''));
  }

  /** Removes every namespace, veth, the bridge and the mount points it created. Safe to call twice. */
  async destroy(): Promise<void> {
    this.destroyed = true;
    for (const key of [...this.pods.keys()]) await this.removePod(key);
    await quiet(ip('link', 'del', this.bridge));
    await removeMountPoints(this.createdMountPoints);
    await quiet(fsp.rm(mountPointRecord(this.runId), { force: true }));
  }
}

async function removeNetns(netns: string): Promise<void> {
  const pids = (await sh('ip', ['netns', 'pids', netns]).catch(() => '')).split(/\s+/).filter(Boolean).map(Number);
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  await quiet(ip('netns', 'del', netns));
}

/** Empty directories only, deepest first: a mount point somebody else filled is left alone. */
async function removeMountPoints(dirs: readonly string[]): Promise<void> {
  for (const d of [...new Set(dirs)].sort((a, b) => b.length - a.length)) await quiet(fsp.rmdir(d));
}

/** Removes the namespaces, links and mount points of runs whose process is gone. */
export async function sweepStale(): Promise<string[]> {
  const removed: string[] = [];
  const deadRun = (id: string): boolean => {
    const pid = parseInt(id, 36);
    return Number.isFinite(pid) && pid > 0 && pid !== process.pid && !alive(pid);
  };
  const nsRe = new RegExp(`^${CLUSTER_NAME_PREFIX}-([0-9a-z]+)-\\d+$`);
  for (const line of (await sh('ip', ['netns', 'list']).catch(() => '')).split('\n')) {
    const name = line.split(' ')[0] ?? '';
    const m = nsRe.exec(name);
    if (m && deadRun(m[1]!)) {
      await removeNetns(name);
      removed.push(`netns ${name}`);
    }
  }
  const linkRe = new RegExp(`^${CLUSTER_NAME_PREFIX}([0-9a-z]+?)[bhp]\\d*$`);
  for (const line of (await sh('ip', ['-o', 'link', 'show']).catch(() => '')).split('\n')) {
    const name = /^\d+:\s+([^:@]+)/.exec(line)?.[1];
    const m = name ? linkRe.exec(name) : null;
    if (name && m && deadRun(m[1]!)) {
      await quiet(ip('link', 'del', name));
      removed.push(`link ${name}`);
    }
  }
  const recRe = new RegExp(`^${CLUSTER_NAME_PREFIX}-([0-9a-z]+)-mountpoints$`);
  for (const f of await fsp.readdir('/tmp').catch(() => [] as string[])) {
    const m = recRe.exec(f);
    if (!m || !deadRun(m[1]!)) continue;
    const dirs = (await fsp.readFile(`/tmp/${f}`, 'utf8').catch(() => '')).split('\n').filter(Boolean);
    await removeMountPoints(dirs);
    await quiet(fsp.rm(`/tmp/${f}`, { force: true }));
    removed.push(`mount points of run ${m[1]}`);
  }
  return removed;
}
