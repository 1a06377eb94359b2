import { promises as fsp } from 'node:fs';

/** `<file>.sha512chain`: the SHA-512 chaining states of a ready file (our extension; Longhorn ignores the file). */
export const CHAIN_SUFFIX = '.sha512chain';

export function chainPathOf(filePath: string): string {
  return filePath + CHAIN_SUFFIX;
}

export async function removeChainFile(filePath: string): Promise<void> {
  await fsp.rm(chainPathOf(filePath), { force: true });
  await fsp.rm(`${chainPathOf(filePath)}.tmp`, { force: true });
}
