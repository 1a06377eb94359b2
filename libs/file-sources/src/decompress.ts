import { spawn } from 'node:child_process';
import { createGunzip } from 'node:zlib';
import { once } from 'node:events';
import type { Readable, Writable } from 'node:stream';
import { SourceError } from './errors.js';

export type Compression = 'gzip' | 'xz' | 'zstd';

const MAGICS: Array<[Compression, Buffer]> = [
  ['gzip', Buffer.from([0x1f, 0x8b])],
  ['xz', Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00])],
  ['zstd', Buffer.from([0x28, 0xb5, 0x2f, 0xfd])],
];
/** Bytes needed to recognise every supported compression format. */
export const COMPRESSION_MAGIC_BYTES = 6;

/** Recognises gzip, xz and zstd streams by their magic bytes. */
export function detectCompression(head: Uint8Array): Compression | undefined {
  const b = Buffer.from(head.buffer, head.byteOffset, head.byteLength);
  for (const [kind, magic] of MAGICS) {
    if (b.length >= magic.length && b.subarray(0, magic.length).equals(magic)) return kind;
  }
  return undefined;
}

/**
 * Reads at least `n` bytes (fewer only at end of input) from `input` and returns them with an iterable that yields
 * the same bytes again followed by the rest of the input.
 */
export async function peek(
  input: AsyncIterable<Buffer>,
  n: number,
): Promise<{ head: Buffer; all: AsyncIterable<Buffer> }> {
  const it = input[Symbol.asyncIterator]();
  const parts: Buffer[] = [];
  let len = 0;
  let done = false;
  while (len < n) {
    const r = await it.next();
    if (r.done) {
      done = true;
      break;
    }
    parts.push(r.value);
    len += r.value.length;
  }
  const head = Buffer.concat(parts);
  async function* all(): AsyncGenerator<Buffer> {
    try {
      if (head.length > 0) yield head;
      if (done) return;
      for (;;) {
        const r = await it.next();
        if (r.done) {
          done = true;
          return;
        }
        yield r.value;
      }
    } finally {
      // A consumer that stops early closes the input too (e.g. destroys the HTTP response).
      if (!done) await it.return?.();
    }
  }
  return { head, all: all() };
}

/** Writes `input` into `w`; `stop` ends the feeding (and so releases the input) even while it waits for 'drain'. */
async function pumpInto(input: AsyncIterable<Buffer>, w: Writable, stop: AbortSignal): Promise<void> {
  for await (const chunk of input) {
    if (stop.aborted) return;
    if (!w.write(chunk)) await once(w, 'drain', { signal: stop });
  }
  w.end();
}

/**
 * Decompresses `input`. gzip uses Node's zlib; xz and zstd stream through the system `xz -dc` / `zstd -dc`
 * decoders (Node 20's zlib has neither). The child process is killed on abort or when the consumer stops early.
 */
export async function* decompress(kind: Compression, input: AsyncIterable<Buffer>, signal: AbortSignal): AsyncGenerator<Buffer> {
  if (kind === 'gzip') {
    const gunzip = createGunzip({ chunkSize: 1 << 20 });
    const onAbort = (): void => void gunzip.destroy(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
    signal.addEventListener('abort', onAbort, { once: true });
    const stopFeeding = new AbortController();
    const feeding = pumpInto(input, gunzip, stopFeeding.signal).catch((e: unknown) => {
      if (!stopFeeding.signal.aborted) gunzip.destroy(e as Error);
    });
    try {
      for await (const chunk of gunzip as AsyncIterable<Buffer>) yield chunk;
      await feeding;
    } catch (e) {
      const code = (e as { code?: string }).code;
      if (typeof code === 'string' && code.startsWith('Z_')) {
        throw new SourceError(`gzip decompression failed: ${(e as Error).message}`);
      }
      throw e; // the input failed (e.g. a dropped connection): let the caller decide about retrying
    } finally {
      // The consumer may stop early (e.g. the size limit): stop feeding too, which closes the input.
      stopFeeding.abort();
      signal.removeEventListener('abort', onAbort);
      gunzip.destroy();
    }
    return;
  }
  const cmd = kind === 'xz' ? 'xz' : 'zstd';
  const child = spawn(cmd, ['-dc'], { stdio: ['pipe', 'pipe', 'pipe'], signal });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr = (stderr + s).slice(-2000)));
  const exited = new Promise<number | null>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve(code));
  });
  exited.catch(() => undefined); // awaited below; this only keeps a rejection from being unhandled meanwhile
  child.stdin.on('error', () => undefined); // EPIPE when the decoder fails; reported through its exit code
  const stopFeeding = new AbortController();
  const feeding = pumpInto(input, child.stdin, stopFeeding.signal).catch((e: unknown) => {
    child.kill('SIGKILL');
    if (!stopFeeding.signal.aborted) throw e;
  });
  feeding.catch(() => undefined); // awaited below; this only keeps a rejection from being unhandled meanwhile
  let finished = false;
  try {
    for await (const chunk of child.stdout as Readable) yield chunk as Buffer;
    await feeding;
    const code = await exited.catch((e: Error) => {
      throw new SourceError(`cannot run "${cmd} -dc" to decompress the ${kind} stream: ${e.message}`);
    });
    if (code !== 0) throw new SourceError(`${kind} decompression failed (${cmd} exited with ${code}): ${stderr.trim()}`);
    finished = true;
  } finally {
    if (!finished) {
      stopFeeding.abort();
      child.kill('SIGKILL');
    }
  }
}
