import { describe, it, expect } from '@jest/globals';
import { describeCopies, formatBytes, formatDuration, parseExpectedChecksum, summariseCopies } from './index.js';

const f = (state: string, progress = 0) => ({ state, progress, message: '', lastStateTransitionTime: '' });

describe('formatting and checksums', () => {
  it('formats sizes and durations', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(1536)).toBe('1.50 KiB');
    expect(formatBytes(32 << 20)).toBe('32.0 MiB');
    expect(formatBytes(-1)).toBe('-');
    expect(formatDuration(3723)).toBe('1h02m03s');
    expect(formatDuration(65)).toBe('1m05s');
    expect(formatDuration(Infinity)).toBe('--');
  });

  it('summarises copy states', () => {
    const s = summariseCopies({ deletionTimestamp: '', diskFileStatusMap: { a: f('ready', 100), b: f('in-progress', 40), c: f('failed') } });
    expect(s).toMatchObject({ total: 3, ready: 1, inProgress: 1, failed: 1, progress: 20, phase: 'ready', allFailed: false });
    expect(describeCopies(s)).toBe('1/3 ready, 1 in progress, 1 failed');
    expect(summariseCopies({ deletionTimestamp: '', diskFileStatusMap: { a: f('failed'), b: f('failed-and-cleanup') } }).phase).toBe('failed');
    expect(summariseCopies({ deletionTimestamp: 'x', diskFileStatusMap: { a: f('ready', 100) } }).phase).toBe('deleting');
    expect(summariseCopies({ deletionTimestamp: '', diskFileStatusMap: {} })).toMatchObject({ total: 0, progress: 0, phase: 'pending' });
  });

  it('parses expected checksums of every supported algorithm', () => {
    const sha512 = 'AB'.repeat(64);
    expect(parseExpectedChecksum(` ${sha512} `)).toEqual({ algorithm: 'sha512', hex: sha512.toLowerCase(), wire: sha512.toLowerCase() });
    expect(parseExpectedChecksum(`sha512:${'c'.repeat(128)}`)?.wire).toBe('c'.repeat(128));
    expect(parseExpectedChecksum(`SHA256:${'d'.repeat(64)}`)?.wire).toBe(`sha256:${'d'.repeat(64)}`);
    expect(parseExpectedChecksum(`md5:${'e'.repeat(32)}`)?.algorithm).toBe('md5');
    expect(parseExpectedChecksum('')).toBeUndefined();
    expect(() => parseExpectedChecksum('abc')).toThrow('a sha512 checksum has 128 hex characters, got 3');
    expect(() => parseExpectedChecksum(`sha256:${'z'.repeat(64)}`)).toThrow('must be hexadecimal');
    expect(() => parseExpectedChecksum(`crc32:${'0'.repeat(8)}`)).toThrow('unknown checksum algorithm "crc32"');
  });
});
