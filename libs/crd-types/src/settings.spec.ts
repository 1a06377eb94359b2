import { describe, expect, it } from '@jest/globals';
import { checksumProblem, normalizeChecksum, parseExpectedChecksum, validateChecksumField } from './checksum.js';
import { parseSettingValue, SETTINGS, SETTING_NAMES, settingDefaultValue, validateSettingValue } from './settings.js';
import { ValidationError } from './schema/errors.js';

describe('settings table', () => {
  it('has Longhorn defaults and ranges', () => {
    expect(SETTINGS['backing-image-cleanup-wait-interval']).toMatchObject({ type: 'int', default: 60, min: 0, unit: 'minutes' });
    expect(SETTINGS['backing-image-recovery-wait-interval']).toMatchObject({ type: 'int', default: 300, min: 0, unit: 'seconds' });
    expect(SETTINGS['default-min-number-of-backing-image-copies']).toMatchObject({ type: 'int', default: 3, min: 1 });
    expect(SETTINGS['concurrent-backing-image-replenish-per-node-limit']).toMatchObject({ type: 'int', default: 5, min: 0 });
    expect(SETTINGS['backup-concurrent-limit']).toMatchObject({ type: 'int', default: 2, min: 1 });
    expect(SETTINGS['backup-compression-method']).toMatchObject({ type: 'string', default: 'lz4', options: ['none', 'lz4', 'gzip'] });
    expect(SETTINGS['replica-file-sync-http-client-timeout']).toMatchObject({ default: 30, min: 5, max: 120 });
    expect(SETTINGS['default-backing-image-manager-image']).toMatchObject({ type: 'deprecated', readOnly: true, required: true });
    expect(SETTINGS['allow-empty-disk-selector-volume'].default).toBe(true);
    expect(SETTINGS['system-managed-pods-image-pull-policy'].options).toEqual(['if-not-present', 'always', 'never']);
  });

  it('every default passes its own validator', () => {
    for (const name of SETTING_NAMES) {
      if (SETTINGS[name].type === 'deprecated') continue;
      expect(validateSettingValue(name, settingDefaultValue(name))).toEqual([]);
    }
  });
});

describe('validateSettingValue', () => {
  it('checks integers, ranges, booleans, options, required and names', () => {
    expect(validateSettingValue('default-min-number-of-backing-image-copies', '0').map((i) => i.message)).toEqual([
      'default-min-number-of-backing-image-copies: must be >= 1 (got 0)',
    ]);
    expect(validateSettingValue('replica-file-sync-http-client-timeout', '121').map((i) => i.message)).toEqual([
      'replica-file-sync-http-client-timeout: must be <= 120 (got 121)',
    ]);
    expect(validateSettingValue('backing-image-cleanup-wait-interval', '1.5')[0]).toMatchObject({ rule: 'type' });
    expect(validateSettingValue('backing-image-cleanup-wait-interval', 'ten')[0]).toMatchObject({ rule: 'type' });
    expect(validateSettingValue('allow-empty-node-selector-volume', 'yes')[0]).toMatchObject({ rule: 'type' });
    expect(validateSettingValue('backup-compression-method', 'zstd').map((i) => i.message)).toEqual([
      'backup-compression-method: must be one of "none", "lz4", "gzip" (got "zstd")',
    ]);
    expect(validateSettingValue('backup-concurrent-limit', '')[0]).toMatchObject({ rule: 'required' });
    expect(validateSettingValue('storage-network', '')).toEqual([]);
    expect(validateSettingValue('no-such-setting', '1')[0]).toMatchObject({ rule: 'reference', path: 'no-such-setting' });
    expect(validateSettingValue('backing-image-recovery-wait-interval', '0')).toEqual([]);
  });

  it('parses typed values, falling back to the default for an unset value', () => {
    expect(parseSettingValue('default-min-number-of-backing-image-copies', '2')).toBe(2);
    expect(parseSettingValue('default-min-number-of-backing-image-copies', undefined)).toBe(3);
    expect(parseSettingValue('backup-concurrent-limit', '')).toBe(2);
    expect(parseSettingValue('allow-empty-disk-selector-volume', 'false')).toBe(false);
    expect(parseSettingValue('backup-compression-method', 'gzip')).toBe('gzip');
    expect(() => parseSettingValue('backup-concurrent-limit', '0')).toThrow(ValidationError);
    expect(() => parseSettingValue('backup-concurrent-limit', '0')).toThrow('backup-concurrent-limit: must be >= 1 (got 0)');
  });
});

describe('checksums', () => {
  const sha512 = 'ab'.repeat(64);
  it('accepts empty, bare SHA-512 and prefixed digests of the right length', () => {
    expect(parseExpectedChecksum('')).toBeNull();
    expect(parseExpectedChecksum(sha512)).toEqual({ algorithm: 'sha512', hex: sha512 });
    expect(parseExpectedChecksum(`sha512:${sha512}`)).toEqual({ algorithm: 'sha512', hex: sha512 });
    expect(parseExpectedChecksum(`sha256:${'c'.repeat(64)}`)).toEqual({ algorithm: 'sha256', hex: 'c'.repeat(64) });
    expect(parseExpectedChecksum(`sha1:${'d'.repeat(40)}`)).toEqual({ algorithm: 'sha1', hex: 'd'.repeat(40) });
    expect(parseExpectedChecksum(`md5:${'e'.repeat(32)}`)).toEqual({ algorithm: 'md5', hex: 'e'.repeat(32) });
  });

  it('rejects wrong lengths, non-hex, upper case and unknown algorithms with a reason', () => {
    expect(checksumProblem('a'.repeat(127))).toBe('sha512 checksum must be 128 hex characters (got 127)');
    expect(checksumProblem(`sha256:${'c'.repeat(128)}`)).toBe('sha256 checksum must be 64 hex characters (got 128)');
    expect(checksumProblem('g'.repeat(128))).toMatch(/must be lowercase hexadecimal/);
    expect(checksumProblem('A'.repeat(128))).toMatch(/must be lowercase hexadecimal/);
    expect(checksumProblem(`crc32:${'0'.repeat(8)}`)).toBe('unknown checksum algorithm "crc32" (expected one of sha512, sha256, sha1, md5)');
    expect(() => parseExpectedChecksum('xyz')).toThrow('invalid checksum: sha512 checksum must be lowercase hexadecimal (got "xyz")');
    expect(validateChecksumField('spec.checksum', 'abc')).toEqual([
      { path: 'spec.checksum', rule: 'checksum', message: 'spec.checksum: invalid checksum abc: sha512 checksum must be 128 hex characters (got 3)' },
    ]);
  });

  it('normalises by trimming and lower-casing', () => {
    expect(normalizeChecksum(`  ${'AB'.repeat(64)}\n`)).toBe(sha512);
  });
});
