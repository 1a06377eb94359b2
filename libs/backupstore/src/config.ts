import { goJsonString, goJsonStringMap } from './go-json.js';
import { BackupStoreError, isBlockChecksum } from './names.js';

export type CompressionMethod = 'none' | 'gzip' | 'lz4';
export const COMPRESSION_METHODS: readonly CompressionMethod[] = ['none', 'gzip', 'lz4'];

export function parseCompressionMethod(value: string): CompressionMethod {
  if ((COMPRESSION_METHODS as readonly string[]).includes(value)) return value as CompressionMethod;
  throw new BackupStoreError('InvalidArgument', `unsupported compression method ${JSON.stringify(value)} (none, gzip, lz4)`);
}

export interface BlockEntry {
  /** Byte offset of the block in the image; a multiple of 2 MiB. */
  offset: number;
  /** First 32 bytes of SHA-512 of the uncompressed block, hex. */
  blockChecksum: string;
}

/** `backing-image.cfg` (Go type `BackupBackingImage`). */
export interface BackingImageBackupConfig {
  name: string;
  size: number;
  blockCount: number;
  /** Whole-image SHA-512, hex (128 characters), or '' when unknown. */
  checksum: string;
  labels: Record<string, string> | null;
  /** As stored; '' means the legacy default (gzip) when reading. */
  compressionMethod: string;
  createdTime: string;
  /** '' while in progress (or after a failed backup). */
  completeTime: string;
  secret: string;
  secretNamespace: string;
  blocks: BlockEntry[];
}

export function isComplete(config: BackingImageBackupConfig): boolean {
  return config.completeTime !== '';
}

/** The method used to read this backup's blocks: a missing method means gzip, as in Longhorn. */
export function effectiveCompressionMethod(config: BackingImageBackupConfig): CompressionMethod {
  return config.compressionMethod === '' ? 'gzip' : parseCompressionMethod(config.compressionMethod);
}

/** RFC 3339 in UTC with second precision, like Go's `time.Now().UTC().Format(time.RFC3339)`. */
export function goTimestamp(date: Date = new Date()): string {
  return date.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/**
 * Encodes the config exactly as Longhorn's `json.Marshal` does. `inProgress` selects the in-progress marker shape
 * (`ProcessingBlocks:null`, no `Blocks`); the final file has `ProcessingBlocks:{"Blocks":{}}` and `Blocks` unless empty.
 */
export function encodeBackingImageConfig(config: BackingImageBackupConfig, inProgress: boolean): string {
  const parts = [
    `"Name":${goJsonString(config.name)}`,
    `"Size":${goJsonString(String(config.size))}`,
    `"BlockCount":${goJsonString(String(config.blockCount))}`,
    `"Checksum":${goJsonString(config.checksum)}`,
    `"Labels":${goJsonStringMap(config.labels)}`,
    `"CompressionMethod":${goJsonString(config.compressionMethod)}`,
    `"CreatedTime":${goJsonString(config.createdTime)}`,
    `"CompleteTime":${goJsonString(config.completeTime)}`,
    `"Secret":${goJsonString(config.secret)}`,
    `"SecretNamespace":${goJsonString(config.secretNamespace)}`,
    `"ProcessingBlocks":${inProgress ? 'null' : '{"Blocks":{}}'}`,
  ];
  if (!inProgress && config.blocks.length > 0) {
    const blocks = config.blocks.map((b) => `{"Offset":${b.offset},"BlockChecksum":${goJsonString(b.blockChecksum)}}`);
    parts.push(`"Blocks":[${blocks.join(',')}]`);
  }
  return '{' + parts.join(',') + '}';
}

type JsonObject = { [key: string]: unknown };

function isObject(v: unknown): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Go's decoder matches field names case-insensitively; the last matching key wins. */
function field(obj: JsonObject, name: string): unknown {
  const lower = name.toLowerCase();
  let found: unknown;
  for (const [k, v] of Object.entries(obj)) if (k.toLowerCase() === lower) found = v;
  return found;
}

function stringField(obj: JsonObject, name: string, where: string): string {
  const v = field(obj, name);
  if (v === undefined || v === null) return '';
  if (typeof v !== 'string') throw new BackupStoreError('Corrupt', `${where}: ${name} must be a string`);
  return v;
}

/** An int64 written with Go's `,string` tag; a bare number is accepted too (Longhorn itself would refuse it). */
function int64Field(obj: JsonObject, name: string, where: string): number {
  const v = field(obj, name);
  if (v === undefined || v === null || v === '') return 0;
  const n = typeof v === 'string' && /^-?\d+$/.test(v) ? Number(v) : typeof v === 'number' ? v : NaN;
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new BackupStoreError('Corrupt', `${where}: ${name} is not a valid size: ${JSON.stringify(v)}`);
  }
  return n;
}

export function decodeBackingImageConfig(text: string, where = 'backing-image.cfg'): BackingImageBackupConfig {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new BackupStoreError('Corrupt', `${where}: invalid JSON: ${(err as Error).message}`, { cause: err });
  }
  if (!isObject(doc)) throw new BackupStoreError('Corrupt', `${where}: not a JSON object`);
  const labelsRaw = field(doc, 'Labels');
  let labels: Record<string, string> | null = null;
  if (labelsRaw !== undefined && labelsRaw !== null) {
    if (!isObject(labelsRaw)) throw new BackupStoreError('Corrupt', `${where}: Labels must be an object`);
    labels = {};
    for (const [k, v] of Object.entries(labelsRaw)) {
      if (typeof v !== 'string') throw new BackupStoreError('Corrupt', `${where}: label ${k} must be a string`);
      labels[k] = v;
    }
  }
  const blocksRaw = field(doc, 'Blocks');
  const blocks: BlockEntry[] = [];
  if (blocksRaw !== undefined && blocksRaw !== null) {
    if (!Array.isArray(blocksRaw)) throw new BackupStoreError('Corrupt', `${where}: Blocks must be an array`);
    for (const [i, b] of blocksRaw.entries()) {
      if (!isObject(b)) throw new BackupStoreError('Corrupt', `${where}: Blocks[${i}] is not an object`);
      const offset = field(b, 'Offset') ?? 0;
      const sum = field(b, 'BlockChecksum');
      if (typeof offset !== 'number' || !Number.isSafeInteger(offset) || offset < 0) {
        throw new BackupStoreError('Corrupt', `${where}: Blocks[${i}].Offset is invalid`);
      }
      if (typeof sum !== 'string' || !isBlockChecksum(sum)) {
        throw new BackupStoreError('Corrupt', `${where}: Blocks[${i}].BlockChecksum is not a 64-hex block checksum`);
      }
      blocks.push({ offset, blockChecksum: sum });
    }
  }
  return {
    name: stringField(doc, 'Name', where),
    size: int64Field(doc, 'Size', where),
    blockCount: int64Field(doc, 'BlockCount', where),
    checksum: stringField(doc, 'Checksum', where),
    labels,
    compressionMethod: stringField(doc, 'CompressionMethod', where),
    createdTime: stringField(doc, 'CreatedTime', where),
    completeTime: stringField(doc, 'CompleteTime', where),
    secret: stringField(doc, 'Secret', where),
    secretNamespace: stringField(doc, 'SecretNamespace', where),
    blocks,
  };
}

/** Output of `inspect-backing-image` (Go type `BackupInfo`). */
export interface BackupInfo {
  name: string;
  url: string;
  completeAt: string;
  size: number;
  checksum: string;
  labels: Record<string, string> | null;
  compressionMethod: string;
  secret: string;
  secretNamespace: string;
}

/** `BackupInfo` as Longhorn prints it (compact form; indent with `goIndentTabs`). */
export function encodeBackupInfo(info: BackupInfo): string {
  const parts = [
    `"Name":${goJsonString(info.name)}`,
    `"URL":${goJsonString(info.url)}`,
    `"CompleteAt":${goJsonString(info.completeAt)}`,
    `"Size":${goJsonString(String(info.size))}`,
    `"Checksum":${goJsonString(info.checksum)}`,
    `"Labels":${goJsonStringMap(info.labels)}`,
  ];
  if (info.compressionMethod !== '') parts.push(`"CompressionMethod":${goJsonString(info.compressionMethod)}`);
  parts.push(`"Secret":${goJsonString(info.secret)}`, `"SecretNamespace":${goJsonString(info.secretNamespace)}`);
  return '{' + parts.join(',') + '}';
}

/** Lock file `lock-<16hex>.lck` (Go type `FileLock`). */
/**
 * Who holds a lock, so that a lock left by a process that died can be told from a live one on the same machine.
 * Written as an extra `Owner` object after Longhorn's three fields; Longhorn's reader (Go's encoding/json) ignores it.
 */
export interface LockOwner {
  /** Host name of the holder. */
  host: string;
  /** `/proc/sys/kernel/random/boot_id`: the same host name after a reboot is another machine as far as pids go. */
  bootID: string;
  /** The holder's pid namespace (`/proc/self/ns/pid` link text): pids of other namespaces cannot be checked. */
  pidNS: string;
  pid: number;
  /** Start time of the holder in clock ticks after boot (`/proc/<pid>/stat` field 22): guards against pid reuse. */
  startTime: string;
}

export interface LockFileContent {
  name: string;
  type: number;
  acquired: boolean;
  /** Absent in Longhorn's lock files. */
  owner?: LockOwner;
}

export function encodeLockFile(lock: LockFileContent): string {
  const base = `{"Name":${goJsonString(lock.name)},"Type":${lock.type},"Acquired":${lock.acquired ? 'true' : 'false'}`;
  if (!lock.owner) return `${base}}`;
  const o = lock.owner;
  return `${base},"Owner":{"Host":${goJsonString(o.host)},"BootID":${goJsonString(o.bootID)},"PidNS":${goJsonString(o.pidNS)},"PID":${o.pid},"StartTime":${goJsonString(o.startTime)}}}`;
}

function decodeLockOwner(v: unknown): LockOwner | undefined {
  if (!isObject(v)) return undefined;
  const host = field(v, 'Host');
  const bootID = field(v, 'BootID');
  const pidNS = field(v, 'PidNS');
  const pid = field(v, 'PID');
  const startTime = field(v, 'StartTime');
  if (typeof host !== 'string' || typeof bootID !== 'string' || typeof pidNS !== 'string' || typeof startTime !== 'string') return undefined;
  if (typeof pid !== 'number' || !Number.isSafeInteger(pid) || pid <= 0) return undefined;
  return { host, bootID, pidNS, pid, startTime };
}

export function decodeLockFile(text: string, where: string): LockFileContent {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new BackupStoreError('Corrupt', `${where}: invalid JSON`, { cause: err });
  }
  if (!isObject(doc)) throw new BackupStoreError('Corrupt', `${where}: not a JSON object`);
  const name = field(doc, 'Name');
  const type = field(doc, 'Type');
  const acquired = field(doc, 'Acquired');
  const owner = decodeLockOwner(field(doc, 'Owner'));
  return {
    name: typeof name === 'string' ? name : '',
    type: typeof type === 'number' ? type : 0,
    acquired: acquired === true,
    ...(owner ? { owner } : {}),
  };
}
