import { issue, type ValidationIssue } from './schema/errors.js';

/** Algorithms accepted in `spec.checksum` and the hex length of their digest. */
export const CHECKSUM_HEX_LENGTH = { sha512: 128, sha256: 64, sha1: 40, md5: 32 } as const;
export type ChecksumAlgorithm = keyof typeof CHECKSUM_HEX_LENGTH;
export const CHECKSUM_ALGORITHMS = Object.keys(CHECKSUM_HEX_LENGTH) as ChecksumAlgorithm[];

export interface ExpectedChecksum {
  readonly algorithm: ChecksumAlgorithm;
  /** Lowercase hex digest. */
  readonly hex: string;
}

const HEX = /^[a-f0-9]+$/;

/**
 * Parses an expected checksum as stored in `spec.checksum`:
 * - `""`: no expectation (returns `null`);
 * - 128 lowercase hex characters: SHA-512 (Longhorn's only form);
 * - `<algorithm>:<hex>` with algorithm `sha512`, `sha256`, `sha1` or `md5` and a digest of the right length.
 * Throws an Error naming the problem for anything else.
 */
export function parseExpectedChecksum(value: string): ExpectedChecksum | null {
  const problem = checksumProblem(value);
  if (problem) throw new Error(`invalid checksum: ${problem}`);
  if (value === '') return null;
  const colon = value.indexOf(':');
  if (colon < 0) return { algorithm: 'sha512', hex: value };
  return { algorithm: value.slice(0, colon) as ChecksumAlgorithm, hex: value.slice(colon + 1) };
}

/** Returns a description of what is wrong with `value` as an expected checksum, or `null` when it is valid. */
export function checksumProblem(value: string): string | null {
  if (value === '') return null;
  const colon = value.indexOf(':');
  const algorithm = colon < 0 ? 'sha512' : value.slice(0, colon);
  const hex = colon < 0 ? value : value.slice(colon + 1);
  if (!Object.hasOwn(CHECKSUM_HEX_LENGTH, algorithm)) {
    return `unknown checksum algorithm ${JSON.stringify(algorithm)} (expected one of ${CHECKSUM_ALGORITHMS.join(', ')})`;
  }
  const want = CHECKSUM_HEX_LENGTH[algorithm as ChecksumAlgorithm];
  if (!HEX.test(hex)) {
    return `${algorithm} checksum must be lowercase hexadecimal (got ${JSON.stringify(value)})`;
  }
  if (hex.length !== want) {
    return `${algorithm} checksum must be ${want} hex characters (got ${hex.length})`;
  }
  return null;
}

/** Validation issue for `spec.checksum`-like fields, or none. */
export function validateChecksumField(path: string, value: string): ValidationIssue[] {
  const problem = checksumProblem(value);
  return problem ? [issue(path, 'checksum', `invalid checksum ${value}: ${problem}`)] : [];
}

/**
 * Normal form of a user-supplied checksum: trimmed (as Longhorn's mutator does) and lower-cased (this project's
 * addition, so that digests pasted from tools printing uppercase hex are accepted).
 */
export function normalizeChecksum(value: string): string {
  return value.trim().toLowerCase();
}
