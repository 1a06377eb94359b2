import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { DiskPathError } from '@bis/disk-path';
import { createSandbox, listTree, snapshotOutside, type Sandbox } from '@bis/disk-path/testing';
import { createBackup } from './backup.js';
import { restoreBackup } from './restore.js';
import { FAST_LOCKS, sha512File, writeImage } from '../test-support/images.js';

/**
 * The restore target: with `root` (the disk a manager or data source restores into), the output must lie inside it.
 * Each refused output is refused before anything is read from the store or written: the sandbox outside the disk and
 * the store (no lock file taken) are unchanged.
 */
let s: Sandbox;
let store: string;
let backupUrl: string;
let sha512: string;

beforeAll(async () => {
  s = await createSandbox('restore-confinement-');
  store = path.join(s.base, 'store');
  await fs.mkdir(store);
  const img = path.join(s.base, 'source.img');
  ({ sha512 } = await writeImage(img, [{ kind: 'data', seed: 1 }, { kind: 'hole' }]));
  const r = await createBackup({ target: `vfs://${store}`, name: 'img', filePath: img, lockTiming: FAST_LOCKS });
  backupUrl = r.backupUrl;
});

afterAll(async () => s?.remove());

describe('restoreBackup: the output is confined to root', () => {
  it('restores into the disk (absolute or relative to the root)', async () => {
    const out = path.join(s.root, 'tmp', 'img-u1');
    const r = await restoreBackup({ backupUrl, output: out, root: s.root, lockTiming: FAST_LOCKS });
    expect(r.sha512).toBe(sha512);
    expect(await sha512File(out)).toBe(sha512);
    const r2 = await restoreBackup({ backupUrl, output: 'tmp/img-u2', root: s.root, lockTiming: FAST_LOCKS });
    expect(r2.sha512).toBe(sha512);
    await fs.rm(out);
    await fs.rm(path.join(s.root, 'tmp', 'img-u2'));
  });

  const outputs = (sb: Sandbox): Array<[string, string]> => [
    ['absolute outside', sb.victimFile],
    ['absolute new file outside', path.join(sb.base, 'created.img')],
    ['relative ..', '../victim.txt'],
    ['.. inside an absolute path', `${sb.root}/tmp/../../victim.txt`],
    ['root prefix sibling', path.join(sb.prefixSibling, 'out.img')],
    ['NUL byte', `${sb.root}/tmp/out\0.img`],
    ['planted file link', `${sb.root}/tmp/lnk-x`],
    ['planted directory link', `${sb.root}/backing-images/evil-x/backing`],
    ['relative link to ../..', 'backing-images/up-x/victim.txt'],
    ['the root itself', sb.root],
    ['empty', ''],
  ];

  it('refuses outputs outside the root before touching the store or the disk', async () => {
    for (const [label, output] of outputs(s)) {
      const before = await snapshotOutside(s);
      const storeBefore = await listTree(store);
      const err = await restoreBackup({ backupUrl, output, root: s.root, lockTiming: FAST_LOCKS }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect({ label, refused: err instanceof DiskPathError, parameter: (err as DiskPathError).parameter }).toEqual({ label, refused: true, parameter: 'output' });
      expect({ label, outside: await snapshotOutside(s) }).toEqual({ label, outside: before });
      expect({ label, store: await listTree(store) }).toEqual({ label, store: storeBefore });
    }
  });

  it('without root, a NUL byte or an empty output is still refused', async () => {
    await expect(restoreBackup({ backupUrl, output: `${s.base}/x\0`, lockTiming: FAST_LOCKS })).rejects.toThrow('invalid output');
    await expect(restoreBackup({ backupUrl, output: '', lockTiming: FAST_LOCKS })).rejects.toThrow('invalid output');
  });
});
