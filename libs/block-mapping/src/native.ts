import { createRequire } from 'node:module';

/** The functions of the `block_mapping` N-API addon (`native/src/block_mapping.c`). */
export interface BlockMappingAddon {
  /** lseek(fd, offset, SEEK_DATA); -1 when there is no data at or after `offset`. */
  seekData(fd: number, offset: number): number;
  /** lseek(fd, offset, SEEK_HOLE); -1 when `offset` is at or past the end of the file. */
  seekHole(fd: number, offset: number): number;
  /** fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length), on the libuv thread pool. */
  punchHole(fd: number, offset: number, length: number): Promise<void>;
  /**
   * sendfile(2) of [offset, offset + length) from `fileFd` to the socket `socketFd`, on a thread of its own, on
   * duplicates of both descriptors. Absent from addons built before it existed.
   */
  startSendFile?(socketFd: number, fileFd: number, offset: number, length: number): { id: number; done: Promise<number> };
  /** Shuts the socket of a running startSendFile down; false when it has ended. */
  cancelSendFile?(id: number): boolean;
}

/** Set to `0` to skip loading the addon (the library then behaves as if it were not built). */
export const DISABLE_NATIVE_ENV = 'BIS_BLOCK_MAPPING_NATIVE';
/** Absolute path of a `block_mapping.node` to load instead of the one built in this package. */
export const ADDON_PATH_ENV = 'BIS_BLOCK_MAPPING_ADDON';

const ADDON_PATH = '../native/build/Release/block_mapping.node';

let loaded: { addon: BlockMappingAddon | null; reason: string } | undefined;

function isAddon(value: unknown): value is BlockMappingAddon {
  if (typeof value !== 'object' || value === null) return false;
  const v = value as Record<string, unknown>;
  return typeof v.seekData === 'function' && typeof v.seekHole === 'function' && typeof v.punchHole === 'function';
}

/**
 * Loads the addon on first use. If it cannot be loaded, emits one process warning (code
 * `BIS_BLOCK_MAPPING_FALLBACK`) and returns null from then on.
 */
export function nativeAddon(): BlockMappingAddon | null {
  if (loaded) return loaded.addon;
  if (process.env[DISABLE_NATIVE_ENV] === '0') {
    loaded = { addon: null, reason: `disabled by ${DISABLE_NATIVE_ENV}=0` };
    return null;
  }
  try {
    const value: unknown = createRequire(import.meta.url)(process.env[ADDON_PATH_ENV] || ADDON_PATH);
    if (!isAddon(value)) throw new Error('the module does not export seekData, seekHole and punchHole');
    loaded = { addon: value, reason: 'loaded' };
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    loaded = { addon: null, reason };
    process.emitWarning(
      `@bis/block-mapping: native addon not available (${reason}); using the zero-scan backend ` +
        '(reads whole files, cannot tell allocated zero blocks from holes) and fallocate(1) for punch-hole',
      { code: 'BIS_BLOCK_MAPPING_FALLBACK' },
    );
  }
  return loaded.addon;
}

/** Why the addon is or is not in use (for diagnostics). */
export function nativeAddonStatus(): string {
  nativeAddon();
  return loaded?.reason ?? 'not loaded';
}
