import { promises as fs } from 'node:fs';
import * as path from 'node:path';
import { describe, expect, it } from '@jest/globals';
import {
  decodeBackingImageConfig,
  encodeBackingImageConfig,
  encodeBackupInfo,
  encodeLockFile,
  decodeLockFile,
  effectiveCompressionMethod,
} from './config.js';
import { goIndentTabs, goJsonString } from './go-json.js';
import { blockChecksum, blockPath, lockDir, BACKUP_BLOCK_SIZE } from './names.js';
import { encodeBackupUrl, parseBackupUrl, parseTargetUrl } from './url.js';
import { compressBlock, decompressAndVerifyBlock, sniffEncoding } from './compression.js';
import { FIXTURE_STORE, patternBlock } from './test-support/images.js';

const FIXTURE_CFG = path.join(FIXTURE_STORE, 'backupstore/backing-images/backing-images/fixture-lz4/backing-image.cfg');

describe('backing-image.cfg encoding', () => {
  it('re-encodes the Longhorn fixture config byte for byte', async () => {
    const text = await fs.readFile(FIXTURE_CFG, 'utf8');
    expect(text.length).toBe(805);
    const config = decodeBackingImageConfig(text);
    expect(config.size).toBe(9437307);
    expect(config.blocks).toHaveLength(4);
    expect(config.labels).toEqual({ app: 'fixture' });
    expect(encodeBackingImageConfig(config, false)).toBe(text);
  });

  it('writes the in-progress marker shape: ProcessingBlocks null, no Blocks, no trailing newline', () => {
    const text = encodeBackingImageConfig(
      {
        name: 'img-a',
        size: 9437307,
        blockCount: 0,
        checksum: 'ab',
        labels: null,
        compressionMethod: 'lz4',
        createdTime: '2026-11-22T08:47:51Z',
        completeTime: '',
        secret: '',
        secretNamespace: '',
        blocks: [{ offset: 0, blockChecksum: 'f'.repeat(64) }],
      },
      true,
    );
    expect(text).toBe(
      '{"Name":"img-a","Size":"9437307","BlockCount":"0","Checksum":"ab","Labels":null,"CompressionMethod":"lz4","CreatedTime":"2026-11-22T08:47:51Z","CompleteTime":"","Secret":"","SecretNamespace":"","ProcessingBlocks":null}',
    );
  });

  it('escapes like Go: HTML-safe, sorted map keys, U+2028, control characters, lone surrogates', () => {
    expect(goJsonString('a<b>&c')).toBe('"a\\u003cb\\u003e\\u0026c"');
    expect(goJsonString('x\u2028y\u2029')).toBe('"x\\u2028y\\u2029"');
    expect(goJsonString('\b\f\n\r\t\u0001\u001f')).toBe('"\\b\\f\\n\\r\\t\\u0001\\u001f"');
    expect(goJsonString('\ud800é')).toBe('"\ufffdé"');
    const text = encodeBackingImageConfig(
      {
        name: 'n1', size: 1, blockCount: 0, checksum: '', labels: { note: 'a<b>&c', app: 'fixture', B: 'x' },
        compressionMethod: 'none', createdTime: '', completeTime: 't', secret: 'my-secret', secretNamespace: 'longhorn-system', blocks: [],
      },
      false,
    );
    expect(text).toContain('"Labels":{"B":"x","app":"fixture","note":"a\\u003cb\\u003e\\u0026c"}');
    expect(text).toContain('"ProcessingBlocks":{"Blocks":{}}}');
    expect(text).not.toContain('"Blocks":[');
  });

  it('reads what Longhorn reads: case-insensitive keys, missing method means gzip, int64 strings', () => {
    const c = decodeBackingImageConfig('{"name":"x1","SIZE":"10","blocks":[{"offset":0,"blockchecksum":"' + 'a'.repeat(64) + '"}],"Extra":1}');
    expect(c.name).toBe('x1');
    expect(c.size).toBe(10);
    expect(c.blocks).toEqual([{ offset: 0, blockChecksum: 'a'.repeat(64) }]);
    expect(effectiveCompressionMethod(c)).toBe('gzip');
    expect(() => decodeBackingImageConfig('{"Name":"x1","Size":"ten"}')).toThrow(/Size is not a valid size/);
    expect(() => decodeBackingImageConfig('{"Name":"x1","CompressionMethod":"zstd"}')).not.toThrow();
    expect(() => effectiveCompressionMethod(decodeBackingImageConfig('{"CompressionMethod":"zstd"}'))).toThrow(/unsupported compression method/);
  });

  it('prints BackupInfo like inspect-backing-image (tab-indented)', () => {
    const info = encodeBackupInfo({
      name: 'fixture-lz4', url: 'vfs:///s?backingImage=fixture-lz4', completeAt: 't', size: 9437307, checksum: 'c',
      labels: { app: 'fixture' }, compressionMethod: 'lz4', secret: '', secretNamespace: '',
    });
    expect(goIndentTabs(info)).toBe(
      '{\n\t"Name": "fixture-lz4",\n\t"URL": "vfs:///s?backingImage=fixture-lz4",\n\t"CompleteAt": "t",\n\t"Size": "9437307",\n\t"Checksum": "c",\n\t"Labels": {\n\t\t"app": "fixture"\n\t},\n\t"CompressionMethod": "lz4",\n\t"Secret": "",\n\t"SecretNamespace": ""\n}',
    );
  });

  it('encodes lock files as Longhorn does', () => {
    const text = encodeLockFile({ name: 'lock-02c4b286ef6a4386', type: 1, acquired: true });
    expect(text).toBe('{"Name":"lock-02c4b286ef6a4386","Type":1,"Acquired":true}');
    expect(decodeLockFile(text, 'x')).toEqual({ name: 'lock-02c4b286ef6a4386', type: 1, acquired: true });
  });
});

describe('names and paths', () => {
  it('names blocks by the first 32 bytes of SHA-512', () => {
    expect(blockChecksum(Buffer.alloc(BACKUP_BLOCK_SIZE))).toBe('731859029215873fdac1c9f2f8bd25a334abf0f3a9e1b057cf2cacc2826d86b0');
    expect(blockPath('731859029215873fdac1c9f2f8bd25a334abf0f3a9e1b057cf2cacc2826d86b0')).toBe(
      'backupstore/backing-images/blocks/73/18/731859029215873fdac1c9f2f8bd25a334abf0f3a9e1b057cf2cacc2826d86b0.blk',
    );
    expect(blockChecksum('pvc-fixture').slice(0, 4)).toBe('0672');
    expect(lockDir()).toBe('backupstore/volumes/22/fc/BACKINGIMAGE/locks');
  });
});

describe('backup URLs', () => {
  const cases: [string, string, string][] = [
    ['s3://bucket@us-east-1/', 's3://bucket@us-east-1/?backingImage=my-bi', 's3://bucket@us-east-1/'],
    ['s3://bucket@us-east-1/prefix/', 's3://bucket@us-east-1/prefix/?backingImage=my-bi', 's3://bucket@us-east-1/prefix/'],
    [
      'nfs://host:/opt/backupstore?nfsOptions=soft,timeo=330',
      'nfs://host:/opt/backupstore?nfsOptions=soft,timeo=330&backingImage=my-bi',
      'nfs://host:/opt/backupstore',
    ],
    ['vfs:///mnt/store', 'vfs:///mnt/store?backingImage=my-bi', 'vfs:///mnt/store'],
  ];
  it.each(cases)('%s encodes and decodes as in Longhorn', (target, backupUrl, stripped) => {
    expect(encodeBackupUrl('my-bi', target)).toBe(backupUrl);
    const parsed = parseBackupUrl(backupUrl);
    expect(parsed.name).toBe('my-bi');
    expect(parsed.strippedTargetUrl).toBe(stripped);
    expect(parsed.targetUrl).toBe(target);
  });

  it('parses targets and rejects bad ones with a clear error', () => {
    expect(parseTargetUrl('s3://bkt@eu-west-1/a/b/')).toEqual({ scheme: 's3', bucket: 'bkt', region: 'eu-west-1', prefix: 'a/b' });
    expect(parseTargetUrl('s3://bkt/')).toEqual({ scheme: 's3', bucket: 'bkt', region: '', prefix: '' });
    expect(parseTargetUrl('nfs://10.0.0.1:/export/x?nfsOptions=soft&nfsOptions=timeo=300')).toMatchObject({
      scheme: 'nfs', host: '10.0.0.1', path: '/export/x', mountOptions: ['soft', 'timeo=300'],
    });
    expect(() => parseTargetUrl('file:///x')).toThrow(/unsupported backup target.*scheme "file"/);
    expect(() => parseTargetUrl('vfs://host/x')).toThrow(/no host/);
    expect(() => parseBackupUrl('vfs:///x')).toThrow(/missing \?backingImage/);
    expect(() => parseBackupUrl('vfs:///x?backingImage=a')).toThrow(/invalid backing image name/);
  });
});

describe('block compression', () => {
  const block = patternBlock(7);
  const sum = blockChecksum(block);
  it.each(['none', 'gzip', 'lz4'] as const)('%s round-trips and verifies', async (method) => {
    const stored = await compressBlock(method, block);
    if (method === 'lz4') expect(stored.subarray(0, 7).toString('hex')).toBe('04224d186470b9');
    if (method === 'gzip') expect(stored.subarray(0, 3).toString('hex')).toBe('1f8b08');
    expect(sniffEncoding(stored)).toBe(method === 'none' ? 'raw' : method);
    // Whatever the config says, the stored encoding is sniffed (Longhorn's gzip<->lz4 fallback, extended to none).
    for (const configured of ['none', 'gzip', 'lz4'] as const) {
      expect((await decompressAndVerifyBlock(configured, stored, sum, 'p')).equals(block)).toBe(true);
    }
  });

  it('the lz4 output is a frame the reference lz4 tool decodes', async () => {
    const { execFileSync } = await import('node:child_process');
    const stored = await compressBlock('lz4', block);
    const out = execFileSync('lz4', ['-d', '-c'], { input: stored, maxBuffer: 8 << 20 });
    expect(out.equals(block)).toBe(true);
  });

  it('fails naming the block when content does not match its name', async () => {
    const stored = await compressBlock('lz4', patternBlock(8));
    await expect(decompressAndVerifyBlock('lz4', stored, sum, 'backupstore/x.blk')).rejects.toThrow(
      'decompression verification failed for block backupstore/x.blk: checksum verification failed for block',
    );
    await expect(decompressAndVerifyBlock('gzip', Buffer.from('1f8b0000', 'hex'), sum, 'b.blk')).rejects.toThrow(
      /decompression verification failed for block b.blk: failed to decompress/,
    );
  });
});
