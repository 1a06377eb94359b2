/**
 * Expected-checksum forms the system accepts (see docs/data-source.md): bare 128-hex or `sha512:<hex>` (Longhorn's:
 * the stored file), and `sha256:`, `sha1:`, `md5:` (a publisher's checksum of the bytes as transferred).
 */
export const CHECKSUM_ALGORITHMS = { sha512: 128, sha256: 64, sha1: 40, md5: 32 } as const;
export type ChecksumAlgorithm = keyof typeof CHECKSUM_ALGORITHMS;

export interface ParsedChecksum {
  algorithm: ChecksumAlgorithm;
  hex: string;
  /** The form to send to the server: bare hex for SHA-512 (what Longhorn accepts), `algo:hex` otherwise. */
  wire: string;
}

/**
 * Parses a user-typed expected checksum. Returns `undefined` for an empty value and throws an Error naming the
 * problem otherwise. Hex is lowercased; a bare value must be SHA-512 (128 hex characters).
 */
export function parseExpectedChecksum(input: string): ParsedChecksum | undefined {
  const text = input.trim();
  if (!text) return undefined;
  const m = /^([a-z0-9]+):(.*)$/i.exec(text);
  const algorithm = (m ? m[1].toLowerCase() : 'sha512') as ChecksumAlgorithm;
  const hex = (m ? m[2] : text).trim().toLowerCase();
  const len = CHECKSUM_ALGORITHMS[algorithm];
  if (len === undefined) throw new Error(`unknown checksum algorithm "${m?.[1]}": use one of ${Object.keys(CHECKSUM_ALGORITHMS).join(', ')}`);
  if (!/^[0-9a-f]*$/.test(hex)) throw new Error(`the ${algorithm} checksum must be hexadecimal`);
  if (hex.length !== len) throw new Error(`a ${algorithm} checksum has ${len} hex characters, got ${hex.length}${m ? '' : ' (prefix other algorithms, e.g. sha256:<hex>)'}`);
  return { algorithm, hex, wire: algorithm === 'sha512' ? hex : `${algorithm}:${hex}` };
}
