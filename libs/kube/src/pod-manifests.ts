import type { V1Container, V1Pod, V1Secret, V1Toleration, V1Volume, V1VolumeMount } from '@kubernetes/client-node';
import { DATA_SOURCE_CREDENTIAL_ENV, DATA_SOURCE_MALLOC_ENV, managerLaunchArgs, type ManagerLaunch } from '@bis/controllers';
import {
  LONGHORN_API_VERSION,
  backingImageDataSourcePodLabels,
  backingImageDataSourcePodName,
  backingImageManagerLabels,
  backingImageManagerPodName,
} from '@bis/crd-types';

/** Ports of both data-plane servers (Longhorn's): gRPC or data-source HTTP on 8000, sync HTTP on 8001. */
export const DATA_PLANE_PORT = 8000;
export const SYNC_PORT = 8001;
export const BIM_CONTAINER = 'backing-image-manager';
export const BIDS_CONTAINER = 'backing-image-data-source';
export const LAST_APPLIED_TOLERATIONS_ANNOTATION = 'longhorn.io/last-applied-tolerations';
export const STORAGE_NETWORK_ANNOTATION = 'k8s.v1.cni.cncf.io/networks';
/** Multus writes the attached interfaces and their IPs here; Longhorn reads the storage IP of `lhnet1` from it. */
export const NETWORK_STATUS_ANNOTATION = 'k8s.v1.cni.cncf.io/network-status';
export const STORAGE_NETWORK_INTERFACE = 'lhnet1';
/** Executables in the backing-image-manager image. */
export const MANAGER_BINARY = 'backing-image-manager';
export const DATA_SOURCE_BINARY = 'backing-image-data-source';

/** Pod settings that come from Longhorn settings and the chart (§1.8 taint-toleration … system-managed-pods-image-pull-policy). */
export interface PodSettings {
  namespace: string;
  serviceAccountName: string;
  tolerations?: V1Toleration[];
  nodeSelector?: Record<string, string>;
  priorityClassName?: string;
  /** Secret name of the `registry-secret` setting. */
  registrySecret?: string;
  /** Longhorn setting values `if-not-present` / `always` / `never`. */
  imagePullPolicy?: 'if-not-present' | 'always' | 'never';
  /** `storage-network` setting (`<namespace>/<NetworkAttachmentDefinition>`); empty = pod network. */
  storageNetwork?: string;
  /**
   * The Secret holding the internal token (key `token`): mounted read-only into every pod and passed as
   * `--internal-token-file`, so the pod's servers refuse callers without it. Unset: the pods check nothing.
   */
  internalTokenSecret?: string;
  /** `--allow-unauthenticated-internal-calls`: the pods also admit callers that send no token (Longhorn's Go components). */
  allowUnauthenticatedInternalCalls?: boolean;
  /**
   * `--allow-source-hosts` of the data-source pods: host names, IPs or CIDRs a download may reach although private
   * (an internal mirror). Empty: private, loopback and metadata addresses are refused.
   */
  allowSourceHosts?: readonly string[];
}

/** Where the internal token's Secret is mounted in manager and data-source pods. */
export const INTERNAL_AUTH_MOUNT = '/etc/backing-image-system/internal-auth';
/** The token file in that mount (the Secret's key `token`). */
export const INTERNAL_TOKEN_FILE = `${INTERNAL_AUTH_MOUNT}/token`;
const INTERNAL_AUTH_VOLUME = 'internal-auth';

/** The fields of a BackingImageManager the pod is made from. */
export interface ManagerPodInput {
  name: string;
  uid: string;
  image: string;
  nodeID: string;
  diskUUID: string;
  diskPath: string;
  /** Settings the manager takes at its start (`--scrub-interval`, `--scrub-bandwidth`), as in standalone mode. */
  launch?: ManagerLaunch;
}

/** The fields of a BackingImageDataSource the pod is made from, with the command-line inputs. */
export interface DataSourcePodInput {
  name: string;
  uid: string;
  image: string;
  nodeID: string;
  diskUUID: string;
  diskPath: string;
  uuid: string;
  sourceType: string;
  parameters: Record<string, string>;
  checksum: string;
  credentials: Record<string, string>;
  dataEngine?: 'v1' | 'v2';
  /** `--max-size`: the backing-image-max-size setting (bytes). */
  maxImageSize?: number;
  /** `--storage-reserved`: the disk's storageReserved (bytes). */
  storageReserved?: number;
}

const pullPolicy = (p: PodSettings['imagePullPolicy']): V1Container['imagePullPolicy'] =>
  p === 'always' ? 'Always' : p === 'never' ? 'Never' : 'IfNotPresent';

function dedupTolerations(t: V1Toleration[] = []): V1Toleration[] {
  const seen = new Set<string>();
  return t.filter((x) => {
    const k = JSON.stringify([x.key ?? '', x.operator ?? '', x.value ?? '', x.effect ?? '']);
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
}

function commonPod(name: string, labels: Record<string, string>, owner: { kind: string; name: string; uid: string }, nodeID: string, s: PodSettings, container: V1Container, volumes: V1Volume[]): V1Pod {
  const tolerations = dedupTolerations(s.tolerations);
  const annotations: Record<string, string> = { [LAST_APPLIED_TOLERATIONS_ANNOTATION]: JSON.stringify(tolerations) };
  if (s.storageNetwork) annotations[STORAGE_NETWORK_ANNOTATION] = JSON.stringify([{ name: s.storageNetwork, interface: STORAGE_NETWORK_INTERFACE }]);
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name,
      namespace: s.namespace,
      labels,
      annotations,
      ownerReferences: [{ apiVersion: LONGHORN_API_VERSION, kind: owner.kind, name: owner.name, uid: owner.uid, controller: true, blockOwnerDeletion: true }],
    },
    spec: {
      serviceAccountName: s.serviceAccountName,
      ...(tolerations.length ? { tolerations } : {}),
      ...(s.nodeSelector && Object.keys(s.nodeSelector).length ? { nodeSelector: s.nodeSelector } : {}),
      ...(s.priorityClassName ? { priorityClassName: s.priorityClassName } : {}),
      ...(s.registrySecret ? { imagePullSecrets: [{ name: s.registrySecret }] } : {}),
      nodeName: nodeID,
      restartPolicy: 'Never',
      containers: [container],
      volumes,
    },
  };
}

function container(name: string, image: string, command: string[], s: PodSettings, mounts: V1VolumeMount[]): V1Container {
  return {
    name,
    image,
    imagePullPolicy: pullPolicy(s.imagePullPolicy),
    command,
    securityContext: { privileged: true },
    env: [{ name: 'POD_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } }],
    ports: [
      { name: 'api', containerPort: DATA_PLANE_PORT },
      { name: 'sync', containerPort: SYNC_PORT },
    ],
    readinessProbe: { tcpSocket: { port: DATA_PLANE_PORT }, initialDelaySeconds: 3, periodSeconds: 5, timeoutSeconds: 4, failureThreshold: 3 },
    volumeMounts: mounts,
  };
}

const diskVolume = (diskPath: string): V1Volume => ({ name: 'disk-path', hostPath: { path: diskPath } });

/** Adds the internal token (secret volume, read-only mount, flags) to a pod's container and volumes. */
function withInternalAuth(c: V1Container, volumes: V1Volume[], s: PodSettings): void {
  if (!s.internalTokenSecret) return;
  c.command = [...(c.command ?? []), '--internal-token-file', INTERNAL_TOKEN_FILE, ...(s.allowUnauthenticatedInternalCalls ? ['--allow-unauthenticated-internal-calls'] : [])];
  c.volumeMounts = [...(c.volumeMounts ?? []), { name: INTERNAL_AUTH_VOLUME, mountPath: INTERNAL_AUTH_MOUNT, readOnly: true }];
  volumes.push({ name: INTERNAL_AUTH_VOLUME, secret: { secretName: s.internalTokenSecret, items: [{ key: 'token', path: 'token' }], defaultMode: 0o400 } });
}

/** Longhorn's backing-image-manager pod: one per (image, disk), pinned to the node, the disk at `/data/`. */
export function managerPodManifest(bim: ManagerPodInput, s: PodSettings): V1Pod {
  const c = container(BIM_CONTAINER, bim.image, [MANAGER_BINARY, '--debug', 'daemon', '--listen', `:${DATA_PLANE_PORT}`, '--sync-listen', `:${SYNC_PORT}`], s, [
    { name: 'disk-path', mountPath: '/data/' },
  ]);
  c.command = [...(c.command ?? []), ...managerLaunchArgs(bim.launch)];
  const volumes = [diskVolume(bim.diskPath)];
  withInternalAuth(c, volumes, s);
  return commonPod(backingImageManagerPodName(bim.name), backingImageManagerLabels(bim.nodeID, bim.diskUUID), { kind: 'BackingImageManager', name: bim.name, uid: bim.uid }, bim.nodeID, s, c, volumes);
}

/** Longhorn's data-source pod `backing-image-ds-<name>` producing the first file of a backing image. */
export function dataSourcePodManifest(ds: DataSourcePodInput, s: PodSettings): V1Pod {
  // Deviation from Longhorn (`backing-image-manager --debug data-source …`): the data source is its own binary,
  // `backing-image-data-source`, shipped in the same image; the arguments are Longhorn's.
  const cmd = [DATA_SOURCE_BINARY, '--debug', '--listen', `:${DATA_PLANE_PORT}`, '--sync-listen', `:${SYNC_PORT}`, '--name', ds.name, '--uuid', ds.uuid, '--source-type', ds.sourceType];
  for (const [k, v] of Object.entries(ds.parameters)) cmd.push('--parameters', `${k}=${v}`);
  if (ds.dataEngine === 'v2') cmd.push('--parameters', 'data-engine=v2');
  if (ds.checksum) cmd.push('--checksum', ds.checksum);
  if (ds.maxImageSize !== undefined) cmd.push('--max-size', String(ds.maxImageSize));
  if (ds.storageReserved !== undefined) cmd.push('--storage-reserved', String(ds.storageReserved));
  if (s.allowSourceHosts?.length) cmd.push('--allow-source-hosts', s.allowSourceHosts.join(','));
  const c = container(BIDS_CONTAINER, ds.image, cmd, s, [
    { name: 'disk-path', mountPath: '/data/' },
    { name: 'host-dev', mountPath: '/dev' },
    { name: 'host-proc', mountPath: '/host/proc' },
  ]);
  c.env = [...(c.env ?? []), ...Object.entries(DATA_SOURCE_MALLOC_ENV).map(([name, value]) => ({ name, value }))];
  // Deviation from Longhorn (`--credential k=v`): the credential goes by environment, never on the command line, and
  // the environment takes it from the data source's own Secret (dataSourceCredentialSecret), so reading the pod
  // (get/list pods) does not reveal it.
  if (Object.keys(ds.credentials).length > 0) {
    c.env = [...(c.env ?? []), { name: DATA_SOURCE_CREDENTIAL_ENV, valueFrom: { secretKeyRef: { name: dataSourceCredentialSecretName(ds.name), key: DATA_SOURCE_CREDENTIAL_KEY } } }];
  }
  const volumes: V1Volume[] = [diskVolume(ds.diskPath), { name: 'host-dev', hostPath: { path: '/dev' } }, { name: 'host-proc', hostPath: { path: '/proc' } }];
  withInternalAuth(c, volumes, s);
  return commonPod(backingImageDataSourcePodName(ds.name), backingImageDataSourcePodLabels(ds.name, ds.nodeID, ds.diskUUID), { kind: 'BackingImageDataSource', name: ds.name, uid: ds.uid }, ds.nodeID, s, c, volumes);
}

/** The key of the data source's credential Secret: the credential map as JSON (what the data source reads from its environment). */
export const DATA_SOURCE_CREDENTIAL_KEY = 'credential';

/** The Secret holding a data source's credential: `backing-image-ds-<name>-credential`. */
export function dataSourceCredentialSecretName(bidsName: string): string {
  return `${backingImageDataSourcePodName(bidsName)}-credential`;
}

/**
 * The Secret a data-source pod takes its credential from (env `valueFrom.secretKeyRef`). It is owned by the
 * BackingImageDataSource (garbage-collected with it) and deleted with the pod.
 */
export function dataSourceCredentialSecret(ds: Pick<DataSourcePodInput, 'name' | 'uid' | 'nodeID' | 'diskUUID' | 'credentials'>, namespace: string): V1Secret {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    type: 'Opaque',
    metadata: {
      name: dataSourceCredentialSecretName(ds.name),
      namespace,
      labels: backingImageDataSourcePodLabels(ds.name, ds.nodeID, ds.diskUUID),
      ownerReferences: [{ apiVersion: LONGHORN_API_VERSION, kind: 'BackingImageDataSource', name: ds.name, uid: ds.uid }],
    },
    data: { [DATA_SOURCE_CREDENTIAL_KEY]: Buffer.from(JSON.stringify(ds.credentials)).toString('base64') },
  };
}
