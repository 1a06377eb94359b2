import { constants } from 'node:fs';
import { mkdtemp, open, rename, rm, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { SourceError } from './errors.js';

/** Create (or truncate) for writing; a symbolic link at the last component is refused. */
export const CREATE_NOFOLLOW = constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW;
/** Open an existing file for reading and writing; a symbolic link at the last component is refused. */
export const UPDATE_NOFOLLOW = constants.O_RDWR | constants.O_NOFOLLOW;
/** Open an existing file for reading; a symbolic link at the last component is refused. */
export const READ_NOFOLLOW = constants.O_RDONLY | constants.O_NOFOLLOW;

/**
 * Opens a file an image is written to (or read back from) with `O_NOFOLLOW`: the path was confined when the work
 * was launched, and a symbolic link planted at that name afterwards must not make the write land in its target.
 * A link there fails with a {@link SourceError} naming the file (`ELOOP` from the kernel).
 */
export async function openNoFollow(file: string, flags: number, mode = 0o644): Promise<FileHandle> {
  try {
    return await open(file, flags, mode);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ELOOP') {
      throw new SourceError(`refusing to open ${file}: it is a symbolic link (a link at the image's path is never followed)`);
    }
    throw e;
  }
}

/**
 * Runs `produce` (a tool that creates its output by name, such as `qemu-img convert`, which cannot be told not to
 * follow links) with an output path inside a new private directory beside `dest` (`mkdtemp`, mode 0700, random
 * name), then renames the result to `dest`. Nothing can be planted at the name the tool writes to, and the rename
 * replaces whatever is at `dest` (a link too) instead of writing through it. The directory is always removed.
 */
export async function produceBeside(dest: string, produce: (out: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(path.join(path.dirname(dest), `.${path.basename(dest)}.`));
  try {
    const out = path.join(dir, 'out');
    await produce(out);
    await rename(out, dest);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
