import { type BackingImage, type BackingImageDataSource, type BackingImageManager, type BackupBackingImage, type BackupTarget, type Node, type Setting } from '../kinds/index.js';
import { type ObjectMeta } from '../meta.js';

const SHA512 = 'a'.repeat(128);
const NOW = '2026-11-22T10:00:00Z';

export function fullMeta(name: string): ObjectMeta {
  return {
    name,
    namespace: 'longhorn-system',
    uid: '6a7e0c1e-0000-4000-8000-000000000001',
    resourceVersion: '42',
    generation: 3,
    creationTimestamp: NOW,
    deletionTimestamp: null,
    labels: { 'longhorn.io/managed-by': 'longhorn-manager' },
    annotations: { note: 'x' },
    finalizers: ['longhorn.io'],
    ownerReferences: [
      { apiVersion: 'longhorn.io/v1beta2', kind: 'BackingImage', name: 'owner', uid: 'u-1', controller: true, blockOwnerDeletion: true },
    ],
  };
}

export function fullBackingImage(): BackingImage {
  return {
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'BackingImage',
    metadata: fullMeta('ubuntu-2404'),
    spec: {
      disks: { 'disk-uuid-1': '' },
      diskFileSpecMap: { 'disk-uuid-1': { evictionRequested: false, dataEngine: 'v1' } },
      checksum: SHA512,
      sourceType: 'download',
      sourceParameters: { url: 'https://images.example.com/ubuntu.qcow2' },
      minNumberOfCopies: 2,
      diskSelector: ['ssd'],
      nodeSelector: ['storage'],
      secret: '',
      secretNamespace: '',
      dataEngine: 'v1',
    },
    status: {
      ownerID: 'node-1',
      uuid: 'abcdef12',
      size: 9437307,
      virtualSize: 10737418240,
      realSize: 4194304,
      checksum: SHA512,
      diskFileStatusMap: {
        'disk-uuid-1': { dataEngine: 'v1', state: 'ready', progress: 100, message: '', lastStateTransitionTime: NOW, retryCount: 2, nextRetryAt: NOW },
      },
      diskLastRefAtMap: { 'disk-uuid-1': NOW },
      v2FirstCopyStatus: '',
      v2FirstCopyDisk: '',
      conditions: [{ type: 'MinCopiesSatisfiable', status: 'True', lastProbeTime: '', lastTransitionTime: NOW, reason: '', message: '' }],
    },
  };
}

export function fullBackingImageDataSource(): BackingImageDataSource {
  return {
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'BackingImageDataSource',
    metadata: fullMeta('ubuntu-2404'),
    spec: {
      nodeID: 'node-1',
      uuid: 'abcdef12',
      diskUUID: 'disk-uuid-1',
      diskPath: '/var/lib/longhorn',
      checksum: SHA512,
      sourceType: 'download',
      parameters: { url: 'https://images.example.com/ubuntu.qcow2' },
      fileTransferred: true,
    },
    status: {
      ownerID: 'node-1',
      runningParameters: { 'file-sync-http-client-timeout': '30' },
      currentState: 'ready-for-transfer',
      ip: '10.0.0.5',
      storageIP: '10.1.0.5',
      size: 9437307,
      progress: 100,
      checksum: SHA512,
      message: '',
      retryCount: 1,
      nextRetryAt: NOW,
    },
  };
}

export function fullBackingImageManager(): BackingImageManager {
  return {
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'BackingImageManager',
    metadata: fullMeta('bim-' + '0'.repeat(56)),
    spec: {
      image: 'registry.example.com/backing-image-manager:v1',
      nodeID: 'node-1',
      diskUUID: 'disk-uuid-1',
      diskPath: '/var/lib/longhorn',
      backingImages: { 'ubuntu-2404': 'abcdef12' },
    },
    status: {
      ownerID: 'node-1',
      currentState: 'running',
      backingImageFileMap: {
        'ubuntu-2404': {
          name: 'ubuntu-2404',
          uuid: 'abcdef12',
          size: 9437307,
          virtualSize: 10737418240,
          realSize: 4194304,
          state: 'in-progress',
          currentChecksum: '',
          message: '',
          sendingReference: 1,
          senderManagerAddress: '10.1.0.6:8000',
          progress: 42,
          retryCount: 3,
          nextRetryAt: NOW,
        },
      },
      ip: '10.0.0.5',
      storageIP: '10.1.0.5',
      apiMinVersion: 1,
      apiVersion: 3,
      message: '',
      diskScrub: { lastScrubTime: '2024-01-01T00:00:00.000Z', lastScrubResult: 'ok', lastScrubMessage: '', lastScrubFiles: 1, scrubbing: '' },
    },
  };
}

export function fullBackupBackingImage(): BackupBackingImage {
  return {
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'BackupBackingImage',
    metadata: fullMeta('ubuntu-2404-0a1b2c3d'),
    spec: {
      backingImage: 'ubuntu-2404',
      backupTargetName: 'default',
      syncRequestedAt: NOW,
      userCreated: true,
      labels: { team: 'vm' },
    },
    status: {
      backingImage: 'ubuntu-2404',
      ownerID: 'node-1',
      checksum: SHA512,
      url: 's3://bucket@us-east-1/?backingImage=ubuntu-2404',
      size: 9437307,
      labels: { team: 'vm' },
      state: 'Completed',
      progress: 100,
      error: '',
      messages: { info: 'synced' },
      managerAddress: '10.0.0.5:8000',
      backupCreatedAt: NOW,
      lastSyncedAt: NOW,
      compressionMethod: 'lz4',
      secret: '',
      secretNamespace: '',
    },
  };
}

export function fullSetting(): Setting {
  return {
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'Setting',
    metadata: fullMeta('default-min-number-of-backing-image-copies'),
    value: '3',
    status: { applied: true },
  };
}

export function fullNode(): Node {
  const condition = { type: 'Ready', status: 'True', lastProbeTime: '', lastTransitionTime: NOW, reason: '', message: '' };
  return {
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'Node',
    metadata: fullMeta('node-1'),
    spec: {
      name: 'node-1',
      disks: {
        'disk-1': {
          diskType: 'filesystem',
          diskDriver: '',
          path: '/var/lib/longhorn',
          allowScheduling: true,
          evictionRequested: false,
          storageReserved: 1073741824,
          tags: ['ssd'],
        },
      },
      allowScheduling: true,
      evictionRequested: false,
      tags: ['storage'],
      instanceManagerCPURequest: 0,
    },
    status: {
      conditions: [condition],
      diskStatus: {
        'disk-1': {
          conditions: [{ ...condition, type: 'Schedulable' }],
          storageAvailable: 50 * 2 ** 30,
          storageScheduled: 4194304,
          storageMaximum: 100 * 2 ** 30,
          scheduledReplica: { 'pvc-1-r-1': 2147483648 },
          scheduledBackingImage: { 'ubuntu-2404': 4194304 },
          diskUUID: 'disk-uuid-1',
          diskName: 'disk-1',
          diskPath: '/var/lib/longhorn',
          diskType: 'filesystem',
          diskDriver: '',
          filesystemType: 'ext4',
          instanceManagerName: 'instance-manager-1',
        },
      },
      region: 'eu',
      zone: 'eu-1',
      autoEvicting: false,
    },
  };
}

export function fullBackupTarget(): BackupTarget {
  return {
    apiVersion: 'longhorn.io/v1beta2',
    kind: 'BackupTarget',
    metadata: fullMeta('default'),
    spec: {
      backupTargetURL: 's3://bucket@us-east-1/',
      credentialSecret: 's3-secret',
      pollInterval: '5m0s',
      syncRequestedAt: null,
    },
    status: {
      ownerID: 'node-1',
      available: true,
      conditions: [
        { type: 'Unavailable', status: 'False', lastProbeTime: '', lastTransitionTime: NOW, reason: '', message: '' },
      ],
      lastSyncedAt: NOW,
    },
  };
}
