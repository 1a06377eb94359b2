/**
 * The HA rule of the `backingImageCleanup` action (control plane §2.5), with Longhorn's counting fault fixed.
 *
 * Longhorn compares `minNumberOfCopies` against `readyActive + handlingCleanup (+ failedCleanup)`, i.e. it counts the
 * copies being REMOVED as if they stayed, so removing the only pending copy of an image that needs two copies is
 * allowed. Here the copies that stay (active) are counted: a cleanup is refused when, after it, fewer copies than
 * `minNumberOfCopies` would remain in the best class the removed copies belong to. The error strings are Longhorn's.
 */

export type CopyClass = 'ready' | 'handling' | 'failed';

/** ready / ready-for-transfer → ready; failed → failed; anything else (pending, in-progress, unknown, missing) → handling. */
export function classifyCopy(state: string | undefined): CopyClass {
  if (state === 'ready' || state === 'ready-for-transfer') return 'ready';
  if (state === 'failed') return 'failed';
  return 'handling';
}

export const CLEANUP_NOT_ENOUGH_READY = 'failed to do cleanup since there will be no enough ready files for HA after the deletion';
export const CLEANUP_NOT_ENOUGH_HANDLING = 'failed to do cleanup since there will be no enough ready/in-progress/pending files for HA after the deletion';
export const CLEANUP_NOT_ENOUGH_FILES = 'cannot do cleanup since there are no enough files for HA';

export interface CleanupCounts {
  readyActive: number;
  handlingActive: number;
  failedActive: number;
  readyCleanup: number;
  handlingCleanup: number;
  failedCleanup: number;
}

export function countCopies(specDisks: readonly string[], stateOf: (disk: string) => string | undefined, cleanup: ReadonlySet<string>): CleanupCounts {
  const c: CleanupCounts = { readyActive: 0, handlingActive: 0, failedActive: 0, readyCleanup: 0, handlingCleanup: 0, failedCleanup: 0 };
  for (const disk of specDisks) {
    const cls = classifyCopy(stateOf(disk));
    const key = `${cls}${cleanup.has(disk) ? 'Cleanup' : 'Active'}` as keyof CleanupCounts;
    c[key]++;
  }
  return c;
}

/** `undefined` when the cleanup keeps enough copies, else Longhorn's error message. */
export function cleanupRefusal(c: CleanupCounts, minCopies: number): string | undefined {
  const m = minCopies;
  if (m <= c.readyActive) return undefined;
  if (c.readyCleanup > 0) return CLEANUP_NOT_ENOUGH_READY;
  if (m <= c.readyActive + c.handlingActive) return undefined;
  if (c.handlingCleanup > 0) return CLEANUP_NOT_ENOUGH_HANDLING;
  if (m <= c.readyActive + c.handlingActive + c.failedActive) return undefined;
  if (c.failedCleanup > 0) return CLEANUP_NOT_ENOUGH_FILES;
  return undefined;
}
