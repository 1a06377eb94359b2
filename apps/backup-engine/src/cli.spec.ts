import { execFile, execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';

const APP_ROOT = path.resolve(new URL('.', import.meta.url).pathname, '..');
const BIN = path.join(APP_ROOT, 'bin/backup-engine.js');
const FIXTURE = path.resolve(APP_ROOT, '../../libs/backupstore/test-data/longhorn-backupstore-lz4');

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** Lock timing for the tests through the CLI's documented knob: Longhorn's protocol, without its 2 s check wait. */
const FAST_LOCK_ENV = { BACKUPSTORE_LOCK_CHECK_WAIT_MS: '20' };

function run(args: string[], env: Record<string, string> = FAST_LOCK_ENV): Promise<Run> {
  return new Promise((resolve) => {
    execFile(process.execPath, [BIN, ...args], { env: { PATH: process.env['PATH'] ?? '', ...env }, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

let work: string;
beforeAll(async () => {
  // The tests run the built binary: build the app (and the libs it references) first.
  execFileSync(process.execPath, [path.resolve(APP_ROOT, '../../node_modules/typescript/bin/tsc'), '--build', path.join(APP_ROOT, 'tsconfig.lib.json')], {
    stdio: 'inherit',
  });
  work = await fs.mkdtemp(path.join(os.tmpdir(), 'bis-backup-engine-'));
}, 120_000);
afterAll(async () => {
  await fs.rm(work, { recursive: true, force: true });
});

describe('backup-engine CLI', () => {
  it('backs up, lists, inspects, verifies, restores, collects and removes on a vfs target', async () => {
    const store = path.join(work, 'store');
    const target = `vfs://${store}`;
    const image = path.join(work, 'disk.img');
    const data = Buffer.concat([randomBytes(4 << 20), Buffer.alloc(2 << 20), Buffer.from('tail')]);
    await fs.writeFile(image, data);
    const sha512 = createHash('sha512').update(data).digest('hex');

    const b = await run(['backup', '--target', target, '--name', 'disk', '--file', image, '--compression', 'gzip', '--concurrency', '3', '--label', 'app=cli', '--label', 'tier=gold', '--json']);
    expect(b.code).toBe(0);
    expect(b.stderr).toBe(''); // no progress bar when stderr is not a terminal
    expect(JSON.parse(b.stdout)).toMatchObject({ name: 'disk', backupUrl: `${target}?backingImage=disk`, sha512, blockCount: 3, zeroBlocks: 1, uploadedBlocks: 3 });

    const ls = await run(['ls', '--target', target, '--json']);
    expect(ls.code).toBe(0);
    expect(JSON.parse(ls.stdout)).toEqual([expect.objectContaining({ name: 'disk', state: 'complete', compressionMethod: 'gzip', labels: { app: 'cli', tier: 'gold' } })]);

    const inspect = await run(['inspect', '--backup-url', `${target}?backingImage=disk`]);
    expect(inspect.code).toBe(0);
    expect(inspect.stdout).toMatch(/^\{\n\t"Name": "disk",\n\t"URL": "vfs:\/\/.*\?backingImage=disk",/);
    expect(JSON.parse(inspect.stdout)).toMatchObject({ Size: String(data.length), Checksum: sha512, CompressionMethod: 'gzip' });

    const v = await run(['verify', '--target', target]);
    expect(v).toMatchObject({ code: 0 });
    expect(v.stdout).toMatch(/^ok: 1 backups, 3 blocks checked, 0 problems/);

    const out = path.join(work, 'restored.img');
    const r = await run(['restore', '--backup-url', `${target}?backingImage=disk`, '--output', out, '--json']);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ name: 'disk', size: data.length, sha512, blockCount: 3, verification: 'sha512-chain' });
    expect((await fs.readFile(out)).equals(data)).toBe(true);

    // --root confines the output: inside it (relative or absolute) works, outside is refused before anything is written
    const disk = path.join(work, 'disk');
    await fs.mkdir(disk);
    const inside = await run(['restore', '--backup-url', `${target}?backingImage=disk`, '--root', disk, '--output', 'restored.img']);
    expect(inside).toMatchObject({ code: 0 }); // the whole result: its stderr says why when it fails
    expect((await fs.readFile(path.join(disk, 'restored.img'))).equals(data)).toBe(true);
    const escape = await run(['restore', '--backup-url', `${target}?backingImage=disk`, '--root', disk, '--output', '../escaped.img']);
    expect(escape.code).toBe(1);
    expect(escape.stderr).toContain('invalid output "../escaped.img": it must not contain "." or ".." segments');
    await expect(fs.stat(path.join(work, 'escaped.img'))).rejects.toThrow('ENOENT');
    const outside = await run(['restore', '--backup-url', `${target}?backingImage=disk`, '--root', disk, '--output', path.join(work, 'escaped.img')]);
    expect(outside.code).toBe(1);
    expect(outside.stderr).toContain('outside the disk root');
    await expect(fs.stat(path.join(work, 'escaped.img'))).rejects.toThrow('ENOENT');

    const gc = await run(['gc', '--target', target, '--dry-run', '--json']);
    expect(JSON.parse(gc.stdout)).toMatchObject({ swept: true, dryRun: true, removedBlocks: [], totalBlocks: 3 });

    const rm = await run(['rm', '--backup-url', `${target}?backingImage=disk`]);
    expect(rm).toMatchObject({ code: 0 });
    expect(rm.stdout).toMatch(/removed disk; removed 3 unreferenced blocks/);
    expect(JSON.parse((await run(['ls', '--target', target, '--json'])).stdout)).toEqual([]);
  });

  it('reads the Longhorn fixture', async () => {
    const out = path.join(work, 'fixture.img');
    const r = await run(['restore', '--backup-url', `vfs://${FIXTURE}?backingImage=fixture-lz4`, '--output', out]);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('sha512 290be67edd2c1bf69fca775bbc4e78914c750470f4ac7cfb1771128c8f9a913f4316ec422371500e608326da74ff91bc17170656a87bc606543b467b5e06e033');
  });

  it('keeps Longhorn\'s 2 s lock check wait by default and takes the lock timing knob from the environment', async () => {
    const target = `vfs://${path.join(work, 'lock-store')}`;
    let t0 = Date.now();
    const slow = await run(['gc', '--target', target, '--dry-run'], {});
    expect(slow.code).toBe(0);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2000);
    // the knob is read: a longer wait than the default is waited (a lower bound, which a loaded machine cannot break;
    // the default wait plus a process start stays well below it on a machine that is not loaded)
    t0 = Date.now();
    const longer = await run(['gc', '--target', target, '--dry-run'], { BACKUPSTORE_LOCK_CHECK_WAIT_MS: '3500' });
    expect(longer.code).toBe(0);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(3500);
    const bad = await run(['gc', '--target', target], { BACKUPSTORE_LOCK_CHECK_WAIT_MS: '2s' });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('invalid BACKUPSTORE_LOCK_CHECK_WAIT_MS "2s": expected a non-negative integer of milliseconds');
    const inverted = await run(['gc', '--target', target], { BACKUPSTORE_LOCK_REFRESH_MS: '200000' });
    expect(inverted.code).toBe(2);
    expect(inverted.stderr).toContain('the refresh interval (200000 ms) must be above 0 and below the lock duration (150000 ms)');
  });

  it('exits 2 on usage errors and 1 when the operation fails', async () => {
    expect((await run([])).code).toBe(2);
    expect((await run(['frobnicate'])).code).toBe(2);
    const missing = await run(['backup', '--target', 'vfs:///x']);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('missing --name');
    expect((await run(['ls', '--target', 'vfs:///x', '--name', 'n'])).stderr).toContain('option --name does not apply to ls');
    expect((await run(['ls', '--target', 'vfs:///x', '--credential', 'novalue'])).code).toBe(2);
    const failed = await run(['inspect', '--backup-url', `vfs://${work}/empty?backingImage=nope`, '--json']);
    expect(failed.code).toBe(1);
    expect(JSON.parse(failed.stdout)).toEqual({ error: expect.stringMatching(/cannot find .*nope\/backing-image.cfg in backupstore/), code: 'NotFound' });
    const s3 = await run(['ls', '--target', 's3://bucket@us-east-1/']);
    expect(s3.code).toBe(1);
    expect(s3.stderr).toMatch(/missing AWS_ACCESS_KEY_ID/);
    const badScheme = await run(['ls', '--target', 'file:///tmp']);
    expect(badScheme).toMatchObject({ code: 1, stderr: expect.stringContaining('scheme "file"') });
  });
});
