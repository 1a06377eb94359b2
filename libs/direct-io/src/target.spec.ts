import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { alignedBuffer, DIRECT_IO_ALIGNMENT, DirectTarget, directIoSupported } from './index.js';

const MiB = 1 << 20;
/** Whether the temp directory's filesystem takes O_DIRECT (ext4 and xfs do; tmpfs before Linux 6.6 does not). */
const DIRECT = await directIoSupported(os.tmpdir());
const NO_DIRECT = ' (skipped: the temp directory\'s filesystem has no O_DIRECT)';
if (!DIRECT) console.warn(`direct-io target.spec: O_DIRECT tests skipped: ${os.tmpdir()} has no O_DIRECT`);
const itDirect = DIRECT ? it : it.skip;
let dir: string;
beforeEach(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'direct-target-'));
});
afterEach(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});


describe('DirectTarget', () => {
  it('writes whole blocks of page-aligned buffers directly, refuses unaligned pieces and plain buffers, and only once open', async () => {
    const supported = await directIoSupported(dir);
    const t = new DirectTarget();
    const target = path.join(dir, 'target');
    await fsp.writeFile(target, Buffer.alloc(0));
    await fsp.truncate(target, 4 * MiB);
    const buf = alignedBuffer(MiB);
    expect(t.canWrite(buf, MiB, 0)).toBe(false); // not open yet
    expect(await t.write(buf, MiB, 0)).toBe(0);
    await t.open(target);
    expect(t.usable).toBe(supported);
    randomBytes(MiB).copy(buf);
    expect(t.canWrite(buf, MiB, MiB)).toBe(supported);
    expect(t.canWrite(buf, MiB - 512, MiB)).toBe(false);
    expect(t.canWrite(buf, MiB, MiB + 512)).toBe(false);
    expect(t.canWrite(Buffer.alloc(MiB), MiB, MiB)).toBe(false);
    expect(t.canWrite(buf.subarray(16), DIRECT_IO_ALIGNMENT, 0)).toBe(false); // same memory, start off the block grid
    expect(t.canWrite(buf.subarray(DIRECT_IO_ALIGNMENT), DIRECT_IO_ALIGNMENT, 0)).toBe(supported);
    expect(await t.write(buf, MiB, MiB)).toBe(supported ? MiB : 0);
    await t.close();
    expect(t.usable).toBe(false);
  });

  itDirect(`a direct write lands in the file at its offset${DIRECT ? '' : NO_DIRECT}`, async () => {
    const t = new DirectTarget();
    const target = path.join(dir, 'target');
    await fsp.writeFile(target, Buffer.alloc(0));
    await fsp.truncate(target, 4 * MiB);
    const buf = alignedBuffer(MiB);
    randomBytes(MiB).copy(buf);
    await t.open(target);
    expect(await t.write(buf, MiB, MiB)).toBe(MiB);
    await t.close();
    const out = readFileSync(target);
    expect(out.subarray(MiB, 2 * MiB).equals(buf)).toBe(true);
    expect(out.subarray(0, MiB).every((b) => b === 0)).toBe(true);
  });

  it('directIoSupported answers for a directory and leaves nothing in it', async () => {
    expect(typeof (await directIoSupported(dir))).toBe('boolean');
    expect(await fsp.readdir(dir)).toEqual([]);
    await expect(directIoSupported(path.join(dir, 'missing'))).rejects.toMatchObject({ code: 'ENOENT' });
  });

  itDirect(`a refused direct write turns direct writes off for good and reports what was written${DIRECT ? '' : NO_DIRECT}`, async () => {
    const target = path.join(dir, 'target');
    await fsp.writeFile(target, Buffer.alloc(0));
    const t = new DirectTarget();
    await t.open(target);
    // a plain (malloc-aligned) buffer at an odd address: the kernel answers EINVAL
    const plain = Buffer.alloc(DIRECT_IO_ALIGNMENT + 16).subarray(1, 1 + DIRECT_IO_ALIGNMENT);
    expect(await t.write(plain, DIRECT_IO_ALIGNMENT, 0)).toBe(0);
    expect(t.usable).toBe(false);
    expect(await t.write(alignedBuffer(DIRECT_IO_ALIGNMENT), DIRECT_IO_ALIGNMENT, 0)).toBe(0);
    await t.close();
  });
});
