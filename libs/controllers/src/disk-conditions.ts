import { randomBytes } from 'node:crypto';
import { open, rm } from 'node:fs/promises';
import path from 'node:path';
import { isConflict } from '@bis/datastore';
import type { ControllerContext } from './base-controller.js';
import { getOrUndefined } from './common.js';
import { diskErrorOf, diskHasError, DISK_HEALTHY_CONDITION, withDiskCondition, type DiskErrorCode } from './disk-errors.js';
import { EventSource } from './events.js';
import { NodeKind } from './kinds.js';

/**
 * Sets (a disk error seen in `failure`) or clears (`failure` undefined: a write on the disk succeeded) the disk's
 * `Healthy` condition in its Node's status, with an event on the Node when it changes. Returns whether it changed.
 * A failure that names no disk error changes nothing.
 */
export async function recordDiskHealth(ctx: ControllerContext, nodeID: string, diskUUID: string, failure: string | undefined, how = 'a write on it succeeded'): Promise<boolean> {
  const code: DiskErrorCode | undefined = failure === undefined ? undefined : diskErrorOf(failure);
  if (failure !== undefined && !code) return false;
  for (let attempt = 0; attempt < 5; attempt++) {
    const cached = attempt === 0 ? ctx.informers.cached(NodeKind).find((n) => n.metadata.name === nodeID) : undefined;
    const node = cached ?? (await getOrUndefined(ctx.store.get(NodeKind, nodeID, ctx.namespace)));
    const entry = Object.entries(node?.status?.diskStatus ?? {}).find(([, d]) => d.diskUUID === diskUUID);
    if (!node || !entry) return false;
    const [diskName, disk] = entry;
    const nowIso = ctx.now().toISOString();
    // the failure without the retry schedule of the copy (it changes with every attempt; the condition does not)
    const text = (failure ?? '').replace(/, next retry in [^:]*? \(attempt \d+\)/, '');
    const error = code ? { code, message: text.startsWith(`${diskName}:`) || text.startsWith(`${diskUUID}:`) ? text : `${diskName}: ${text}` } : undefined;
    const wasError = diskHasError(disk.conditions);
    const conditions = withDiskCondition(disk.conditions, error, nowIso);
    if (!conditions) return false;
    try {
      await ctx.store.updateStatus(NodeKind, { ...node, status: { ...node.status, diskStatus: { ...node.status!.diskStatus, [diskName]: { ...disk, conditions } } } });
    } catch (err) {
      if (!isConflict(err)) throw err;
      continue; // the copy was stale: the next attempt reads the latest
    }
    if (error && wasError) return true; // a new message on a disk already marked: no new event
    if (error) {
      ctx.log.warn(`disk ${diskName} (${diskUUID}) on node ${nodeID}: ${code}; no new copy is placed on it until a write on it succeeds`);
      ctx.events.record(EventSource.Node, node, 'Warning', 'DiskError', `Disk ${diskName} (${diskUUID}) condition ${DISK_HEALTHY_CONDITION} is False (${code}): ${error.message}`);
    } else {
      ctx.log.info(`disk ${diskName} (${diskUUID}) on node ${nodeID} recovered: ${how}`);
      ctx.events.record(EventSource.Node, node, 'Normal', 'DiskRecovered', `Disk ${diskName} (${diskUUID}) condition ${DISK_HEALTHY_CONDITION} is True again: ${how}`);
    }
    return true;
  }
  return false;
}

/** Bytes a disk probe writes (and syncs, then removes). */
export const DISK_PROBE_BYTES = 1 << 20;

/**
 * Writes, syncs and removes a small file in the disk's directory: the probe that tells a disk marked unhealthy
 * recovered when no copy on it is written any more. Resolves with the error text when the probe fails.
 */
export async function probeDiskWrite(diskPath: string): Promise<string | undefined> {
  const file = path.join(diskPath, `.bis-disk-probe-${randomBytes(4).toString('hex')}`);
  try {
    const fh = await open(file, 'w', 0o600);
    try {
      await fh.write(randomBytes(DISK_PROBE_BYTES));
      await fh.sync();
    } finally {
      await fh.close();
    }
    return undefined;
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  } finally {
    await rm(file, { force: true }).catch(() => undefined);
  }
}
