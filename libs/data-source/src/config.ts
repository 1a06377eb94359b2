import { DiskPathError, ENTRY_NAME_MAX_LENGTH, checkBackingImageName, checkBackingImageUUID } from '@bis/disk-path';

/** Runs a @bis/disk-path check; its refusal becomes a DataSourceConfigError with the same message. */
function diskName(check: () => unknown): void {
  try {
    check();
  } catch (e) {
    if (e instanceof DiskPathError) throw new DataSourceConfigError(e.message);
    throw e;
  }
}

/** Data-source source types (`--source-type`). */
export const SOURCE_TYPES = ['download', 'upload', 'export-from-volume', 'restore', 'clone'] as const;
export type DataSourceType = (typeof SOURCE_TYPES)[number];

/** Port of the export-from-volume ssync receiver (Longhorn `DefaultVolumeExportReceiverPort`). */
export const DEFAULT_EXPORT_RECEIVER_PORT = 8002;

export class DataSourceConfigError extends Error {
  override readonly name = 'DataSourceConfigError';
}

export interface DataSourceConfig {
  name: string;
  uuid: string;
  sourceType: DataSourceType;
  parameters: Record<string, string>;
  checksum: string;
  credential: Record<string, string>;
}

/**
 * Parses repeated `k=v` values (`--parameters`, `--credential`). The value is everything after the first `=`.
 * A value without `=` or with an empty key is a clear error (Longhorn crashes on the former, quirk 14).
 */
export function parseKeyValues(flag: string, values: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const v of values) {
    const eq = v.indexOf('=');
    if (eq < 0) throw new DataSourceConfigError(`invalid ${flag} value "${v}": expected key=value`);
    const key = v.slice(0, eq);
    if (key === '') throw new DataSourceConfigError(`invalid ${flag} value "${v}": the key is empty`);
    out[key] = v.slice(eq + 1);
  }
  return out;
}

function requireParam(c: { parameters: Record<string, string> }, key: string, what: string): string {
  const v = c.parameters[key];
  if (v === undefined || v === '') throw new DataSourceConfigError(`missing parameter "${key}": ${what}`);
  return v;
}

/** Validates the configuration of a data source; every error names the parameter at fault. */
export function validateDataSourceConfig(c: {
  name?: string;
  uuid?: string;
  sourceType?: string;
  parameters?: Record<string, string>;
  checksum?: string;
  credential?: Record<string, string>;
}): DataSourceConfig {
  if (!c.name || !c.uuid) throw new DataSourceConfigError('the backing image name or uuid is not specified (--name, --uuid)');
  // the work file is `<disk>/tmp/<name>-<uuid>`: names and uuids are confined by @bis/disk-path's rules
  diskName(() => checkBackingImageName(c.name!, '--name'));
  diskName(() => checkBackingImageUUID(c.uuid!, '--uuid'));
  if (`${c.name}-${c.uuid}`.length > ENTRY_NAME_MAX_LENGTH) {
    throw new DataSourceConfigError(`invalid --name/--uuid: "<name>-<uuid>" is longer than ${ENTRY_NAME_MAX_LENGTH} characters`);
  }
  if (!SOURCE_TYPES.includes(c.sourceType as DataSourceType)) {
    throw new DataSourceConfigError(
      `unknown --source-type "${c.sourceType ?? ''}": expected one of ${SOURCE_TYPES.join(', ')}`,
    );
  }
  const cfg: DataSourceConfig = {
    name: c.name,
    uuid: c.uuid,
    sourceType: c.sourceType as DataSourceType,
    parameters: c.parameters ?? {},
    checksum: c.checksum ?? '',
    credential: c.credential ?? {},
  };
  const engine = cfg.parameters['data-engine'];
  if (engine !== undefined && engine !== '' && engine !== 'v1' && engine !== 'v2') {
    throw new DataSourceConfigError(`invalid parameter "data-engine" value "${engine}": expected v1 or v2`);
  }
  switch (cfg.sourceType) {
    case 'download':
      requireParam(cfg, 'url', 'no URL for file downloading');
      break;
    case 'upload':
      break;
    case 'restore': {
      requireParam(cfg, 'backup-url', 'the backup URL to restore from');
      const limit = requireParam(cfg, 'concurrent-limit', 'the number of concurrent block restores');
      if (!/^\d+$/.test(limit) || Number(limit) < 1) {
        throw new DataSourceConfigError(`invalid parameter "concurrent-limit" value "${limit}": a positive integer is required`);
      }
      break;
    }
    case 'clone': {
      const src = requireParam(cfg, 'backing-image', 'the source backing image name');
      const srcUUID = requireParam(cfg, 'backing-image-uuid', 'the source backing image uuid');
      // the source is `<disk>/backing-images/<backing-image>-<backing-image-uuid>/backing`
      diskName(() => checkBackingImageName(src, 'parameter "backing-image"'));
      diskName(() => checkBackingImageUUID(srcUUID, 'parameter "backing-image-uuid"'));
      const enc = cfg.parameters['encryption'] ?? '';
      if (!['encrypt', 'decrypt', 'ignore'].includes(enc)) {
        throw new DataSourceConfigError(`invalid parameter "encryption": encryption operation ${enc || '(empty)'} is not specified (encrypt, decrypt or ignore)`);
      }
      if (enc !== 'ignore' && Object.keys(cfg.credential).length === 0) {
        throw new DataSourceConfigError(`missing --credential: secret is not provided for encrypt or decrypt`);
      }
      break;
    }
    case 'export-from-volume': {
      requireParam(cfg, 'snapshot-name', 'the snapshot to export');
      requireParam(cfg, 'sender-address', 'the replica address that sends the volume');
      const size = requireParam(cfg, 'volume-size', 'the volume size in bytes');
      if (!/^\d+$/.test(size) || Number(size) <= 0 || Number(size) % 512 !== 0) {
        throw new DataSourceConfigError(`invalid parameter "volume-size" value "${size}": a positive multiple of 512 is required`);
      }
      const type = exportType(cfg.parameters);
      if (type !== 'raw' && type !== 'qcow2') {
        throw new DataSourceConfigError(`invalid parameter "export-type" value "${type}": expected raw or qcow2`);
      }
      break;
    }
  }
  return cfg;
}

/** The export format: `export-type` (what longhorn-manager sends), falling back to the legacy `file-type`. */
export function exportType(parameters: Record<string, string>): string {
  return parameters['export-type'] || parameters['file-type'] || 'raw';
}
