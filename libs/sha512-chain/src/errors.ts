/** The native addon is not built or could not be loaded; fall back to a sequential `createHash('sha512')`. */
export class Sha512ChainUnavailableError extends Error {
  constructor(reason: string) {
    super(`@bis/sha512-chain: the native SHA-512 chain addon is not available (${reason})`);
    this.name = 'Sha512ChainUnavailableError';
  }
}

/**
 * A segment's bytes do not lead from the previous recorded state to its own recorded state (or, for the last
 * segment, to the recorded checksum). Either the bytes or the recorded chain are wrong; nothing is trusted.
 */
export class Sha512ChainMismatchError extends Error {
  /** Index of the segment that failed. */
  readonly segment: number;
  /** Byte offset of that segment in the image. */
  readonly offset: number;
  /** Byte length of that segment. */
  readonly length: number;

  constructor(segment: number, offset: number, length: number, detail: string) {
    super(`SHA-512 chain mismatch in segment ${segment} (bytes ${offset}..${offset + length}): ${detail}`);
    this.name = 'Sha512ChainMismatchError';
    this.segment = segment;
    this.offset = offset;
    this.length = length;
  }
}

/** `decodeChain` got bytes that are not a valid encoded chain. */
export class Sha512ChainFormatError extends Error {
  constructor(detail: string) {
    super(`invalid SHA-512 chain encoding: ${detail}`);
    this.name = 'Sha512ChainFormatError';
  }
}
