/**
 * Status aggregation of a backing image (Longhorn's syncBackingImageFileInfo, §3.1.3) as a pure function over the
 * BI status, its data source and the managers.
 */
import type { BackingImageDiskFileStatus, BackingImageState, BackingImageStatus } from '@bis/crd-types';
import { FILE_MACHINE, transition } from '@bis/state-machine';
import { changed } from './common.js';
import { IN_PROGRESS } from './rules.js';
import type { BackingImageDataSource, BackingImageManager } from './kinds.js';

export interface AggregationEvent {
  type: 'Normal' | 'Warning';
  reason: string;
  message: string;
}

export interface AggregationInput {
  status: BackingImageStatus;
  bids?: BackingImageDataSource;
  /** Managers not being deleted. */
  managers: readonly BackingImageManager[];
  biName: string;
  nowIso: string;
}

const biSubject = (disk: string) => `copy on disk ${disk}`;

/** A failed copy stays failed when it is found corrupted too. */
const isFailed = (state: BackingImageState | undefined) => state === 'failed' || state === 'failed-and-cleanup';

function updateWithFileInfo(
  status: BackingImageStatus,
  map: Record<string, BackingImageDiskFileStatus>,
  disk: string,
  message: string,
  checksum: string,
  state: BackingImageState,
  progress: number,
  nowIso: string,
  retry: { retryCount?: number; nextRetryAt?: string } = {},
): void {
  const e = (map[disk] ??= { dataEngine: 'v1', progress: 0, message: '', lastStateTransitionTime: '' });
  const prev = e.state ?? '';
  // The copy's owner (the data source or the manager) reported the state: the BI mirrors it.
  e.state = transition(FILE_MACHINE, prev, { reported: state }, biSubject(disk));
  if (e.state !== prev) e.lastStateTransitionTime = nowIso;
  e.progress = progress;
  e.message = message;
  // The retry of a failed copy (additions to Longhorn's fields): set while it waits for its next attempt.
  if (retry.retryCount) e.retryCount = retry.retryCount;
  else delete e.retryCount;
  if (retry.nextRetryAt && isFailed(e.state)) e.nextRetryAt = retry.nextRetryAt;
  else delete e.nextRetryAt;
  if (checksum) {
    if (!status.checksum) status.checksum = checksum;
    else if (status.checksum !== checksum && !isFailed(e.state)) {
      e.state = transition(FILE_MACHINE, e.state, 'found-corrupted', biSubject(disk));
      // FIX: Longhorn leaves lastStateTransitionTime unchanged here; a failure is a transition, so it is stamped.
      e.lastStateTransitionTime = nowIso;
      e.message = `Backing image recorded checksum ${status.checksum} doesn't match the file checksum ${checksum} in disk ${disk}`;
    }
  }
}

/** Mutates and returns `input.status`; returns the events to emit. */
export function aggregateFileStatus(input: AggregationInput): AggregationEvent[] {
  const { status, bids, managers, biName, nowIso } = input;
  const events: AggregationEvent[] = [];
  const map: Record<string, BackingImageDiskFileStatus> = { ...(status.diskFileStatusMap ?? {}) };
  for (const k of Object.keys(map)) map[k] = { ...map[k]! };
  const current = new Set<string>();
  const bidsActive = !!bids && bids.status?.currentState !== 'ready';
  const bidsDisk = bids?.spec?.diskUUID ?? '';
  if (bids && bidsActive && bidsDisk) {
    current.add(bidsDisk);
    const size = bids.status?.size ?? 0;
    if (size !== 0 && size !== status.size) status.size = size;
    updateWithFileInfo(status, map, bidsDisk, bids.status?.message ?? '', bids.status?.checksum ?? '', bids.status?.currentState ?? '', bids.status?.progress ?? 0, nowIso, {
      retryCount: bids.status?.retryCount,
      nextRetryAt: bids.status?.nextRetryAt,
    });
  }
  for (const bim of managers) {
    const disk = bim.spec?.diskUUID ?? '';
    const file = bim.status?.backingImageFileMap?.[biName];
    if (!file || !disk || file.uuid !== status.uuid) continue;
    if (bidsActive && disk === bidsDisk) continue;
    current.add(disk);
    updateWithFileInfo(status, map, disk, file.message ?? '', file.currentChecksum ?? '', file.state ?? '', file.progress ?? 0, nowIso, { retryCount: file.retryCount, nextRetryAt: file.nextRetryAt });
    const e = map[disk]!;
    const size = file.size ?? 0;
    if (size > 0) {
      if (!status.size) {
        status.size = size;
        events.push({ type: 'Normal', reason: 'Update', message: `Set size to ${size}` });
      }
      if (status.size !== size && !isFailed(e.state)) {
        e.state = transition(FILE_MACHINE, e.state ?? '', 'found-corrupted', biSubject(disk));
        e.lastStateTransitionTime = nowIso;
        e.message = `found mismatching size ${size} reported by backing image manager ${bim.metadata.name} in disk ${disk}, the size recorded in status is ${status.size}`;
        events.push({ type: 'Warning', reason: 'Update', message: e.message });
      }
    }
    const vsize = file.virtualSize ?? 0;
    if (vsize > 0) {
      if (!status.virtualSize) {
        status.virtualSize = vsize;
        events.push({ type: 'Normal', reason: 'Update', message: `Set virtualSize to ${vsize}` });
      }
      if (status.virtualSize !== vsize && !isFailed(e.state)) {
        e.state = transition(FILE_MACHINE, e.state ?? '', 'found-corrupted', biSubject(disk));
        e.lastStateTransitionTime = nowIso;
        e.message = `found mismatching virtualSize ${vsize} reported by backing image manager ${bim.metadata.name} in disk ${disk}, the virtualSize recorded in status is ${status.virtualSize}`;
        events.push({ type: 'Warning', reason: 'Update', message: e.message });
      }
    }
    if ((file.realSize ?? 0) > 0 && !status.realSize) status.realSize = file.realSize;
  }
  for (const k of Object.keys(map)) {
    if ((map[k]!.dataEngine ?? 'v1') === 'v1' && !current.has(k)) delete map[k];
  }
  for (const e of Object.values(map)) if (!e.lastStateTransitionTime) e.lastStateTransitionTime = nowIso;
  status.diskFileStatusMap = map;
  return events;
}

/** A copy not yet started, or being prepared or received. */
const PASSING_STATES: ReadonlySet<string> = new Set(['', ...IN_PROGRESS]);

/**
 * Whether `next` differs from `prev` only in copies that are (still, or now) in a passing state: a copy added in one,
 * or its state, progress, message and times while in one. A copy removed, ready or failed, or any other status field,
 * counts as a change.
 */
export function onlyPassingCopyChanges(prev: BackingImageStatus, next: BackingImageStatus): boolean {
  if (changed({ ...prev, diskFileStatusMap: undefined }, { ...next, diskFileStatusMap: undefined })) return false;
  const a = prev.diskFileStatusMap ?? {};
  const b = next.diskFileStatusMap ?? {};
  for (const d of Object.keys(a)) if (!(d in b)) return false;
  for (const [d, y] of Object.entries(b)) {
    const x = a[d];
    if (x && !changed(x, y)) continue;
    if (!PASSING_STATES.has(y.state ?? '')) return false;
  }
  return true;
}
