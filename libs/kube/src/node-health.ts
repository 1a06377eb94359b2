import { CoreV1Api, Watch, type KubeConfig, type V1Node, type V1Pod } from '@kubernetes/client-node';
import type { Condition } from '@bis/crd-types';
import { NodeKind, type Logger, type Node } from '@bis/controllers';
import { isConflict, isNotFound, type Datastore } from '@bis/datastore';
import { ApiAccess } from './api-access.js';
import { CoalescedRun } from './coalesced-run.js';

/** Label selector of the chart's controller-manager DaemonSet pods. */
export const DEFAULT_MANAGER_POD_SELECTOR = 'app=backing-image-system-manager';

/** Longhorn's reasons for a Node record's `Ready=False` that make the node "unavailable" for ownership. */
export type NodeDownReason = 'KubernetesNodeGone' | 'KubernetesNodeNotReady' | 'ManagerPodMissing';

export interface NodeHealth {
  ready: boolean;
  reason: NodeDownReason | '';
  message: string;
}

const podReady = (p: V1Pod): boolean => {
  if (p.metadata?.deletionTimestamp || p.status?.phase !== 'Running') return false;
  const cond = p.status?.conditions?.find((c) => c.type === 'Ready');
  if (cond) return cond.status === 'True';
  const cs = p.status?.containerStatuses ?? [];
  return cs.length > 0 && cs.every((c) => c.ready);
};

/**
 * The health of one Longhorn node, as Longhorn's node controller judges it (the later check wins there, so the
 * order of precedence is): Kubernetes Node missing → `KubernetesNodeGone`; its `Ready` condition not `True` →
 * `KubernetesNodeNotReady`; no running, ready controller-manager pod on the node → `ManagerPodMissing`.
 */
export function nodeHealth(nodeName: string, kubeNode: V1Node | undefined, managerPods: readonly V1Pod[]): NodeHealth {
  if (!kubeNode) {
    return { ready: false, reason: 'KubernetesNodeGone', message: `Kubernetes node missing: node ${nodeName} has been removed from the cluster and there is no manager pod running on it` };
  }
  const kr = kubeNode.status?.conditions?.find((c) => c.type === 'Ready');
  if (kr?.status !== 'True') {
    const why = kr ? `${kr.reason ?? ''}${kr.message ? `: ${kr.message}` : ''}` || `Ready=${kr.status}` : 'no Ready condition';
    return { ready: false, reason: 'KubernetesNodeNotReady', message: `Kubernetes node ${nodeName} not ready: ${why}` };
  }
  if (!managerPods.some((p) => p.spec?.nodeName === nodeName && podReady(p))) {
    return { ready: false, reason: 'ManagerPodMissing', message: `manager pod missing: node ${nodeName} has no running, ready manager pod` };
  }
  return { ready: true, reason: '', message: '' };
}

const rfc3339 = (d: Date): string => d.toISOString().replace(/\.\d{3}Z$/, 'Z');

/** The Node record's conditions with `Ready` set to `health`, or undefined when `Ready` already says exactly that. */
export function withReadyCondition(prev: readonly Condition[] | null | undefined, health: NodeHealth, now: Date = new Date()): Condition[] | undefined {
  const status = health.ready ? 'True' : 'False';
  const old = prev?.find((c) => c.type === 'Ready');
  if (old && old.status === status && (old.reason ?? '') === health.reason && (old.message ?? '') === health.message) return undefined;
  const ready: Condition = {
    type: 'Ready',
    status,
    reason: health.reason,
    message: health.message,
    lastProbeTime: '',
    lastTransitionTime: old && old.status === status ? (old.lastTransitionTime ?? rfc3339(now)) : rfc3339(now),
  };
  const rest = (prev ?? []).filter((c) => c.type !== 'Ready');
  return [ready, ...rest];
}

export interface NodeHealthMonitorOptions {
  kubeConfig: KubeConfig;
  store: Datastore;
  /** Namespace of the Longhorn Node records and of the controller-manager pods. */
  namespace: string;
  /** Label selector of the controller-manager DaemonSet pods (default `app=backing-image-system-manager`). */
  managerPodSelector?: string;
  /** Full re-check period (Longhorn's node resync: 30 s); watches trigger a check in between. */
  resyncMs?: number;
  /** Delay before re-opening a watch the server ended. Default 1000 ms. */
  watchRetryMs?: number;
  access?: ApiAccess;
  log?: Logger;
}

/**
 * Marks Longhorn Node records down and up: watches the Kubernetes `nodes` and the controller-manager pods, and sets
 * every Node record's `Ready` condition (`False` with `KubernetesNodeGone`, `KubernetesNodeNotReady` or
 * `ManagerPodMissing`, or `True`). Every daemon instance runs one; a write happens only when the condition differs,
 * and a conflict re-reads the record and re-decides, so concurrent instances converge on the same value.
 */
export class NodeHealthMonitor {
  private readonly core: CoreV1Api;
  private readonly watcher: Watch;
  private readonly access: ApiAccess;
  private readonly aborts = new Set<AbortController>();
  private timer: NodeJS.Timeout | undefined;
  private readonly runs = new CoalescedRun(
    () => this.sync(),
    (err) => this.o.log?.warn(`node health check failed: ${err.message}`),
    () => this.stopped,
  );
  private stopped = false;

  constructor(private readonly o: NodeHealthMonitorOptions) {
    this.core = o.kubeConfig.makeApiClient(CoreV1Api);
    this.watcher = new Watch(o.kubeConfig);
    this.access = o.access ?? new ApiAccess();
  }

  private get selector(): string {
    return this.o.managerPodSelector ?? DEFAULT_MANAGER_POD_SELECTOR;
  }

  /** One check now, then watches and the periodic check. A failing first check is logged, not thrown. */
  async start(): Promise<void> {
    this.access.require('', 'nodes', 'watch');
    this.access.require('', 'pods', 'watch');
    // runWatch() loops until stopped, reconnecting after every failure of the watch.
    void this.runWatch('/api/v1/nodes', {});
    void this.runWatch(`/api/v1/namespaces/${encodeURIComponent(this.o.namespace)}/pods`, { labelSelector: this.selector });
    await this.trigger();
    this.schedule();
  }

  private schedule(): void {
    if (this.stopped) return;
    // trigger() never rejects: CoalescedRun passes a failure to onError (the log).
    this.timer = setTimeout(() => void this.trigger().finally(() => this.schedule()), this.o.resyncMs ?? 30_000);
    this.timer.unref();
  }

  private async runWatch(path: string, query: Record<string, string>): Promise<void> {
    while (!this.stopped) {
      const ac = new AbortController();
      this.aborts.add(ac);
      await new Promise<void>((resolve) => {
        // Both outcomes of watch() are handled below; trigger() never rejects (CoalescedRun logs failures).
        void this.watcher.watch(path, query, () => void this.trigger(), () => resolve()).then(
          (c) => {
            ac.signal.addEventListener('abort', () => c.abort(), { once: true });
            if (ac.signal.aborted) c.abort();
          },
          () => resolve(),
        );
        ac.signal.addEventListener('abort', () => resolve(), { once: true });
      });
      this.aborts.delete(ac);
      if (this.stopped) break;
      await new Promise((r) => setTimeout(r, this.o.watchRetryMs ?? 1000));
    }
  }

  /** Runs a check now (coalesced with one that is running). Never rejects. */
  trigger(): Promise<void> {
    if (this.stopped) return Promise.resolve();
    return this.runs.trigger();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    for (const a of this.aborts) a.abort();
    await this.runs.running;
  }

  /** One pass over every Longhorn Node record of the namespace. */
  async sync(): Promise<void> {
    this.access.require('', 'nodes', 'list');
    this.access.require('', 'pods', 'list');
    const [kubeNodes, pods, records] = await Promise.all([
      this.core.listNode(),
      this.core.listNamespacedPod({ namespace: this.o.namespace, labelSelector: this.selector }),
      this.o.store.list(NodeKind, { namespace: this.o.namespace }),
    ]);
    const byName = new Map(kubeNodes.items.map((n) => [n.metadata?.name ?? '', n]));
    for (const rec of records.items) {
      const name = rec.metadata.name;
      await this.writeReady(rec, nodeHealth(name, byName.get(name), pods.items));
    }
  }

  private async writeReady(rec: Node, health: NodeHealth): Promise<void> {
    let node = rec;
    for (let attempt = 0; attempt < 5; attempt++) {
      const conditions = withReadyCondition(node.status?.conditions, health);
      if (!conditions) return;
      try {
        await this.o.store.updateStatus(NodeKind, { ...node, status: { ...node.status, conditions } });
        this.o.log?.info(`node ${node.metadata.name}: Ready=${health.ready ? 'True' : `False (${health.reason})`}`);
        return;
      } catch (err) {
        if (isNotFound(err)) return;
        if (!isConflict(err)) throw err;
      }
      try {
        node = await this.o.store.get(NodeKind, rec.metadata.name, this.o.namespace);
      } catch (err) {
        if (isNotFound(err)) return;
        throw err;
      }
    }
    // Another writer kept changing the record; the next pass (watch event or resync) decides again.
  }
}
