import { promises as fsp } from 'node:fs';
import { CFG_SUFFIX, TMP_SUFFIX } from './layout.js';

/** `<file>.sha512chain`: the SHA-512 chaining states of a ready file (our extension; Longhorn ignores the file). */
export const CHAIN_SUFFIX = '.sha512chain';

export function chainPathOf(filePath: string): string {
  return filePath + CHAIN_SUFFIX;
}

export async function removeChainFile(filePath: string): Promise<void> {
  await fsp.rm(chainPathOf(filePath), { force: true });
  await fsp.rm(`${chainPathOf(filePath)}.tmp`, { force: true });
}

/**
 * Removes a file with every companion the services write next to it: `<f>`, `<f>.tmp`, `<f>.cfg`, its chain file and
 * the export conversion scratch `<f>.tmp.qcow2tmp`. Missing ones are fine.
 */
export async function removeFileSet(filePath: string): Promise<void> {
  for (const p of [filePath, `${filePath}${TMP_SUFFIX}`, `${filePath}${CFG_SUFFIX}`, `${filePath}${TMP_SUFFIX}.qcow2tmp`]) await fsp.rm(p, { force: true });
  await removeChainFile(filePath);
}
