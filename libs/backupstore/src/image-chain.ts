import {
  decodeChain,
  encodeChain,
  nativeSha512ChainAvailable,
  Sha512ChainRecorder,
  type Sha512Chain,
} from '@bis/sha512-chain';
import type { BackingImageBackupConfig } from './config.js';
import { ImageHasher } from './image-hash.js';
import { BACKUP_BLOCK_SIZE } from './names.js';

/**
 * The whole-image SHA-512 of a backup, fed once in offset order (data, and zero ranges for holes and all-zero blocks).
 * Each update resolves when its bytes are hashed (then a caller's slot may be reused).
 */
export interface WholeImageHash {
  update(data: Uint8Array): Promise<void>;
  zeros(length: number): Promise<void>;
  /** The image's SHA-512 and, when the native chain addon is available, its SHA-512 chain (2 MiB segments). */
  finish(): Promise<{ sha512: string; chain: Sha512Chain | undefined }>;
  close(): Promise<void>;
}

/** Records the SHA-512 chain while hashing: the same one sequential pass, on the libuv thread pool. */
class ChainImageHash implements WholeImageHash {
  private readonly recorder = new Sha512ChainRecorder(BACKUP_BLOCK_SIZE);
  update(data: Uint8Array): Promise<void> {
    return data.byteLength === 0 ? Promise.resolve() : this.recorder.update(data);
  }
  zeros(length: number): Promise<void> {
    return length <= 0 ? Promise.resolve() : this.recorder.updateZeros(length);
  }
  async finish(): Promise<{ sha512: string; chain: Sha512Chain }> {
    const chain = this.recorder.finish();
    return { sha512: chain.checksum, chain };
  }
  async close(): Promise<void> {}
}

/** Without the addon: the plain SHA-512 on a worker thread, and no chain. */
class PlainImageHash implements WholeImageHash {
  private readonly hasher: ImageHasher;
  constructor(memory: SharedArrayBuffer) {
    this.hasher = new ImageHasher(memory);
  }
  update(data: Uint8Array): Promise<void> {
    return this.hasher.update(data);
  }
  zeros(length: number): Promise<void> {
    return this.hasher.zeros(length);
  }
  async finish(): Promise<{ sha512: string; chain: undefined }> {
    return { sha512: await this.hasher.digest(), chain: undefined };
  }
  close(): Promise<void> {
    return this.hasher.close();
  }
}

/**
 * The chain recorder when `chain` is wanted and the native addon is available, else the plain hash (views of `memory`
 * hashed in place).
 */
export function createWholeImageHash(memory: SharedArrayBuffer, chain = true): WholeImageHash {
  return chain && nativeSha512ChainAvailable() ? new ChainImageHash() : new PlainImageHash(memory);
}

/** The sidecar's bytes. */
export function encodeImageChain(chain: Sha512Chain): Buffer {
  return encodeChain(chain);
}

/**
 * The sidecar's chain when it can verify this config's image: it decodes, its segments are the 2 MiB blocks, and its
 * size and checksum are the config's. Otherwise the reason it cannot be used (the restore then hashes the image
 * sequentially).
 */
export function usableImageChain(
  bytes: Uint8Array,
  config: BackingImageBackupConfig,
): { chain: Sha512Chain; reason?: undefined } | { chain?: undefined; reason: string } {
  if (!nativeSha512ChainAvailable()) return { reason: 'the native SHA-512 chain addon is not available' };
  let chain: Sha512Chain;
  try {
    chain = decodeChain(bytes);
  } catch (err) {
    return { reason: `it does not decode: ${(err as Error).message}` };
  }
  if (chain.segmentSize !== BACKUP_BLOCK_SIZE) return { reason: `its segments are ${chain.segmentSize} bytes, not the ${BACKUP_BLOCK_SIZE}-byte blocks` };
  if (chain.size !== config.size) return { reason: `it is for ${chain.size} bytes, the config records ${config.size}` };
  if (config.checksum === '' || chain.checksum !== config.checksum) {
    return { reason: `its checksum ${chain.checksum} is not the config's ${config.checksum || '(none)'}` };
  }
  return { chain };
}
