import { LONGHORN_API_VERSION } from '@bis/crd-types';
import type { Node } from '../kinds.js';

export interface TestDisk {
  uuid: string;
  path?: string;
  tags?: string[];
  allowScheduling?: boolean;
  evictionRequested?: boolean;
  ready?: boolean;
}

const cond = (type: string, ok: boolean) => ({ type, status: ok ? 'True' : 'False', reason: '', message: '', lastProbeTime: '', lastTransitionTime: '' });

/** A Node record with disks named after their UUIDs. */
export function testNode(
  name: string,
  disks: TestDisk[],
  opts: { tags?: string[]; schedulable?: boolean; ready?: boolean; evictionRequested?: boolean; allowScheduling?: boolean; namespace?: string } = {},
): Node {
  return {
    apiVersion: LONGHORN_API_VERSION,
    kind: 'Node',
    metadata: { name, namespace: opts.namespace ?? 'longhorn-system' },
    spec: {
      name,
      allowScheduling: opts.allowScheduling ?? true,
      evictionRequested: opts.evictionRequested ?? false,
      tags: opts.tags ?? [],
      disks: Object.fromEntries(
        disks.map((d) => [
          d.uuid,
          { path: d.path ?? `/disks/${d.uuid}`, diskType: 'filesystem' as const, allowScheduling: d.allowScheduling ?? true, evictionRequested: d.evictionRequested ?? false, tags: d.tags ?? [], storageReserved: 0 },
        ]),
      ),
    },
    status: {
      conditions: [cond('Ready', opts.ready ?? true), cond('Schedulable', opts.schedulable ?? true)],
      diskStatus: Object.fromEntries(disks.map((d) => [d.uuid, { diskUUID: d.uuid, conditions: [cond('Ready', d.ready ?? true), cond('Schedulable', true)] }])),
    },
  };
}
