/**
 * Disk conditions recognised in a copy's failure message: errors that say something about the disk rather than the
 * image (a full disk, an I/O error, a read-only or forbidden directory).
 */
export type DiskErrorCode = 'ENOSPC' | 'EIO' | 'EACCES' | 'EPERM' | 'EROFS';

const DISK_ERRORS: Record<DiskErrorCode, string> = {
  ENOSPC: 'no space left on device',
  EIO: 'input/output error',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  EROFS: 'read-only file system',
};

/** The disk condition a failure message names (by its errno code or by its text), if any. */
export function diskErrorOf(message: string): DiskErrorCode | undefined {
  for (const [code, text] of Object.entries(DISK_ERRORS) as [DiskErrorCode, string][]) {
    if (new RegExp(`\\b${code}\\b`).test(message) || message.toLowerCase().includes(text)) return code;
  }
  return undefined;
}

/**
 * A failed copy's status message as operators read it: the disk named, the disk condition spelled out, and when the
 * next attempt comes: `disk-2: no space left on device (ENOSPC), next retry in 40 s (attempt 3): <original message>`.
 */
export function failedCopyMessage(disk: string, message: string, retry?: { attempt: number; inText: string }): string {
  const code = diskErrorOf(message);
  const head = code ? `${disk}: ${DISK_ERRORS[code]} (${code})` : `${disk}`;
  const next = retry ? `, next retry in ${retry.inText} (attempt ${retry.attempt})` : '';
  return `${head}${next}: ${message}`;
}

// ---------------------------------------------------------------- disk conditions

/**
 * The condition a disk error sets on the disk (`Node.status.diskStatus[<disk>].conditions`, shaped like Longhorn's
 * `Ready` and `Schedulable`): `False` while the disk showed ENOSPC, EIO or a permission error, `True` again once a
 * write on it succeeded. Scheduling places no new copy on a disk whose condition is `False`.
 */
export const DISK_HEALTHY_CONDITION = 'Healthy';

/** The condition's reason for each disk error. */
export const DISK_ERROR_REASONS: Record<DiskErrorCode, string> = {
  ENOSPC: 'DiskFull',
  EIO: 'DiskIOError',
  EACCES: 'DiskPermissionDenied',
  EPERM: 'DiskPermissionDenied',
  EROFS: 'DiskReadOnly',
};

export interface DiskConditionLike {
  type?: string;
  status?: string;
  reason?: string;
  message?: string;
  lastProbeTime?: string;
  lastTransitionTime?: string;
}

/** Whether the disk's conditions say a disk error keeps copies off it. */
export function diskHasError(conditions: readonly DiskConditionLike[] | null | undefined): boolean {
  return !!conditions?.some((c) => c.type === DISK_HEALTHY_CONDITION && c.status === 'False');
}

/**
 * The disk's conditions with `Healthy` set: `error` given → `False` with the error's reason and message; `error`
 * undefined → `True` (the disk recovered). Other conditions are kept as they are. Returns undefined when nothing
 * changes (the transition time moves only when the status changes; a repeated error restamps `lastProbeTime`).
 */
export function withDiskCondition<C extends DiskConditionLike>(
  conditions: readonly C[] | null | undefined,
  error: { code: DiskErrorCode; message: string } | undefined,
  nowIso: string,
): C[] | undefined {
  const list = [...(conditions ?? [])];
  const i = list.findIndex((c) => c.type === DISK_HEALTHY_CONDITION);
  const old = i >= 0 ? list[i] : undefined;
  if (!error) {
    if (!old || old.status === 'True') return undefined;
    list[i] = { ...old, status: 'True', reason: '', message: '', lastProbeTime: nowIso, lastTransitionTime: nowIso };
    return list;
  }
  const reason = DISK_ERROR_REASONS[error.code];
  const next = {
    ...(old ?? {}),
    type: DISK_HEALTHY_CONDITION,
    status: 'False',
    reason,
    message: error.message,
    lastProbeTime: nowIso,
    lastTransitionTime: old?.status === 'False' ? (old.lastTransitionTime ?? nowIso) : nowIso,
  } as C;
  if (old && old.status === 'False' && old.reason === reason && old.message === error.message) return undefined;
  if (i >= 0) list[i] = next;
  else list.push(next);
  return list;
}
