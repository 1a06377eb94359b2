import type { BackingImage, BackupBackingImage } from './types.js';

/** The condition the server sets to `False` when `minNumberOfCopies` exceeds the disks that the selectors allow. */
export const MIN_COPIES_CONDITION = 'MinCopiesSatisfiable';

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** `1536` → `1.5 KiB`; `0` → `0 B`; negative or non-finite → `-`. */
export function formatBytes(n: number): string {
  if (!Number.isFinite(n) || n < 0) return '-';
  let v = n;
  let i = 0;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : v.toFixed(0)} ${UNITS[i]}`;
}

/** Seconds → `1h02m03s` / `4m05s` / `7s`. */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return '--';
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  if (h) return `${h}h${String(m).padStart(2, '0')}m${String(r).padStart(2, '0')}s`;
  if (m) return `${m}m${String(r).padStart(2, '0')}s`;
  return `${r}s`;
}

/** What a backing image's copies are doing, for a list row. */
export interface CopySummary {
  total: number;
  ready: number;
  inProgress: number;
  failed: number;
  /** Copies in any other state (pending, starting, unknown, not started). */
  waiting: number;
  /** Mean progress (0–100) of the copies not yet ready, or 100 when all are ready, or 0 with no copies. */
  progress: number;
  /** Every copy failed (and there is at least one). */
  allFailed: boolean;
  /** The image is being deleted. */
  deleting: boolean;
  /** One word for the whole image: `deleting`, `ready`, `failed`, `in-progress`, `pending`. */
  phase: 'deleting' | 'ready' | 'failed' | 'in-progress' | 'pending';
}

// `ready-for-transfer` is the data source's finished file before a manager takes it over: not usable yet.
const READY = new Set(['ready']);
const FAILED = new Set(['failed', 'failed-and-cleanup']);
const ACTIVE = new Set(['in-progress', 'starting', 'ready-for-transfer']);

export function summariseCopies(bi: Pick<BackingImage, 'diskFileStatusMap' | 'deletionTimestamp'>): CopySummary {
  const files = Object.values(bi.diskFileStatusMap ?? {});
  let ready = 0;
  let failed = 0;
  let inProgress = 0;
  let progressSum = 0;
  let notReady = 0;
  for (const f of files) {
    if (READY.has(f.state)) ready++;
    else {
      notReady++;
      progressSum += Math.max(0, Math.min(100, f.progress || 0));
      if (FAILED.has(f.state)) failed++;
      else if (ACTIVE.has(f.state)) inProgress++;
    }
  }
  const total = files.length;
  const deleting = !!bi.deletionTimestamp;
  const allFailed = total > 0 && failed === total;
  const progress = total === 0 ? 0 : notReady === 0 ? 100 : Math.round(progressSum / notReady);
  const phase: CopySummary['phase'] = deleting ? 'deleting' : allFailed ? 'failed' : ready > 0 ? 'ready' : inProgress > 0 ? 'in-progress' : 'pending';
  return { total, ready, inProgress, failed, waiting: total - ready - inProgress - failed, progress, allFailed, deleting, phase };
}

/**
 * When every copy of the image failed (an upload the server failed cannot be resumed: its data source is gone): the
 * first reason a copy gives, '' when none does. Otherwise `undefined`.
 */
export function allCopiesFailedReason(bi: Pick<BackingImage, 'diskFileStatusMap' | 'deletionTimestamp'>): string | undefined {
  if (!summariseCopies(bi).allFailed) return undefined;
  return Object.values(bi.diskFileStatusMap).find((f) => f.message)?.message ?? '';
}

/** `2/3 ready, 1 in progress` */
export function describeCopies(s: CopySummary): string {
  if (s.total === 0) return 'no copies yet';
  const parts = [`${s.ready}/${s.total} ready`];
  if (s.inProgress) parts.push(`${s.inProgress} in progress`);
  if (s.failed) parts.push(`${s.failed} failed`);
  if (s.waiting) parts.push(`${s.waiting} waiting`);
  return parts.join(', ');
}

/** Where a backing image came from, in one phrase: `download https://…`, `clone of base`, `upload`. */
export function describeSource(bi: Pick<BackingImage, 'sourceType' | 'parameters'>): string {
  const p = bi.parameters ?? {};
  switch (bi.sourceType) {
    case 'download':
      return p['url'] ? `download ${p['url']}` : 'download';
    case 'clone':
      return p['backing-image'] ? `clone of ${p['backing-image']}` : 'clone';
    case 'restore':
      return p['backup-url'] ? `restore ${p['backup-url']}` : 'restore';
    case 'export-from-volume':
      return p['volume-name'] ? `export of volume ${p['volume-name']}` : 'export-from-volume';
    default:
      return bi.sourceType;
  }
}

/** A backup is finished and usable for a restore. */
export function backupCompleted(b: Pick<BackupBackingImage, 'state'>): boolean {
  return b.state === 'Completed';
}

/** Why an image cannot reach `minNumberOfCopies`: the server's message and the number of disks that can hold a copy. */
export interface CopiesShortfall {
  message: string;
  /** Disks that the node and disk selectors allow (schedulable ones). */
  allowed: number;
}

/**
 * The shortfall the server reports in the `MinCopiesSatisfiable` condition (`False`), or undefined. `allowed` is
 * taken from the condition's message (`minNumberOfCopies 3 exceeds the 2 disks that …`).
 */
export function copiesShortfall(bi: Pick<BackingImage, 'conditions'>): CopiesShortfall | undefined {
  const c = (bi.conditions ?? []).find((x) => x.type === MIN_COPIES_CONDITION && x.status === 'False');
  if (!c) return undefined;
  const message = c.message ?? '';
  const m = /exceeds the (\d+) disk/.exec(message);
  return { message, allowed: m ? Number(m[1]) : 0 };
}
