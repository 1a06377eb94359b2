import { describe, it, expect, beforeEach, afterEach } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { access, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createFileSources } from './provider.js';
import { convertRawToQcow2 } from './qemu-img.js';
import { LUKS_HEADER_BYTES, LuksUnavailableError, luksParameters, probeLuks } from './luks.js';
import { hasQcow2Magic } from './qcow2.js';
import { RecordingProgress, sha } from './test-support/images.js';

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'luks-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});
const exists = (p: string): Promise<boolean> => access(p).then(() => true, () => false);
const never = (): AbortSignal => new AbortController().signal;
/** Loop devices attached to `file` (empty when none, or when losetup cannot list them). */
function loopsOf(file: string): string {
  try {
    return execFileSync('losetup', ['-j', file], { encoding: 'utf8' }).trim();
  } catch {
    return '';
  }
}
// Fast key derivation for tests (Longhorn's default argon2i costs about 2 s per operation).
const CREDENTIAL = { CRYPTO_KEY_VALUE: 'test-passphrase', CRYPTO_PBKDF: 'pbkdf2', CRYPTO_PBKDF_FORCE_ITERATIONS: '1000' };

describe('qemu-img raw to qcow2 conversion', () => {
  it('converts with progress and the same virtual size', async () => {
    const raw = join(dir, 'v.raw');
    const img = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(2 << 20), randomBytes(1 << 20)]);
    await writeFile(raw, img);
    const percents: number[] = [];
    await convertRawToQcow2({ source: raw, dest: join(dir, 'v.qcow2'), signal: never(), onProgress: (p) => percents.push(p) });
    const out = await readFile(join(dir, 'v.qcow2'));
    expect(hasQcow2Magic(out)).toBe(true);
    expect(out.readBigUInt64BE(24)).toBe(BigInt(img.length));
    expect(percents.at(-1)).toBe(100);
    // converting back gives the same bytes
    execFileSync('qemu-img', ['convert', '-f', 'qcow2', '-O', 'raw', join(dir, 'v.qcow2'), join(dir, 'back.raw')]);
    expect(sha('sha512', await readFile(join(dir, 'back.raw')))).toBe(sha('sha512', img));
  });

  it('is cancellable (no fixed time limit) and removes the partial output', async () => {
    const raw = join(dir, 'big.raw');
    await writeFile(raw, randomBytes(64 << 20));
    const ctl = new AbortController();
    const run = convertRawToQcow2({ source: raw, dest: join(dir, 'big.qcow2'), signal: ctl.signal, onProgress: () => ctl.abort(new Error('stop')) });
    await expect(run).rejects.toThrow('cancelled: stop');
    expect(await exists(join(dir, 'big.qcow2'))).toBe(false);
  });

  it('names the input when qemu-img fails', async () => {
    await expect(convertRawToQcow2({ source: join(dir, 'missing.raw'), dest: join(dir, 'x.qcow2'), signal: never() })).rejects.toThrow(/qemu-img convert .*missing\.raw/);
  });
});

// Whether this machine can open LUKS devices (cryptsetup, a free loop device, device-mapper), probed once.
const probe = await probeLuks();

describe('LUKS clone (encrypt / decrypt)', () => {

  it("reads Longhorn's CRYPTO_* parameters with their defaults", () => {
    expect(luksParameters({ CRYPTO_KEY_VALUE: 'k' })).toEqual({ passphrase: 'k', cipher: 'aes-xts-plain64', hash: 'sha256', keySize: '256', pbkdf: 'argon2i', pbkdfForceIterations: undefined, pbkdfMemory: undefined });
    expect(() => luksParameters({})).toThrow('missing CRYPTO_KEY_VALUE');
    expect(() => luksParameters({ CRYPTO_KEY_VALUE: 'k', CRYPTO_KEY_PROVIDER: 'vault' })).toThrow('unsupported CRYPTO_KEY_PROVIDER "vault"');
    expect(() => luksParameters({ CRYPTO_KEY_VALUE: 'k', CRYPTO_KEY_SIZE: 'big' })).toThrow('invalid CRYPTO_KEY_SIZE "big"');
  });

  it('an encrypt clone either works or fails naming what the machine lacks, leaving no file, mapper or loop device', async () => {
    const src = join(dir, 'backing');
    const img = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(1 << 20)]);
    await writeFile(src, img);
    const dest = join(dir, 'enc.tmp');
    const run = createFileSources().clone({ sourcePath: src, encryption: 'encrypt', credential: CREDENTIAL, dest, sink: new RecordingProgress(), signal: never() });
    if (probe.ok) {
      const r = await run;
      expect(r.size).toBe(img.length + LUKS_HEADER_BYTES);
      expect((await readFile(dest)).subarray(0, 6).toString('latin1')).toBe('LUKS\xba\xbe');
    } else {
      const err = (await run.catch((e: unknown) => e)) as Error;
      expect(err).toBeInstanceOf(Error);
      // e.g. "device-mapper is not available on this machine (/dev/mapper/control is missing …)"
      expect(err.message).toMatch(/device-mapper|loop device|cryptsetup is not installed|losetup is not installed/);
      expect(await exists(dest)).toBe(false);
    }
    expect(loopsOf(dest)).toBe('');
  });

  // Runs only where the machine has cryptsetup, a free loop device and device-mapper (probeLuks). A container
  // whose kernel has no device-mapper cannot open LUKS devices, so the round trip is skipped there; the reason is
  // computed at run time and is part of the test name.
  (probe.ok ? it : it.skip)(`encrypt then decrypt gives back the same SHA-512${probe.ok ? '' : ` (skipped: ${probe.reason})`}`, async () => {
    const src = join(dir, 'backing');
    const img = Buffer.concat([randomBytes(1 << 20), Buffer.alloc(1 << 20), randomBytes(4096)]);
    await writeFile(src, img);
    const enc = join(dir, 'enc.tmp');
    await createFileSources().clone({ sourcePath: src, encryption: 'encrypt', credential: CREDENTIAL, dest: enc, sink: new RecordingProgress(), signal: never() });
    const dec = join(dir, 'dec.tmp');
    const r = await createFileSources().clone({ sourcePath: enc, encryption: 'decrypt', credential: CREDENTIAL, dest: dec, sink: new RecordingProgress(), signal: never() });
    expect(r.sha512).toBe(sha('sha512', img));
    expect((await stat(dec)).size).toBe(img.length);
    expect(loopsOf(enc)).toBe('');
  });

  it('refuses to decrypt a file that cannot hold a LUKS header', async () => {
    const src = join(dir, 'small');
    await writeFile(src, randomBytes(4096));
    await expect(
      createFileSources().clone({ sourcePath: src, encryption: 'decrypt', credential: CREDENTIAL, dest: join(dir, 'd.tmp'), sink: new RecordingProgress(), signal: never() }),
    ).rejects.toThrow(`cannot decrypt ${src}: 4096 bytes is not larger than the 16777216-byte LUKS header`);
  });

  it('exports the unavailable error type', () => {
    expect(new LuksUnavailableError('x').name).toBe('LuksUnavailableError');
  });
});
