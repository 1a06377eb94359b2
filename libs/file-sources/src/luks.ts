import { createReadStream } from 'node:fs';
import { access, mkdtemp, open, readFile, rm, stat } from 'node:fs/promises';
import { createHash, randomBytes } from 'node:crypto';
import { basename, dirname, join } from 'node:path';
import { assertChecksumMatches, parseExpectedChecksum } from './checksum.js';
import type { CloneRequest, SourceResult } from './contract.js';
import { linkedController, pumpOnce, ThrottledProgress } from './download.js';
import { SourceCancelledError, SourceError, throwIfAborted } from './errors.js';
import { ImageSink } from './image-sink.js';
import { assertSafeQcow2, hasQcow2Magic, QCOW2_HEADER_PROBE_BYTES } from './qcow2.js';
import { CREATE_NOFOLLOW, openNoFollow } from './no-follow.js';
import { runTool } from './tool-process.js';

/** Size of the LUKS2 header cryptsetup writes by default (Longhorn's `EncryptionMetaSize`). */
export const LUKS_HEADER_BYTES = 16 << 20;
const DM_CONTROL = '/dev/mapper/control';
const COPY_BYTES = 4 << 20;

/** Longhorn's LUKS parameters (credential keys of the encryption secret) and their defaults. */
export interface LuksParameters {
  passphrase: string;
  cipher: string;
  hash: string;
  keySize: string;
  pbkdf: string;
  pbkdfForceIterations?: string;
  pbkdfMemory?: string;
}

export class LuksUnavailableError extends SourceError {
  override readonly name = 'LuksUnavailableError';
}

/** Reads Longhorn's `CRYPTO_*` credential keys; the passphrase is required, the provider must be `secret` or empty. */
export function luksParameters(credential: Record<string, string>): LuksParameters {
  const provider = credential['CRYPTO_KEY_PROVIDER'] ?? '';
  if (provider !== '' && provider !== 'secret') {
    throw new SourceError(`unsupported CRYPTO_KEY_PROVIDER "${provider}": only "secret" is supported`);
  }
  const passphrase = credential['CRYPTO_KEY_VALUE'] ?? '';
  if (passphrase === '') throw new SourceError('missing CRYPTO_KEY_VALUE in the credential: the passphrase is required for encrypt or decrypt');
  const numeric = (k: string): string | undefined => {
    const v = credential[k];
    if (v === undefined || v === '') return undefined;
    if (!/^\d+$/.test(v)) throw new SourceError(`invalid ${k} "${v}": a positive integer is required`);
    return v;
  };
  return {
    passphrase,
    cipher: credential['CRYPTO_KEY_CIPHER'] || 'aes-xts-plain64',
    hash: credential['CRYPTO_KEY_HASH'] || 'sha256',
    keySize: numeric('CRYPTO_KEY_SIZE') ?? '256',
    pbkdf: credential['CRYPTO_PBKDF'] || 'argon2i',
    pbkdfForceIterations: numeric('CRYPTO_PBKDF_FORCE_ITERATIONS'),
    pbkdfMemory: numeric('CRYPTO_PBKDF_MEMORY'),
  };
}

const exists = (p: string): Promise<boolean> => access(p).then(() => true, () => false);

/** The kernel has device-mapper when `/proc/misc` lists it and its control node exists. */
async function deviceMapperAvailable(): Promise<boolean> {
  const misc = await readFile('/proc/misc', 'utf8').catch(() => '');
  return /\bdevice-mapper\b/.test(misc) && (await exists(DM_CONTROL));
}

/**
 * Whether this machine can open LUKS devices: cryptsetup and losetup installed, a free loop device, and
 * device-mapper (`/dev/mapper/control`). Returns the reason when it cannot.
 */
export async function probeLuks(): Promise<{ ok: true } | { ok: false; reason: string }> {
  try {
    await runTool('cryptsetup', ['--version'], { packageName: 'cryptsetup-bin' });
    await runTool('losetup', ['-f'], { packageName: 'util-linux' });
  } catch (e) {
    return { ok: false, reason: (e as Error).message };
  }
  if (!(await deviceMapperAvailable())) {
    return { ok: false, reason: 'device-mapper is not available (not in /proc/misc, or no /dev/mapper/control)' };
  }
  return { ok: true };
}

/** Attached loop devices and open mappers of one operation; `release` undoes them all, in reverse order. */
class DeviceStack {
  readonly #undo: Array<() => Promise<unknown>> = [];

  async attachLoop(file: string, readOnly: boolean): Promise<string> {
    let out: string;
    try {
      out = await runTool('losetup', ['-f', '--show', ...(readOnly ? ['-r'] : []), file], { packageName: 'util-linux' });
    } catch (e) {
      throw new LuksUnavailableError(`no loop device available for ${file}: ${(e as Error).message}`);
    }
    const dev = out.trim().split('\n').pop()!.trim();
    if (!dev.startsWith('/dev/')) throw new LuksUnavailableError(`losetup did not name a loop device for ${file}: ${out.trim()}`);
    this.#undo.push(() => runTool('losetup', ['-d', dev], { packageName: 'util-linux' }));
    return dev;
  }

  async open(device: string, mapperName: string, p: LuksParameters): Promise<string> {
    try {
      await runTool('cryptsetup', ['open', '--type', 'luks', '--key-file', '-', device, mapperName], {
        packageName: 'cryptsetup-bin',
        input: p.passphrase,
      });
    } catch (e) {
      if (!(await deviceMapperAvailable())) {
        throw new LuksUnavailableError(
          `device-mapper is not available on this machine (the kernel lists no device-mapper in /proc/misc or ${DM_CONTROL} is missing; the dm_mod and dm_crypt modules are needed): ${(e as Error).message}`,
        );
      }
      throw e;
    }
    this.#undo.push(() => runTool('cryptsetup', ['close', mapperName], { packageName: 'cryptsetup-bin' }));
    return `/dev/mapper/${mapperName}`;
  }

  /** Closes mappers and detaches loop devices (Longhorn leaks the loop devices); reports the first failure. */
  async release(): Promise<void> {
    let first: unknown;
    for (const undo of this.#undo.splice(0).reverse()) {
      await undo().catch((e: unknown) => {
        first ??= e;
      });
    }
    if (first !== undefined) throw first;
  }
}

function mapperNameFor(dest: string): string {
  const base = basename(dest).replace(/[^A-Za-z0-9_.-]/g, '_').slice(0, 80);
  return `backing-${base}-${randomBytes(4).toString('hex')}`;
}

async function readHead(path: string): Promise<Buffer> {
  const fh = await open(path, 'r');
  try {
    const head = Buffer.alloc(QCOW2_HEADER_PROBE_BYTES);
    const { bytesRead } = await fh.read(head, 0, head.length, 0);
    return head.subarray(0, bytesRead);
  } finally {
    await fh.close();
  }
}

/**
 * Clones a ready backing file into `req.dest` through LUKS (Longhorn's `cloneFromBackingImage` with encryption
 * `encrypt` or `decrypt`):
 * - encrypt: `dest` gets the source size + 16 MiB; it is attached to a loop device, `luksFormat`ted with the
 *   credential's parameters (defaults aes-xts-plain64, sha256, 256-bit key, argon2i), opened, and the source (a qcow2
 *   source is converted to raw first) is copied into the mapper, zeros included.
 * - decrypt: the source is attached read-only and opened; the mapper's contents are copied into `dest`, leaving
 *   zero blocks as holes.
 * Mappers are closed and loop devices detached on every path. The result's SHA-512 covers `dest`.
 */
export async function luksCloneToFile(req: CloneRequest): Promise<SourceResult> {
  if (req.encryption === 'ignore') throw new SourceError('luksCloneToFile handles encrypt and decrypt clones only');
  const params = luksParameters(req.credential);
  const expected = parseExpectedChecksum(req.expectedChecksum);
  const st = await stat(req.sourcePath).catch((e: NodeJS.ErrnoException) => {
    throw new SourceError(`cannot clone from ${req.sourcePath}: ${e.code === 'ENOENT' ? 'the source backing file does not exist' : e.message}`);
  });
  if (!st.isFile()) throw new SourceError(`cannot clone from ${req.sourcePath}: not a regular file`);
  throwIfAborted(req.signal);
  const devices = new DeviceStack();
  const scratch: string[] = [];
  let ok = false;
  try {
    const result = req.encryption === 'encrypt' ? await encrypt(req, params, devices, scratch, st.size) : await decrypt(req, params, devices, st.size);
    await devices.release();
    if (expected) assertChecksumMatches(expected, expected.algorithm === 'sha512' ? result.sha512 : await hashFile(req.dest, expected.algorithm));
    ok = true;
    return result;
  } catch (e) {
    if (req.signal.aborted) throw new SourceCancelledError(req.signal.reason);
    throw e;
  } finally {
    await devices.release().catch(() => undefined); // cleanup: the result or the error being thrown is what matters
    for (const f of scratch) await rm(f, { recursive: true, force: true });
    if (!ok) await rm(req.dest, { force: true });
  }
}

async function luksFormat(device: string, p: LuksParameters, signal: AbortSignal): Promise<void> {
  const args = ['-q', 'luksFormat', '--type', 'luks2', '--cipher', p.cipher, '--hash', p.hash, '--key-size', p.keySize, '--pbkdf', p.pbkdf];
  if (p.pbkdfForceIterations) args.push('--pbkdf-force-iterations', p.pbkdfForceIterations);
  if (p.pbkdfMemory) args.push('--pbkdf-memory', p.pbkdfMemory);
  args.push('--key-file', '-', device);
  await runTool('cryptsetup', args, { packageName: 'cryptsetup-bin', input: p.passphrase, signal });
}

async function encrypt(req: CloneRequest, p: LuksParameters, devices: DeviceStack, scratch: string[], sourceSize: number): Promise<SourceResult> {
  let source = req.sourcePath;
  let size = sourceSize;
  if (hasQcow2Magic(await readHead(source))) {
    // LUKS wraps raw data: convert a qcow2 source first (Longhorn's `<src>-raw.tmp`, here next to dest).
    assertSafeQcow2(await readHead(source));
    // qemu-img creates its output by name: inside a new private directory nothing can be planted at that name
    const dir = await mkdtemp(join(dirname(req.dest), `.${basename(req.dest)}.raw-source.`));
    scratch.push(dir);
    const raw = join(dir, 'raw');
    await runTool('qemu-img', ['convert', '-f', 'qcow2', '-O', 'raw', source, raw], { packageName: 'qemu-utils', signal: req.signal });
    source = raw;
    size = (await stat(raw)).size;
  }
  const total = size + LUKS_HEADER_BYTES;
  const fh = await openNoFollow(req.dest, CREATE_NOFOLLOW);
  await fh.truncate(total);
  await fh.close();
  req.sink.setSize(total);
  req.sink.updateProgress(LUKS_HEADER_BYTES);
  const loop = await devices.attachLoop(req.dest, false);
  await luksFormat(loop, p, req.signal);
  const mapper = await devices.open(loop, mapperNameFor(req.dest), p);
  // Copy into the mapper writing zeros too: on the encrypted device zeros are not zeros on disk.
  const progress = new ThrottledProgress(req.sink);
  const out = await open(mapper, 'r+');
  try {
    const { ctl, unlink } = linkedController(req.signal);
    const body = createReadStream(source, { highWaterMark: COPY_BYTES });
    const onAbort = (): void => void body.destroy();
    ctl.signal.addEventListener('abort', onAbort, { once: true });
    try {
      let at = 0;
      await pumpOnce(
        body as AsyncIterable<Buffer>,
        {
          write: async (chunk: Buffer) => {
            let off = 0;
            while (off < chunk.length) {
              const { bytesWritten } = await out.write(chunk, off, chunk.length - off, at);
              off += bytesWritten;
              at += bytesWritten;
            }
          },
        },
        { stallTimeoutMs: 30_000 },
        req.signal,
        (n) => progress.update(LUKS_HEADER_BYTES + n),
        ctl,
      );
    } finally {
      ctl.signal.removeEventListener('abort', onAbort);
      unlink();
    }
    await out.sync();
  } finally {
    await out.close();
  }
  progress.flush();
  await devices.release();
  const sha512 = await hashFile(req.dest, 'sha512');
  return { size: total, sha512, virtualSize: total, format: 'raw' };
}

async function decrypt(req: CloneRequest, p: LuksParameters, devices: DeviceStack, sourceSize: number): Promise<SourceResult> {
  if (sourceSize <= LUKS_HEADER_BYTES) {
    throw new SourceError(`cannot decrypt ${req.sourcePath}: ${sourceSize} bytes is not larger than the ${LUKS_HEADER_BYTES}-byte LUKS header`);
  }
  const loop = await devices.attachLoop(req.sourcePath, true);
  const mapper = await devices.open(loop, mapperNameFor(req.dest), p);
  const size = sourceSize - LUKS_HEADER_BYTES;
  req.sink.setSize(size);
  const sink = await ImageSink.create(req.dest, { expected: undefined });
  const progress = new ThrottledProgress(req.sink);
  try {
    const { ctl, unlink } = linkedController(req.signal);
    const body = createReadStream(mapper, { highWaterMark: COPY_BYTES });
    const onAbort = (): void => void body.destroy();
    ctl.signal.addEventListener('abort', onAbort, { once: true });
    try {
      await pumpOnce(body as AsyncIterable<Buffer>, sink, { stallTimeoutMs: 30_000 }, req.signal, (n) => progress.update(n), ctl);
    } finally {
      ctl.signal.removeEventListener('abort', onAbort);
      unlink();
    }
    progress.flush();
    return await sink.finish();
  } catch (e) {
    await sink.discard();
    throw e;
  }
}

async function hashFile(path: string, algorithm: string): Promise<string> {
  const h = createHash(algorithm);
  for await (const c of createReadStream(path, { highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>) h.update(c);
  return h.digest('hex');
}
