import net from 'node:net';
import type { ControlPlane } from '../envtest.js';
import type { ClusterNetwork } from './network.js';
import { relay } from './relay.js';

/** A pod that may back a Service: where it listens and what it is labelled. */
export interface ServiceEndpointPod {
  namespace: string;
  name: string;
  ip: string;
  labels: Readonly<Record<string, string>>;
  /** Container ports by name (a Service's `targetPort` may name one). */
  namedPorts: Readonly<Record<string, number>>;
}

interface ServiceWire {
  metadata: { name: string; namespace: string };
  spec?: { clusterIP?: string; selector?: Record<string, string>; ports?: { name?: string; port: number; protocol?: string; targetPort?: number | string }[] };
}

interface Listener {
  server: net.Server;
  namespace: string;
  service: string;
  selector: Record<string, string>;
  targetPort: number | string;
  next: number;
}

/**
 * kube-proxy for the test cluster, in its userspace form: every TCP port of every Service with a cluster IP gets a
 * listener on that IP in the root namespace (the address is added to the bridge, so the test process and, through
 * their route to the service range, the pods reach it), and each connection is relayed to a ready pod that the
 * Service's selector picks (round robin; a named `targetPort` is looked up in the pod's container ports). With no
 * ready pod the connection is closed at once, as kube-proxy rejects it. Services are read from the API server on
 * every `pass()`; a deleted Service's listeners close.
 */
export class ServiceProxy {
  private readonly listeners = new Map<string, Listener>();
  private readonly sockets = new Set<net.Socket>();
  private stopped = false;

  constructor(
    private readonly cp: ControlPlane,
    private readonly network: ClusterNetwork,
    /** The pods that are running and ready now. */
    private readonly readyPods: () => readonly ServiceEndpointPod[],
    private readonly log: (line: string) => void,
  ) {}

  async pass(): Promise<void> {
    if (this.stopped) return;
    const res = await this.cp.request('GET', '/api/v1/services');
    if (res.status !== 200) throw new Error(`list services: HTTP ${res.status}`);
    const wanted = new Set<string>();
    for (const svc of (res.body as { items?: ServiceWire[] }).items ?? []) {
      const ip = svc.spec?.clusterIP ?? '';
      if (!net.isIPv4(ip) || !this.network.inServiceRange(ip)) continue;
      for (const p of svc.spec?.ports ?? []) {
        if ((p.protocol ?? 'TCP') !== 'TCP') continue;
        const key = `${ip}:${p.port}`;
        wanted.add(key);
        const selector = svc.spec?.selector ?? {};
        const targetPort = p.targetPort ?? p.port;
        const existing = this.listeners.get(key);
        if (existing) {
          Object.assign(existing, { namespace: svc.metadata.namespace, service: svc.metadata.name, selector, targetPort });
          continue;
        }
        await this.network.addServiceAddress(ip);
        const l: Listener = { server: net.createServer((c) => this.relay(l, c)), namespace: svc.metadata.namespace, service: svc.metadata.name, selector, targetPort, next: 0 };
        await new Promise<void>((resolve, reject) => {
          l.server.once('error', reject);
          l.server.listen(p.port, ip, () => resolve());
        });
        this.listeners.set(key, l);
        this.log(`service ${svc.metadata.namespace}/${svc.metadata.name} listens on ${key}`);
      }
    }
    for (const [key, l] of this.listeners) {
      if (wanted.has(key)) continue;
      this.listeners.delete(key);
      l.server.close();
      this.log(`service ${l.namespace}/${l.service} on ${key} removed`);
    }
  }

  private relay(l: Listener, c: net.Socket): void {
    this.sockets.add(c);
    c.once('close', () => this.sockets.delete(c));
    const backends = this.readyPods()
      .filter((p) => p.namespace === l.namespace && Object.entries(l.selector).every(([k, v]) => p.labels[k] === v))
      .map((p) => ({ pod: p, port: typeof l.targetPort === 'number' || /^\d+$/.test(l.targetPort) ? Number(l.targetPort) : p.namedPorts[l.targetPort] }))
      .filter((b): b is { pod: ServiceEndpointPod; port: number } => typeof b.port === 'number' && b.port > 0);
    if (!backends.length) {
      this.log(`service ${l.namespace}/${l.service}: no ready endpoint, connection refused`);
      c.destroy();
      return;
    }
    const b = backends[l.next++ % backends.length]!;
    const up = net.connect(b.port, b.pod.ip);
    this.sockets.add(up);
    up.once('close', () => this.sockets.delete(up));
    relay(c, up);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const s of this.sockets) s.destroy();
    await Promise.all([...this.listeners.values()].map((l) => new Promise<void>((r) => l.server.close(() => r()))));
    this.listeners.clear();
  }
}
