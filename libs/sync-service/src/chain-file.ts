import { WRITE_NOFOLLOW } from '@bis/disk-path';
import { promises as fsp } from 'node:fs';
// The narrow entry point: reading and writing chain files must not load what computing one needs (block mapping).
import { decodeChain, encodeChain, nativeSha512ChainAvailable, type Sha512Chain } from '@bis/sha512-chain/record';
import { ChecksumMismatchError, type ExpectedChecksum } from '@bis/file-sources/core';
import { hashFile, type HashFileOptions } from './file-util.js';

import { chainPathOf } from './chain-path.js';

export { CHAIN_SUFFIX, chainPathOf, removeChainFile } from './chain-path.js';

/** First line of a chain file; the encoded chain (`@bis/sha512-chain` encodeChain) follows the newline. */
const CHAIN_FILE_HEADER = 'bis-sha512chain v1';

/** What a stored chain is bound to: it is used only while all three still describe the file. */
export interface ChainBinding {
  size: number;
  /** The same Go time string as `backing.cfg`'s `modificationTime`. */
  modificationTime: string;
  /** SHA-512 (hex) of the file, as in `backing.cfg`'s `currentChecksum`. */
  checksum: string;
}

/**
 * Writes `<file>.sha512chain`: a header line with the modification time the chain is bound to, then the encoded chain
 * (which carries the size and the checksum). Written to a temporary name and renamed, so a reader never sees half a file.
 */
export async function writeChainFile(filePath: string, chain: Sha512Chain, modificationTime: string): Promise<void> {
  const header = Buffer.from(`${CHAIN_FILE_HEADER} ${JSON.stringify({ modificationTime })}\n`, 'utf8');
  const target = chainPathOf(filePath);
  const tmp = `${target}.tmp`;
  // O_NOFOLLOW: the predictable temporary name must not be a planted link that makes us write outside the disk
  await fsp.writeFile(tmp, Buffer.concat([header, encodeChain(chain)]), { flag: WRITE_NOFOLLOW });
  await fsp.rename(tmp, target);
}

/**
 * The chain stored for `filePath` when it is bound to `binding` (same size, modification time and checksum), else
 * undefined: a missing, unreadable, malformed or stale chain is never used.
 */
export async function readChainFile(filePath: string, binding: ChainBinding): Promise<Sha512Chain | undefined> {
  const stored = await readStoredChain(filePath);
  if (!stored) return undefined;
  const { chain, modificationTime } = stored;
  if (chain.size !== binding.size || chain.checksum !== binding.checksum || modificationTime !== binding.modificationTime) {
    return undefined;
  }
  return chain;
}

/** The stored chain and the modification time it was bound to, without checking the binding; undefined when unusable. */
export async function readStoredChain(filePath: string): Promise<{ chain: Sha512Chain; modificationTime: string } | undefined> {
  let bytes: Buffer;
  try {
    bytes = await fsp.readFile(chainPathOf(filePath));
  } catch {
    return undefined;
  }
  const nl = bytes.indexOf(0x0a);
  if (nl < 0) return undefined;
  const line = bytes.subarray(0, nl).toString('utf8');
  if (!line.startsWith(`${CHAIN_FILE_HEADER} `)) return undefined;
  try {
    const meta: unknown = JSON.parse(line.slice(CHAIN_FILE_HEADER.length + 1));
    if (typeof meta !== 'object' || meta === null) return undefined;
    const modificationTime = (meta as { modificationTime?: unknown }).modificationTime;
    if (typeof modificationTime !== 'string') return undefined;
    return { chain: decodeChain(bytes.subarray(nl + 1)), modificationTime };
  } catch {
    return undefined;
  }
}

/** A whole-file SHA-512, with the chain recorded in the same pass when the native chain addon is available. */
export interface FileDigest {
  sha512: string;
  chain?: Sha512Chain;
}

/**
 * SHA-512 of a whole file in one sequential pass, recording the chaining states in the same pass (holes hashed as
 * zeros without reading) when the chain addon is available and the expected checksum (if any) is a SHA-512; otherwise
 * the plain sequential hash. Throws ChecksumMismatchError like `hashFile` when an expected checksum does not match.
 */
export async function hashFileRecordingChain(filePath: string, opts: HashFileOptions = {}): Promise<FileDigest> {
  const expected: ExpectedChecksum | undefined = opts.expected;
  if (!nativeSha512ChainAvailable() || (expected && expected.algorithm !== 'sha512')) {
    return { sha512: await hashFile(filePath, opts) };
  }
  const { computeFileChain } = await import('@bis/sha512-chain');
  const chain = await computeFileChain(filePath, { signal: opts.signal, onProgress: opts.onProgress });
  if (expected && expected.value !== chain.checksum) throw new ChecksumMismatchError(expected.text, chain.checksum);
  return { sha512: chain.checksum, chain };
}
