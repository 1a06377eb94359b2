import { execFile } from 'node:child_process';
import { constants } from 'node:fs';
import { open } from 'node:fs/promises';
import { assertByteCount } from './extent.js';
import { nativeAddon } from './native.js';

/** A punch-hole failure; `code` is the errno name when the system call reported one (e.g. `EOPNOTSUPP`). */
export class PunchHoleError extends Error {
  readonly code: string | undefined;
  constructor(message: string, code: string | undefined, cause: unknown) {
    super(message, { cause });
    this.name = 'PunchHoleError';
    this.code = code;
  }
}

function errorCode(err: unknown): string | undefined {
  if (typeof err === 'object' && err !== null && 'code' in err && typeof err.code === 'string') return err.code;
  return undefined;
}

/**
 * Deallocates `[offset, offset + length)` of `path` and keeps the file size: the range reads back as zeros, whole
 * filesystem blocks inside it are freed, partial blocks at its edges are zeroed in place. Uses the native addon
 * (fallocate PUNCH_HOLE|KEEP_SIZE), else `fallocate --punch-hole --keep-size` from util-linux. If neither works,
 * nothing is written and a PunchHoleError explains why.
 */
export async function punchHole(path: string, offset: number, length: number): Promise<void> {
  assertByteCount(offset, 'punchHole offset');
  assertByteCount(length, 'punchHole length');
  if (!Number.isSafeInteger(offset + length)) throw new RangeError('punchHole offset + length is not a safe integer');
  if (length === 0) return;
  const addon = nativeAddon();
  if (!addon) {
    await punchHoleWithFallocateTool(path, offset, length);
    return;
  }
  // O_NOFOLLOW: a symbolic link at `path` is refused (ELOOP), never punched in its target's place
  const fh = await open(path, constants.O_RDWR | constants.O_NOFOLLOW);
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw new PunchHoleError(`cannot punch a hole in ${path}: not a regular file`, undefined, null);
    await addon.punchHole(fh.fd, offset, length);
  } catch (err) {
    if (err instanceof PunchHoleError) throw err;
    const reason = err instanceof Error ? err.message : String(err);
    throw new PunchHoleError(
      `cannot punch a hole in ${path} at [${offset}, ${offset + length}): ${reason}`,
      errorCode(err),
      err,
    );
  } finally {
    await fh.close();
  }
}

/**
 * The punch-hole fallback: runs `fallocate --punch-hole --keep-size --offset <offset> --length <length> <path>`.
 * Exported for tests and for callers that want the tool explicitly.
 */
export async function punchHoleWithFallocateTool(path: string, offset: number, length: number): Promise<void> {
  assertByteCount(offset, 'punchHole offset');
  assertByteCount(length, 'punchHole length');
  if (length === 0) return;
  const args = ['--punch-hole', '--keep-size', '--offset', String(offset), '--length', String(length), '--', path];
  return new Promise((resolve, reject) => {
    execFile('fallocate', args, { timeout: 60_000 }, (err, _stdout, stderr) => {
      if (!err) {
        resolve();
        return;
      }
      const detail = errorCode(err) === 'ENOENT' ? 'the fallocate tool (util-linux) is not installed' : stderr.trim() || err.message;
      reject(
        new PunchHoleError(
          `cannot punch a hole in ${path} at [${offset}, ${offset + length}): native addon not loaded and ` +
            `fallocate --punch-hole failed: ${detail}`,
          errorCode(err) === 'ENOENT' ? 'ENOENT' : undefined,
          err,
        ),
      );
    });
  });
}
