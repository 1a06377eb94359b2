import { DataSourceClient } from '@bis/data-source-api';
import type { V1Toleration } from '@kubernetes/client-node';
import { ManagerClient } from '@bis/bimrpc';
import {
  SettingKind,
  managerApiFromClient,
  type BackingImageDataSource,
  type BackingImageManager,
  type BackupTargetApi,
  type DataPlane,
  type DataSourceApi,
  type DataSourceLaunch,
  type ManagerApi,
  type ManagerLaunch,
  type WorkloadStatus,
} from '@bis/controllers';
import { isNotFound, type Datastore } from '@bis/datastore';
import type { PodSettings } from './pod-manifests.js';

/** The setting that turns on `--allow-unauthenticated-internal-calls` for new manager and data-source pods. */
export const ALLOW_UNAUTHENTICATED_INTERNAL_CALLS_SETTING = 'allow-unauthenticated-internal-calls';
import { KubePodRuntime, type KubePodRuntimeOptions } from './pod-runtime.js';

export interface KubeDataPlaneOptions extends KubePodRuntimeOptions {
  /** Image of the data-source pods (Longhorn: the default-backing-image-manager-image). */
  managerImage: string;
  /** Timeout of each manager gRPC call. Default 60 s. */
  callTimeoutMs?: number;
  /**
   * The system's internal token, sent as `authorization: Bearer <token>` to the managers (gRPC metadata) and the
   * data sources (HTTP). The pods get it from the Secret named in `settings.internalTokenSecret`.
   */
  internalToken?: string;
  /** Backup-target operations (the composition root gives `backupTargetOperations` of `@bis/backupstore`). */
  backupTarget: BackupTargetApi;
}

/**
 * The controllers' `DataPlane` on Kubernetes: manager and data-source pods through `KubePodRuntime`, a gRPC client
 * per manager pod at `<podIP>:8000`, the data source's HTTP API at `<podIP>:8000`, backup targets through the
 * operations it is given (Longhorn runs those through its engine binary in the manager container).
 */
export class KubeDataPlane implements DataPlane {
  readonly pods: KubePodRuntime;
  private readonly clients = new Map<string, ManagerClient>();

  constructor(private readonly opts: KubeDataPlaneOptions) {
    this.pods = new KubePodRuntime(opts);
  }

  managerStatus(bim: BackingImageManager): Promise<WorkloadStatus> {
    return this.pods.managerStatus({ metadata: bim.metadata, spec: { nodeID: bim.spec?.nodeID ?? '', diskUUID: bim.spec?.diskUUID ?? '' } });
  }

  async startManager(bim: BackingImageManager, launch?: ManagerLaunch): Promise<void> {
    const uid = bim.metadata.uid;
    if (!uid) throw new Error(`backing image manager ${bim.metadata.name} has no uid: its pod needs an owner reference`);
    await this.pods.startManager({
      name: bim.metadata.name,
      uid,
      image: bim.spec?.image ?? '',
      nodeID: bim.spec?.nodeID ?? '',
      diskUUID: bim.spec?.diskUUID ?? '',
      diskPath: bim.spec?.diskPath ?? '',
      ...(launch ? { launch } : {}),
    });
  }

  async deleteManager(bimName: string): Promise<void> {
    await this.pods.deleteManager(bimName);
  }

  managerClient(address: string): ManagerApi {
    let c = this.clients.get(address);
    if (!c) this.clients.set(address, (c = new ManagerClient(address, { callTimeoutMs: this.opts.callTimeoutMs ?? 60_000, token: this.opts.internalToken })));
    return managerApiFromClient(c);
  }

  dataSourceStatus(bids: BackingImageDataSource): Promise<WorkloadStatus> {
    return this.pods.dataSourceStatus({ metadata: bids.metadata, spec: { nodeID: bids.spec?.nodeID ?? '', diskUUID: bids.spec?.diskUUID ?? '' } });
  }

  async startDataSource(bids: BackingImageDataSource, launch: DataSourceLaunch): Promise<'started' | 'deferred'> {
    const uid = bids.metadata.uid;
    if (!uid) throw new Error(`backing image data source ${bids.metadata.name} has no uid: its pod needs an owner reference`);
    await this.pods.startDataSource({
      name: bids.metadata.name,
      uid,
      image: this.opts.managerImage,
      nodeID: bids.spec?.nodeID ?? '',
      diskUUID: bids.spec?.diskUUID ?? '',
      diskPath: launch.diskPath,
      uuid: launch.uuid,
      sourceType: launch.sourceType,
      parameters: launch.parameters,
      checksum: launch.checksum,
      credentials: launch.credentials,
      maxImageSize: launch.maxImageSize,
      storageReserved: launch.storageReserved,
    });
    return 'started';
  }

  async deleteDataSource(bidsName: string): Promise<void> {
    await this.pods.deleteDataSource(bidsName);
  }

  dataSourceClient(address: string): DataSourceApi {
    return new DataSourceClient(address, { token: this.opts.internalToken });
  }

  get backupTarget(): BackupTargetApi {
    return this.opts.backupTarget;
  }

  onWorkloadChange(listener: (kind: 'manager' | 'data-source', name: string) => void): () => void {
    return this.pods.onWorkloadChange(listener);
  }

  /** Stops the pod watch and closes every gRPC channel (pods keep running). */
  close(): void {
    this.pods.stop();
    for (const c of this.clients.values()) c.close();
    this.clients.clear();
  }
}

/** Longhorn's `taint-toleration` value: `key=value:Effect` / `key:Effect` / `:Effect` items separated by `;`. */
export function parseTaintToleration(value: string): V1Toleration[] {
  const out: V1Toleration[] = [];
  for (const item of value.split(';').map((s) => s.trim()).filter(Boolean)) {
    const colon = item.lastIndexOf(':');
    if (colon < 0) throw new Error(`invalid taint-toleration "${item}": expected key=value:effect or key:effect`);
    const kv = item.slice(0, colon);
    const effect = item.slice(colon + 1);
    if (effect && !['NoSchedule', 'PreferNoSchedule', 'NoExecute'].includes(effect)) throw new Error(`invalid taint-toleration "${item}": unknown effect ${effect}`);
    const eq = kv.indexOf('=');
    const t: V1Toleration = eq >= 0 ? { key: kv.slice(0, eq), operator: 'Equal', value: kv.slice(eq + 1) } : kv ? { key: kv, operator: 'Exists' } : { operator: 'Exists' };
    if (effect) t.effect = effect;
    out.push(t);
  }
  return out;
}

/** Longhorn's `system-managed-components-node-selector` value: `key:value` (or `key=value`) items separated by `;`. */
export function parseNodeSelector(value: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of value.split(';').map((s) => s.trim()).filter(Boolean)) {
    const m = /^([^:=]+)[:=](.*)$/.exec(item);
    if (!m) throw new Error(`invalid node selector "${item}": expected key:value`);
    out[m[1]!.trim()] = m[2]!.trim();
  }
  return out;
}

/**
 * Reads the Longhorn settings that shape the data-plane pods from the datastore (Setting objects; a missing one
 * keeps the chart's value). An unparsable value is an error naming the setting, so no pod is created without it.
 */
export function podSettingsFromStore(store: Datastore, namespace: string): () => Promise<Partial<PodSettings>> {
  const read = async (name: string): Promise<string | undefined> => {
    try {
      const s = await store.get(SettingKind, name, namespace);
      return typeof s.value === 'string' ? s.value : undefined;
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw err;
    }
  };
  return async () => {
    const out: Partial<PodSettings> = {};
    const tol = await read('taint-toleration');
    if (tol !== undefined) out.tolerations = parseTaintToleration(tol);
    const sel = await read('system-managed-components-node-selector');
    if (sel !== undefined) out.nodeSelector = parseNodeSelector(sel);
    const pc = await read('priority-class');
    if (pc !== undefined) out.priorityClassName = pc;
    const reg = await read('registry-secret');
    if (reg !== undefined) out.registrySecret = reg;
    const pull = await read('system-managed-pods-image-pull-policy');
    if (pull === 'always' || pull === 'never' || pull === 'if-not-present') out.imagePullPolicy = pull;
    const net = await read('storage-network');
    if (net !== undefined) out.storageNetwork = net;
    // The opt-in is on when the daemon flag or the setting says so (the setting never turns the flag off).
    if ((await read(ALLOW_UNAUTHENTICATED_INTERNAL_CALLS_SETTING))?.trim().toLowerCase() === 'true') out.allowUnauthenticatedInternalCalls = true;
    return out;
  };
}
