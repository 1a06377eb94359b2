import { formatHostPort } from '@bis/net-address';
import { CoreV1Api, Watch, type KubeConfig, type V1Pod, type V1Secret } from '@kubernetes/client-node';
import { Component, LabelKey } from '@bis/crd-types';
import { ApiAccess } from './api-access.js';
import { DATA_PLANE_PORT, SYNC_PORT, BIDS_CONTAINER, NETWORK_STATUS_ANNOTATION, STORAGE_NETWORK_INTERFACE, dataSourceCredentialSecret, dataSourceCredentialSecretName, dataSourcePodManifest, managerPodManifest, type DataSourcePodInput, type ManagerPodInput, type PodSettings } from './pod-manifests.js';
import { isApiException, withApiMessage } from './status-errors.js';

/** Same shape as `WorkloadStatus` of the controllers' `DataPlane` interface. */
export type WorkloadPhase = 'missing' | 'pending' | 'ready' | 'not-ready' | 'failed' | 'deleting';
export interface WorkloadStatus {
  phase: WorkloadPhase;
  nodeID: string;
  diskUUID: string;
  ip: string;
  address: string;
  syncAddress: string;
  message?: string;
}

/**
 * Longhorn's GetStorageIPFromPod: the first IP of the `lhnet1` interface in the Multus network-status annotation,
 * or the pod IP when the pod has no storage network (or the annotation cannot be read).
 */
export function storageIPFromPod(pod: V1Pod): string {
  const podIP = pod.status?.podIP ?? '';
  const raw = pod.metadata?.annotations?.[NETWORK_STATUS_ANNOTATION];
  if (!raw) return podIP;
  try {
    const nets = JSON.parse(raw) as unknown;
    if (!Array.isArray(nets)) return podIP;
    for (const n of nets as { interface?: unknown; ips?: unknown }[]) {
      if (n?.interface === STORAGE_NETWORK_INTERFACE && Array.isArray(n.ips) && typeof n.ips[0] === 'string' && n.ips[0]) return n.ips[0];
    }
  } catch {
    // Longhorn logs and falls back to the pod IP as well.
  }
  return podIP;
}

/**
 * Longhorn's pod evaluation (§3.2 step 7, §3.3 step 6) reduced to a phase: a pod on another node or for another disk
 * is `failed` (the controller deletes it); `Running` with every container ready is `ready`; `Pending` is `pending`;
 * `Failed`/`Succeeded` (restartPolicy Never: the process exited) is `failed`.
 */
export function workloadStatusFromPod(
  pod: V1Pod | undefined,
  expected: { nodeID: string; diskUUID: string; image?: string },
  ports: { api: number; sync: number } = { api: DATA_PLANE_PORT, sync: SYNC_PORT },
): WorkloadStatus {
  const base = { nodeID: expected.nodeID, diskUUID: expected.diskUUID, ip: '', address: '', syncAddress: '' };
  if (!pod) return { ...base, phase: 'missing' };
  if (pod.metadata?.deletionTimestamp) return { ...base, phase: 'deleting' };
  const labels = pod.metadata?.labels ?? {};
  if (pod.spec?.nodeName && pod.spec.nodeName !== expected.nodeID) {
    return { ...base, phase: 'failed', message: `pod ${pod.metadata?.name} runs on node ${pod.spec.nodeName}, expected ${expected.nodeID}` };
  }
  if (labels[LabelKey.DiskUUID] !== expected.diskUUID) {
    return { ...base, phase: 'failed', message: `pod ${pod.metadata?.name} is labelled for disk ${labels[LabelKey.DiskUUID] ?? '(none)'}, expected ${expected.diskUUID}` };
  }
  if (expected.image && pod.spec?.containers?.[0]?.image !== expected.image) {
    return { ...base, phase: 'not-ready', message: `pod ${pod.metadata?.name} runs image ${pod.spec?.containers?.[0]?.image}, expected ${expected.image}` };
  }
  const phase = pod.status?.phase;
  const ip = pod.status?.podIP ?? '';
  if (phase === 'Running') {
    const statuses = pod.status?.containerStatuses ?? [];
    const ready = statuses.length > 0 && statuses.every((c) => c.ready);
    // The API is reached at the pod IP; file transfers between managers use the storage network when there is one.
    if (ready && ip) return { ...base, phase: 'ready', ip, address: formatHostPort(ip, ports.api), syncAddress: formatHostPort(storageIPFromPod(pod), ports.sync) };
    return { ...base, phase: 'not-ready', ip };
  }
  if (phase === 'Pending' || phase === undefined) return { ...base, phase: 'pending' };
  const term = pod.status?.containerStatuses?.[0]?.state?.terminated;
  return { ...base, phase: 'failed', message: `pod ${pod.metadata?.name} is ${phase}${term ? ` (exit code ${term.exitCode}${term.reason ? `, ${term.reason}` : ''})` : ''}` };
}


export interface KubePodRuntimeOptions {
  kubeConfig: KubeConfig;
  settings: PodSettings;
  /**
   * Read before each pod is created: the pod settings that come from Longhorn settings (tolerations, node selector,
   * priority class, registry secret, pull policy, storage network), merged over `settings`.
   */
  settingsProvider?: () => Promise<Partial<PodSettings>>;
  /** Ports the data-plane servers listen on (Longhorn's fixed 8000 / 8001). */
  ports?: { api: number; sync: number };
  access?: ApiAccess;
  /** Delay before re-opening the pod watch after it ended. Default 1000 ms. */
  watchRetryMs?: number;
}

/**
 * The workload half of the controllers' `DataPlane` on Kubernetes: manager and data-source pods with Longhorn's
 * names, labels, ports and ownerReferences; pod phase and readiness give the workload phase; a pod watch reports
 * changes so the owning BIM / BIDS is reconciled at once.
 */
export class KubePodRuntime {
  private readonly core: CoreV1Api;
  private readonly watcher: Watch;
  private readonly access: ApiAccess;
  private readonly listeners = new Set<(kind: 'manager' | 'data-source', name: string) => void>();
  private watchAbort: AbortController | undefined;
  private stopped = false;

  constructor(private readonly opts: KubePodRuntimeOptions) {
    this.core = opts.kubeConfig.makeApiClient(CoreV1Api);
    this.watcher = new Watch(opts.kubeConfig);
    this.access = opts.access ?? new ApiAccess();
  }

  private get ns(): string {
    return this.opts.settings.namespace;
  }

  private async readPod(name: string): Promise<V1Pod | undefined> {
    this.access.require('', 'pods', 'get');
    try {
      return await this.core.readNamespacedPod({ name, namespace: this.ns });
    } catch (err) {
      if (isApiException(err) && err.code === 404) return undefined;
      throw withApiMessage(`read pod ${name}`, err);
    }
  }

  private async createPod(pod: V1Pod): Promise<void> {
    this.access.require('', 'pods', 'create');
    try {
      await this.core.createNamespacedPod({ namespace: this.ns, body: pod });
    } catch (err) {
      if (isApiException(err) && err.code === 409) return; // AlreadyExists is ignored, as in Longhorn
      throw withApiMessage(`create pod ${pod.metadata?.name ?? ''}`, err);
    }
  }

  private async deletePod(name: string): Promise<void> {
    this.access.require('', 'pods', 'delete');
    try {
      await this.core.deleteNamespacedPod({ name, namespace: this.ns });
    } catch (err) {
      if (isApiException(err) && err.code === 404) return;
      throw withApiMessage(`delete pod ${name}`, err);
    }
  }

  /** The last log lines of a container (Longhorn puts the data-source log into the failure message). */
  async containerLog(podName: string, container: string, tailLines = 20): Promise<string> {
    this.access.require('', 'pods/log', 'get');
    try {
      return String(await this.core.readNamespacedPodLog({ name: podName, namespace: this.ns, container, tailLines }));
    } catch (err) {
      if (isApiException(err) && err.code === 404) return 'pod log is not found';
      throw withApiMessage(`log of pod ${podName}`, err);
    }
  }

  async managerStatus(bim: { metadata: { name: string }; spec: { nodeID: string; diskUUID: string } }): Promise<WorkloadStatus> {
    return workloadStatusFromPod(await this.readPod(bim.metadata.name), bim.spec, this.opts.ports);
  }

  private async podSettings(): Promise<PodSettings> {
    const extra = this.opts.settingsProvider ? await this.opts.settingsProvider() : {};
    return { ...this.opts.settings, ...extra, namespace: this.ns };
  }

  async startManager(bim: ManagerPodInput): Promise<void> {
    return this.createPod(managerPodManifest(bim, await this.podSettings()));
  }

  deleteManager(bimName: string): Promise<void> {
    return this.deletePod(bimName);
  }

  async dataSourceStatus(bids: { metadata: { name: string }; spec: { nodeID: string; diskUUID: string } }): Promise<WorkloadStatus> {
    const podName = `backing-image-ds-${bids.metadata.name}`;
    const st = workloadStatusFromPod(await this.readPod(podName), bids.spec, this.opts.ports);
    if (st.phase === 'failed' && st.message?.includes(' is Failed')) {
      st.message = `the pod dedicated to prepare the first backing image file failed: ${await this.containerLog(podName, BIDS_CONTAINER)}`;
    }
    return st;
  }

  async startDataSource(ds: DataSourcePodInput): Promise<void> {
    const settings = await this.podSettings();
    if (Object.keys(ds.credentials).length > 0) await this.putSecret(dataSourceCredentialSecret(ds, this.ns));
    return this.createPod(dataSourcePodManifest(ds, settings));
  }

  async deleteDataSource(bidsName: string): Promise<void> {
    await this.deletePod(`backing-image-ds-${bidsName}`);
    await this.deleteSecret(dataSourceCredentialSecretName(bidsName));
  }

  /** Creates the Secret, or replaces the one left by an earlier attempt (the credential may have changed). */
  private async putSecret(secret: V1Secret): Promise<void> {
    const name = secret.metadata?.name ?? '';
    this.access.require('', 'secrets', 'create');
    try {
      await this.core.createNamespacedSecret({ namespace: this.ns, body: secret });
      return;
    } catch (err) {
      if (!(isApiException(err) && err.code === 409)) throw withApiMessage(`create secret ${name}`, err);
    }
    this.access.require('', 'secrets', 'update');
    try {
      await this.core.replaceNamespacedSecret({ name, namespace: this.ns, body: secret });
    } catch (err) {
      throw withApiMessage(`replace secret ${name}`, err);
    }
  }

  private async deleteSecret(name: string): Promise<void> {
    this.access.require('', 'secrets', 'delete');
    try {
      await this.core.deleteNamespacedSecret({ name, namespace: this.ns });
    } catch (err) {
      if (isApiException(err) && err.code === 404) return;
      throw withApiMessage(`delete secret ${name}`, err);
    }
  }

  /** Subscribes to pod changes of both components; the watch starts with the first listener. */
  onWorkloadChange(listener: (kind: 'manager' | 'data-source', name: string) => void): () => void {
    this.listeners.add(listener);
    // runWatch() loops until stopped, reconnecting after every failure of the watch.
    if (!this.watchAbort && !this.stopped) void this.runWatch();
    return () => {
      this.listeners.delete(listener);
    };
  }

  private async runWatch(): Promise<void> {
    this.access.require('', 'pods', 'watch');
    const labelSelector = `${LabelKey.Component} in (${Component.BackingImageManager},${Component.BackingImageDataSource})`;
    while (!this.stopped) {
      const ac = new AbortController();
      this.watchAbort = ac;
      await new Promise<void>((resolve) => {
        // Both outcomes are handled below.
        void this.watcher
          .watch(
            `/api/v1/namespaces/${encodeURIComponent(this.ns)}/pods`,
            { labelSelector },
            (_type: string, pod: V1Pod) => this.notify(pod),
            () => resolve(),
          )
          .then((c) => {
            ac.signal.addEventListener('abort', () => c.abort(), { once: true });
            if (ac.signal.aborted) c.abort();
          }, () => resolve());
        ac.signal.addEventListener('abort', () => resolve(), { once: true });
      });
      if (this.stopped) break;
      await new Promise((r) => setTimeout(r, this.opts.watchRetryMs ?? 1000));
    }
  }

  private notify(pod: V1Pod): void {
    const labels = pod.metadata?.labels ?? {};
    const c = labels[LabelKey.Component];
    const name = c === Component.BackingImageManager ? pod.metadata?.name : labels[LabelKey.BackingImageDataSource];
    if (!name) return;
    const kind = c === Component.BackingImageManager ? 'manager' : 'data-source';
    for (const l of this.listeners) l(kind, name);
  }

  stop(): void {
    this.stopped = true;
    this.watchAbort?.abort();
  }
}
