import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ImageSink } from './image-sink.js';
import { convertRawToQcow2 } from './qemu-img.js';
import { restoreToFile, type RestoreBackupFn } from './sources.js';

// A symbolic link planted at the name an image is written to (the `.tmp` file of a record), pointing out of the disk:
// every write must refuse it, and the file it points to must stay exactly as it was (content, size, mtime), with no
// new file beside it.

interface Outside {
  base: string;
  disk: string;
  victim: string;
  snapshot(): Promise<Record<string, string>>;
}

async function sandbox(): Promise<Outside> {
  const base = await fsp.realpath(await fsp.mkdtemp(path.join(os.tmpdir(), 'no-follow-')));
  const disk = path.join(base, 'disk');
  await fsp.mkdir(path.join(disk, 'tmp'), { recursive: true });
  const victim = path.join(base, 'victim.img');
  await fsp.writeFile(victim, 'victim: must never be written through a link\n');
  const snapshot = async (): Promise<Record<string, string>> => {
    const out: Record<string, string> = {};
    for (const e of await fsp.readdir(base)) {
      if (e === 'disk') continue;
      const st = await fsp.lstat(path.join(base, e), { bigint: true });
      const body = st.isFile() ? createHash('sha256').update(await fsp.readFile(path.join(base, e))).digest('hex') : '-';
      out[e] = `${st.isSymbolicLink() ? 'link' : st.isFile() ? 'file' : 'dir'} ${st.size} ${st.mtimeNs} ${body}`;
    }
    return out;
  };
  return { base, disk, victim, snapshot };
}

const sinkless = { setSize: () => undefined, updateProgress: () => undefined };

describe('a symbolic link planted at the name an image is written to (pointing out of the disk)', () => {
  let s: Outside;
  let tmp: string;
  beforeEach(async () => {
    s = await sandbox();
    tmp = path.join(s.disk, 'tmp', 'img-x.tmp');
    await fsp.symlink(s.victim, tmp);
  });
  afterEach(async () => {
    await fsp.rm(s.base, { recursive: true, force: true });
  });

  it('ImageSink.create refuses it (O_NOFOLLOW) and the target is untouched', async () => {
    const before = await s.snapshot();
    await expect(ImageSink.create(tmp)).rejects.toThrow(`refusing to open ${tmp}: it is a symbolic link`);
    expect(await s.snapshot()).toEqual(before);
  });

  it('ImageSink.resume refuses it and the target is untouched', async () => {
    const before = await s.snapshot();
    await expect(ImageSink.resume(tmp, 4)).rejects.toThrow(`refusing to open ${tmp}: it is a symbolic link`);
    expect(await s.snapshot()).toEqual(before);
  });

  it('restoreToFile does not pad or read through a link swapped in at its output, and removes the link', async () => {
    const before = await s.snapshot();
    const bytes = randomBytes(1000); // not a multiple of 512: the restore pads the output
    const restore: RestoreBackupFn = async ({ output, onProgress }) => {
      // the engine renamed its file into place, and a link was swapped in at that name afterwards
      await fsp.rm(output, { force: true });
      await fsp.symlink(s.victim, output);
      onProgress(bytes.length, bytes.length);
      return { size: bytes.length, sha512: createHash('sha512').update(bytes).digest('hex') };
    };
    await expect(
      restoreToFile(
        { backupUrl: 'vfs:///nowhere?backingImage=img', concurrentLimit: 1, credential: {}, dest: tmp, signal: new AbortController().signal, sink: sinkless },
        restore,
      ),
    ).rejects.toThrow(`refusing to open ${tmp}: it is a symbolic link`);
    expect(await s.snapshot()).toEqual(before);
    await expect(fsp.lstat(tmp)).rejects.toMatchObject({ code: 'ENOENT' });
  });

  let qemuImg = true;
  try {
    execFileSync('qemu-img', ['--version'], { stdio: 'ignore' });
  } catch {
    qemuImg = false;
    console.warn('qemu-img (qemu-utils) is not installed: the qcow2 conversion case is skipped');
  }
  (qemuImg ? it : it.skip)('convertRawToQcow2 writes into a private directory and renames over the link: the target is untouched', async () => {
    const raw = path.join(s.disk, 'tmp', 'img-x.raw');
    await fsp.writeFile(raw, Buffer.alloc(1 << 20, 1));
    const before = await s.snapshot();
    await convertRawToQcow2({ source: raw, dest: tmp, signal: new AbortController().signal });
    expect(await s.snapshot()).toEqual(before);
    const st = await fsp.lstat(tmp);
    expect(st.isFile()).toBe(true);
    const head = Buffer.alloc(4);
    const fh = await fsp.open(tmp, 'r');
    await fh.read(head, 0, 4, 0);
    await fh.close();
    expect(head.toString('latin1')).toBe('QFI\xfb');
    // the private directory is gone
    expect((await fsp.readdir(path.join(s.disk, 'tmp'))).sort()).toEqual(['img-x.raw', 'img-x.tmp']);
  });
});
