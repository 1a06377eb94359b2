import { createHash, type Hash } from 'node:crypto';

export type ChecksumAlgorithm = 'sha512' | 'sha256' | 'sha1' | 'md5';

export interface ExpectedChecksum {
  algorithm: ChecksumAlgorithm;
  /** lowercase hex */
  value: string;
  /** how the user wrote it, normalised (`sha256:<hex>`, or bare hex for SHA-512) */
  text: string;
}

const HEX_LENGTH: Record<ChecksumAlgorithm, number> = { sha512: 128, sha256: 64, sha1: 40, md5: 32 };

export class ChecksumFormatError extends Error {
  override readonly name = 'ChecksumFormatError';
}

/**
 * Parses an expected checksum: bare 128-hex (SHA-512), or `sha512:`, `sha256:`, `sha1:`, `md5:` followed by hex
 * of the right length. Case and surrounding blanks are ignored. Returns undefined for an empty string.
 */
export function parseExpectedChecksum(input: string | undefined): ExpectedChecksum | undefined {
  const s = (input ?? '').trim().toLowerCase();
  if (s === '') return undefined;
  let algorithm: ChecksumAlgorithm = 'sha512';
  let value = s;
  const colon = s.indexOf(':');
  if (colon >= 0) {
    const prefix = s.slice(0, colon);
    if (!(prefix in HEX_LENGTH)) {
      throw new ChecksumFormatError(
        `invalid checksum "${input}": unsupported algorithm "${prefix}" (use sha512, sha256, sha1 or md5)`,
      );
    }
    algorithm = prefix as ChecksumAlgorithm;
    value = s.slice(colon + 1);
  }
  const want = HEX_LENGTH[algorithm];
  if (value.length !== want || !/^[0-9a-f]+$/.test(value)) {
    throw new ChecksumFormatError(
      `invalid checksum "${input}": a ${algorithm} checksum must be ${want} hexadecimal characters`,
    );
  }
  return { algorithm, value, text: algorithm === 'sha512' ? value : `${algorithm}:${value}` };
}

/**
 * Hashes one stream of bytes with SHA-512 (always: it is the checksum Longhorn stores) and, when the expected
 * checksum uses another algorithm, with that one too, in the same pass.
 */
export class StreamHasher {
  readonly #sha512: Hash = createHash('sha512');
  readonly #extra: Hash | undefined;
  readonly expected: ExpectedChecksum | undefined;

  constructor(expected?: ExpectedChecksum) {
    this.expected = expected;
    this.#extra = expected && expected.algorithm !== 'sha512' ? createHash(expected.algorithm) : undefined;
  }

  update(chunk: Uint8Array): void {
    this.#sha512.update(chunk);
    this.#extra?.update(chunk);
  }

  /** Finishes both hashes; throws {@link ChecksumMismatchError} when the expected checksum does not match. */
  digest(): { sha512: string; expectedAlgorithmDigest: string | undefined } {
    const sha512 = this.#sha512.digest('hex');
    const extra = this.#extra?.digest('hex');
    if (this.expected) {
      const actual = this.expected.algorithm === 'sha512' ? sha512 : extra!;
      assertChecksumMatches(this.expected, actual);
    }
    return { sha512, expectedAlgorithmDigest: extra };
  }
}

export class ChecksumMismatchError extends Error {
  override readonly name = 'ChecksumMismatchError';
  constructor(
    readonly expected: string,
    readonly actual: string,
  ) {
    // Longhorn's wording (clients match on it), with both values.
    super(`the expected checksum ${expected} doesn't match the file actual checksum ${actual}`);
  }
}

export function assertChecksumMatches(expected: ExpectedChecksum, actualHex: string): void {
  if (expected.value !== actualHex) {
    const actualText = expected.algorithm === 'sha512' ? actualHex : `${expected.algorithm}:${actualHex}`;
    throw new ChecksumMismatchError(expected.text, actualText);
  }
}

/**
 * Where an expected checksum applies. A SHA-512 checksum (bare or `sha512:`) is Longhorn's: it covers the stored
 * file (after decompression and zero-padding), the value every copy is verified against later. A `sha256:`, `sha1:`
 * or `md5:` checksum is what image publishers print: it covers the bytes as transferred from the source (before
 * decompression and padding).
 */
export function checksumCoversStoredFile(expected: ExpectedChecksum | undefined): boolean {
  return expected?.algorithm === 'sha512';
}

/** Verifies a non-SHA-512 expected checksum over the source bytes as they stream by. */
export class SourceChecksum {
  #hash: Hash | undefined;
  constructor(readonly expected: ExpectedChecksum | undefined) {
    this.reset();
  }
  /** Starts again from the first byte (a restarted transfer). */
  reset(): void {
    this.#hash = this.expected && !checksumCoversStoredFile(this.expected) ? createHash(this.expected.algorithm) : undefined;
  }
  update(chunk: Uint8Array): void {
    this.#hash?.update(chunk);
  }
  /** Throws {@link ChecksumMismatchError} when the source bytes do not match. */
  verify(): void {
    if (this.#hash && this.expected) assertChecksumMatches(this.expected, this.#hash.digest('hex'));
  }
}
