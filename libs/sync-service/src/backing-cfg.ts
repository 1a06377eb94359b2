import { promises as fsp } from 'node:fs';
import path from 'node:path';

/**
 * `backing.cfg` (Longhorn's `util.SyncingFileConfig`). Note that the file path is stored under the key `name`.
 * Written as compact JSON in Longhorn's key order so that Longhorn reuses our files and we reuse its files.
 */
export interface SyncingFileConfig {
  name: string;
  uuid: string;
  size: number;
  virtualSize: number;
  realSize: number;
  expectedChecksum: string;
  currentChecksum: string;
  modificationTime: string;
}

export class BackingConfigError extends Error {
  override readonly name = 'BackingConfigError';
}

export function encodeSyncingFileConfig(cfg: SyncingFileConfig): string {
  const ordered: SyncingFileConfig = {
    name: cfg.name,
    uuid: cfg.uuid,
    size: cfg.size,
    virtualSize: cfg.virtualSize,
    realSize: cfg.realSize,
    expectedChecksum: cfg.expectedChecksum,
    currentChecksum: cfg.currentChecksum,
    modificationTime: cfg.modificationTime,
  };
  return JSON.stringify(ordered);
}

/** Parses a `backing.cfg`; fields missing in older Longhorn releases (virtualSize, realSize) default to 0. */
export function decodeSyncingFileConfig(text: string, source = 'backing.cfg'): SyncingFileConfig {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new BackingConfigError(`invalid config ${source}: ${(err as Error).message}`);
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new BackingConfigError(`invalid config ${source}: not a JSON object`);
  }
  const o = raw as Record<string, unknown>;
  const str = (k: string): string => {
    const v = o[k];
    if (v === undefined || v === null) return '';
    if (typeof v !== 'string') throw new BackingConfigError(`invalid config ${source}: ${k} must be a string`);
    return v;
  };
  const num = (k: string): number => {
    const v = o[k];
    if (v === undefined || v === null) return 0;
    if (typeof v !== 'number' || !Number.isSafeInteger(v)) {
      throw new BackingConfigError(`invalid config ${source}: ${k} must be an integer`);
    }
    return v;
  };
  return {
    name: str('name'),
    uuid: str('uuid'),
    size: num('size'),
    virtualSize: num('virtualSize'),
    realSize: num('realSize'),
    expectedChecksum: str('expectedChecksum'),
    currentChecksum: str('currentChecksum'),
    modificationTime: str('modificationTime'),
  };
}

/** Reads `<file>.cfg`; resolves undefined when it does not exist. */
export async function readSyncingFileConfig(cfgPath: string): Promise<SyncingFileConfig | undefined> {
  let text: string;
  try {
    text = await fsp.readFile(cfgPath, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  return decodeSyncingFileConfig(text, cfgPath);
}

/** Writes `<file>.cfg` atomically (temporary file + rename in the same directory). */
export async function writeSyncingFileConfig(cfgPath: string, cfg: SyncingFileConfig): Promise<void> {
  const tmp = path.join(path.dirname(cfgPath), `.${path.basename(cfgPath)}.${process.pid}.${Date.now()}.new`);
  // O_EXCL: a link (or anything) planted at the temporary name is never written through
  await fsp.writeFile(tmp, encodeSyncingFileConfig(cfg), { flag: 'wx' });
  try {
    await fsp.rename(tmp, cfgPath);
  } catch (err) {
    await fsp.rm(tmp, { force: true });
    throw err;
  }
}
