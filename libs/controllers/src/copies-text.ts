import type { Datastore, Stored } from '@bis/datastore';
import { NodeKind, type BackingImage } from './kinds.js';

/** `disk-1 on node n1` for each disk UUID the nodes report (a disk no node reports stays `disk <uuid>`). */
export async function diskNamesByUUID(store: Datastore, namespace: string): Promise<Map<string, string>> {
  const names = new Map<string, string>();
  for (const n of (await store.list(NodeKind, { namespace })).items) {
    for (const [diskName, d] of Object.entries(n.status?.diskStatus ?? {})) if (d?.diskUUID) names.set(d.diskUUID, `${diskName} on node ${n.metadata.name}`);
  }
  return names;
}

/**
 * The copies of an image for a person: `disk-1 on node n1 in-progress 45%; disk-2 on node n1 failed: <message>`
 * (`none yet` without copies). Used in the messages that say why an operation needs to wait for a ready copy.
 */
export async function describeImageCopies(store: Datastore, namespace: string, bi: Stored<BackingImage>): Promise<string> {
  const files = Object.entries(bi.status?.diskFileStatusMap ?? {});
  if (!files.length) return 'none yet';
  const names = await diskNamesByUUID(store, namespace);
  return files
    .map(([uuid, f]) => `${names.get(uuid) ?? `disk ${uuid}`} ${f?.state || 'pending'}${f?.state === 'in-progress' ? ` ${f.progress ?? 0}%` : ''}${f?.message ? `: ${f.message}` : ''}`)
    .join('; ');
}
