import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp, readFileSync } from 'node:fs';

/** Writes a sparse file of `pattern.length` units of `unit` bytes: `d` random data, anything else a hole. */
export async function writePatternFile(file: string, pattern: string, unit: number): Promise<string> {
  const fh = await fsp.open(file, 'w');
  try {
    await fh.truncate(pattern.length * unit);
    for (let i = 0; i < pattern.length; i++) if (pattern[i] === 'd') await fh.write(randomBytes(unit), 0, unit, i * unit);
  } finally {
    await fh.close();
  }
  return file;
}

/** The SHA-512 (hex) of a small test file. */
export const sha512Of = (file: string): string => createHash('sha512').update(readFileSync(file)).digest('hex');
