import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import {
  DiskPathError,
  assertNoEscapingLinks,
  confineDiskPath,
  confineToRoot,
  resolveDiskPath,
  type DiskPathRequest,
} from './disk-path.js';
import { createSandbox, snapshotOutside, traversalCases, type Sandbox } from './testing/index.js';

function refusal(fn: () => unknown): DiskPathError {
  try {
    fn();
  } catch (err) {
    if (err instanceof DiskPathError) return err;
    throw err;
  }
  throw new Error('expected a DiskPathError, nothing was thrown');
}

async function refusalAsync(p: Promise<unknown>): Promise<DiskPathError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof DiskPathError) return err;
    throw err;
  }
  throw new Error('expected a DiskPathError, nothing was thrown');
}

describe('resolveDiskPath (lexical)', () => {
  const root = '/data/';

  it("builds Longhorn's layout from a name and a uuid", () => {
    expect(resolveDiskPath({ root, kind: 'backing-file', name: 'img1', uuid: 'u1234' })).toEqual({
      path: '/data/backing-images/img1-u1234/backing', kind: 'backing-file', entry: 'img1-u1234',
    });
    expect(resolveDiskPath({ root, kind: 'backing-dir', name: 'img1', uuid: 'u1234' }).path).toBe('/data/backing-images/img1-u1234');
    expect(resolveDiskPath({ root, kind: 'data-source-file', name: 'a.b_c-d', uuid: 'U-1' }).path).toBe('/data/tmp/a.b_c-d-U-1');
  });

  it("accepts the absolute file paths Longhorn's manager sends, inside the disk", () => {
    expect(resolveDiskPath({ root, kind: 'any', filePath: '/data/backing-images/img1-u1234/backing', uuid: 'u1234' }).kind).toBe('backing-file');
    expect(resolveDiskPath({ root, kind: 'any', filePath: '/data/tmp/img1-u1234', uuid: 'u1234' }).kind).toBe('data-source-file');
    // a name with dashes: the uuid given decides where the name ends
    expect(resolveDiskPath({ root, kind: 'any', filePath: '/data/backing-images/my-img-a-b/backing', uuid: 'a-b', name: 'my-img' }).entry).toBe('my-img-a-b');
    // without a uuid (a /v1/files/{id}) the entry only has to look like <name>-<uuid>
    expect(resolveDiskPath({ root: '/data', kind: 'any', filePath: '/data/tmp/img1-u1234' }).path).toBe('/data/tmp/img1-u1234');
  });

  const refused: Array<[string, Partial<DiskPathRequest>, string, string]> = [
    ['empty name', { kind: 'backing-file', name: '', uuid: 'u' }, 'name', 'empty'],
    ['name with ..', { kind: 'backing-file', name: '../../victim', uuid: 'x' }, 'name', 'invalid-name'],
    ['name with NUL', { kind: 'backing-file', name: 'a\0b', uuid: 'x' }, 'name', 'nul-byte'],
    ['upper case name', { kind: 'backing-file', name: 'Img', uuid: 'x' }, 'name', 'invalid-name'],
    ['one-character name', { kind: 'backing-file', name: 'a', uuid: 'x' }, 'name', 'invalid-name'],
    ['name of 254', { kind: 'backing-file', name: 'a'.repeat(254), uuid: 'x' }, 'name', 'too-long'],
    ['entry of 241', { kind: 'backing-file', name: 'a'.repeat(230), uuid: 'u'.repeat(10) }, 'name', 'too-long'],
    ['uuid with /', { kind: 'backing-file', name: 'img', uuid: 'x/..' }, 'uuid', 'invalid-uuid'],
    ['uuid of 65', { kind: 'backing-file', name: 'img', uuid: 'u'.repeat(65) }, 'uuid', 'too-long'],
    ['relative file path', { kind: 'any', filePath: 'backing-images/img-x/backing', uuid: 'x' }, 'file-path', 'not-absolute'],
    ['.. in the file path', { kind: 'any', filePath: '/data/backing-images/../../etc-x/backing', uuid: 'x' }, 'file-path', 'dot-segment'],
    ['. in the file path', { kind: 'any', filePath: '/data/./backing-images/img-x/backing', uuid: 'x' }, 'file-path', 'dot-segment'],
    ['// in the file path', { kind: 'any', filePath: '/data//backing-images/img-x/backing', uuid: 'x' }, 'file-path', 'not-in-layout'],
    ['trailing /', { kind: 'any', filePath: '/data/backing-images/img-x/backing/', uuid: 'x' }, 'file-path', 'not-in-layout'],
    ['outside the root', { kind: 'any', filePath: '/etc/passwd', uuid: 'x' }, 'file-path', 'outside-root'],
    ['root prefix sibling', { kind: 'any', filePath: '/data-evil/backing-images/img-x/backing', uuid: 'x' }, 'file-path', 'outside-root'],
    ['disk config', { kind: 'any', filePath: '/data/longhorn-disk.cfg', uuid: 'x' }, 'file-path', 'not-in-layout'],
    ['entry directory for any', { kind: 'any', filePath: '/data/backing-images/img-x', uuid: 'x' }, 'file-path', 'not-in-layout'],
    ['data-source file where a backing file is wanted', { kind: 'backing-file', filePath: '/data/tmp/img-x', uuid: 'x' }, 'file-path', 'not-in-layout'],
    ['uuid not matching', { kind: 'any', filePath: '/data/backing-images/img-y/backing', uuid: 'x' }, 'file-path', 'uuid-mismatch'],
    ['bad name inside a file path', { kind: 'any', filePath: '/data/backing-images/IMG-x/backing', uuid: 'x' }, 'file-path', 'invalid-name'],
    ['name not matching', { kind: 'any', filePath: '/data/backing-images/img-x/backing', uuid: 'x', name: 'other' }, 'file-path', 'name-mismatch'],
    ['NUL in the file path', { kind: 'any', filePath: '/data/backing-images/img-x/backing\0', uuid: 'x' }, 'file-path', 'nul-byte'],
    ['overlong file path', { kind: 'any', filePath: '/data/' + 'a/'.repeat(2100), uuid: 'x' }, 'file-path', 'too-long'],
    ['entry without a uuid part (id)', { kind: 'any', filePath: '/data/tmp/img' }, 'file-path', 'invalid-name'],
  ];
  it.each(refused)('refuses %s, naming the parameter', (_label, req, parameter, reason) => {
    const err = refusal(() => resolveDiskPath({ root, kind: 'backing-file', ...req }));
    expect(err.parameter).toBe(parameter);
    expect(err.reason).toBe(reason);
    expect(err.httpStatus).toBe(400);
    expect(err.message).toMatch(new RegExp(`^invalid ${parameter} "`));
  });

  it('names the caller\'s parameters and shows a NUL in the message', () => {
    const err = refusal(() => resolveDiskPath({ root, kind: 'backing-file', name: 'a\0', uuid: 'x', parameters: { name: 'backing-image' } }));
    expect(err.message).toBe('invalid backing-image "a\\u0000": it contains a NUL byte');
    expect(refusal(() => resolveDiskPath({ root, kind: 'any', filePath: '/x', parameters: { filePath: 'dst-file-path' } })).message).toBe(
      'invalid dst-file-path "/x": it is outside the disk root /data',
    );
  });

  it('refuses a relative or root disk root', () => {
    expect(refusal(() => resolveDiskPath({ root: 'data', kind: 'backing-file', name: 'ab', uuid: 'x' })).reason).toBe('invalid-root');
    expect(refusal(() => resolveDiskPath({ root: '/', kind: 'backing-file', name: 'ab', uuid: 'x' })).reason).toBe('invalid-root');
  });
});

describe('confineDiskPath / confineToRoot (symbolic links, real files)', () => {
  let s: Sandbox;
  beforeAll(async () => {
    s = await createSandbox('disk-path-unit-');
  });
  afterAll(async () => s.remove());

  it('accepts a path whose parts do not exist yet, and one that exists as plain directories', async () => {
    expect((await confineDiskPath({ root: s.root, kind: 'backing-file', name: 'new', uuid: 'x' })).path).toBe(`${s.root}/backing-images/new-x/backing`);
    await fsp.mkdir(`${s.root}/backing-images/dir-x`);
    await fsp.writeFile(`${s.root}/backing-images/dir-x/backing`, 'x');
    expect((await confineDiskPath({ root: s.root, kind: 'any', filePath: `${s.root}/backing-images/dir-x/backing`, uuid: 'x' })).kind).toBe('backing-file');
  });

  it('accepts a disk root reached through a link, and a link inside the disk that stays inside', async () => {
    const alias = path.join(s.base, 'disk-alias');
    await fsp.symlink(s.root, alias);
    try {
      await fsp.mkdir(`${s.root}/backing-images/real-x`, { recursive: true });
      await fsp.symlink(`${s.root}/backing-images/real-x`, `${s.root}/backing-images/inner-x`);
      expect((await confineDiskPath({ root: alias, kind: 'backing-file', name: 'inner', uuid: 'x' })).path).toBe(`${alias}/backing-images/inner-x/backing`);
    } finally {
      await fsp.rm(alias);
      await fsp.rm(`${s.root}/backing-images/inner-x`);
    }
  });

  it.each([
    ['a directory link leading out', 'evil'],
    ['a relative link to ../..', 'up'],
    ['a file that is a link', 'file'],
  ])('refuses %s', async (_label, name) => {
    const err = await refusalAsync(confineDiskPath({ root: s.root, kind: 'backing-file', name, uuid: 'x' }));
    expect(err.reason).toBe('symlink');
    expect(err.parameter).toBe('name');
  });

  it('refuses a data-source file that is a link, and a dangling link on the way', async () => {
    expect((await refusalAsync(confineDiskPath({ root: s.root, kind: 'any', filePath: `${s.root}/tmp/lnk-x`, uuid: 'x' }))).parameter).toBe('file-path');
    await fsp.symlink(path.join(s.base, 'nowhere'), `${s.root}/backing-images/dangling-x`);
    try {
      const err = await refusalAsync(assertNoEscapingLinks(s.root, `${s.root}/backing-images/dangling-x/backing`, 'file-path'));
      expect(err.message).toContain('dangling');
    } finally {
      await fsp.rm(`${s.root}/backing-images/dangling-x`);
    }
  });

  it('confineToRoot: restore outputs inside the root only', async () => {
    expect(await confineToRoot(s.root, 'tmp/out.img', 'output')).toBe(`${s.root}/tmp/out.img`);
    expect(await confineToRoot(s.root, `${s.root}/tmp/out.img`, 'output')).toBe(`${s.root}/tmp/out.img`);
    for (const bad of ['../victim.txt', s.victimFile, `${s.root}/tmp/../../victim.txt`, 'tmp/a\0b', `${s.root}/tmp/lnk-x`, 'backing-images/evil-x/out', '', s.root]) {
      const err = await refusalAsync(confineToRoot(s.root, bad, 'output'));
      expect(err.parameter).toBe('output');
    }
  });

  it('every traversal case of the shared table is refused by the lexical or the link check, and nothing outside changes', async () => {
    const before = await snapshotOutside(s);
    const cases = traversalCases(s);
    expect(cases.length).toBeGreaterThanOrEqual(25);
    for (const c of cases) {
      const err = await refusalAsync(confineDiskPath({ root: s.root, kind: 'backing-file', name: c.name, uuid: c.uuid })).catch((e: Error) => {
        throw new Error(`${c.label} (name/uuid): ${e.message}`);
      });
      expect([c.label, err.parameter]).toEqual([c.label, c.names]);
      const wire = decodeURIComponent(c.filePathWire);
      const err2 = await refusalAsync(confineDiskPath({ root: s.root, kind: 'any', filePath: wire, uuid: 'x' })).catch((e: Error) => {
        throw new Error(`${c.label} (file path): ${e.message}`);
      });
      expect([c.label, err2.parameter]).toEqual([c.label, 'file-path']);
    }
    expect(await snapshotOutside(s)).toEqual(before);
  });
});
