import type { Condition } from '@bis/crd-types';
import { sameValue } from '@bis/datastore';
import { diskHasError } from './disk-errors.js';
import type { Node } from './kinds.js';

/** One disk of a node as the controllers see it. */
export interface DiskInfo {
  nodeID: string;
  diskName: string;
  diskUUID: string;
  path: string;
  diskType: string;
  tags: string[];
  allowScheduling: boolean;
  evictionRequested: boolean;
  /** Bytes kept free of replicas and backing images (`spec.disks[].storageReserved`). */
  storageReserved: number;
  ready: boolean;
  schedulable: boolean;
  /** False while the disk shows a disk error (ENOSPC, EIO, permissions): no new copy goes there until it recovers. */
  healthy: boolean;
}

export interface NodeInfo {
  name: string;
  ready: boolean;
  schedulable: boolean;
  allowScheduling: boolean;
  evictionRequested: boolean;
  tags: string[];
  disks: DiskInfo[];
}

const condTrue = (conds: readonly Condition[] | null | undefined, type: string): boolean =>
  !!conds?.some((c) => c.type === type && c.status === 'True');

/** Reasons that make a node "unavailable" for ownership (Longhorn's IsNodeDownOrDeletedOrMissingManager). */
const DOWN_REASONS = new Set(['KubernetesNodeGone', 'KubernetesNodeNotReady', 'ManagerPodMissing']);

export function isNodeDown(node: Node | undefined): boolean {
  if (!node) return true;
  const ready = node.status?.conditions?.find((c) => c.type === 'Ready');
  return !!ready && ready.status === 'False' && DOWN_REASONS.has(ready.reason ?? '');
}

/** Flattens a Node record: disks that are in both spec and status (keyed by UUID from the status). */
export function nodeInfo(node: Node): NodeInfo {
  const disks: DiskInfo[] = [];
  const specDisks = node.spec?.disks ?? {};
  const statusDisks = node.status?.diskStatus ?? {};
  for (const [diskName, spec] of Object.entries(specDisks)) {
    const st = statusDisks[diskName];
    if (!st?.diskUUID) continue;
    disks.push({
      nodeID: node.metadata.name,
      diskName,
      diskUUID: st.diskUUID,
      path: spec.path ?? '',
      diskType: spec.diskType ?? 'filesystem',
      tags: spec.tags ?? [],
      allowScheduling: spec.allowScheduling ?? false,
      evictionRequested: spec.evictionRequested ?? false,
      storageReserved: spec.storageReserved ?? 0,
      ready: condTrue(st.conditions, 'Ready'),
      schedulable: condTrue(st.conditions, 'Schedulable'),
      healthy: !diskHasError(st.conditions),
    });
  }
  return {
    name: node.metadata.name,
    ready: condTrue(node.status?.conditions, 'Ready'),
    schedulable: condTrue(node.status?.conditions, 'Schedulable'),
    allowScheduling: node.spec?.allowScheduling ?? false,
    evictionRequested: node.spec?.evictionRequested ?? false,
    tags: node.spec?.tags ?? [],
    disks,
  };
}

/**
 * Whether a Node event concerns the backing-image controllers' work on that node: a node added or removed, or a
 * change of what they read of it (its readiness, being down, its disks, their paths, readiness, health, eviction,
 * scheduling). Not a resync (the controllers' own objects resync), nor a status write that changed only what they do
 * not read (storage figures, condition times and messages): each of those re-ran every data source and manager of the
 * node (10,000 data sources × a Node event every 30 s was most of the controller's reconciles).
 */
export function nodeChangeMatters(type: string, node: Node, old: Node | undefined): boolean {
  if (type === 'RESYNC') return false;
  if (type !== 'MODIFIED' || !old) return true;
  return isNodeDown(old) !== isNodeDown(node) || !sameValue(nodeInfo(old), nodeInfo(node));
}

/** A view of every node and disk, with lookups by disk UUID. */
export class Topology {
  readonly nodes: NodeInfo[];
  private readonly byDisk = new Map<string, { node: NodeInfo; disk: DiskInfo }>();

  constructor(nodes: readonly Node[]) {
    this.nodes = nodes.map(nodeInfo);
    for (const n of this.nodes) for (const d of n.disks) this.byDisk.set(d.diskUUID, { node: n, disk: d });
  }

  find(diskUUID: string): { node: NodeInfo; disk: DiskInfo } | undefined {
    return this.byDisk.get(diskUUID);
  }

  /** Longhorn's GetReadyDiskNode: node Ready and disk Ready and still in the node's spec. */
  readyDisk(diskUUID: string): { node: NodeInfo; disk: DiskInfo } | undefined {
    const f = this.byDisk.get(diskUUID);
    return f && f.node.ready && f.disk.ready ? f : undefined;
  }

  node(name: string): NodeInfo | undefined {
    return this.nodes.find((n) => n.name === name);
  }
}
