import { BackupStoreError, assertBackingImageName } from './names.js';

export type BackupTargetScheme = 's3' | 'nfs' | 'vfs';

export interface BackupUrl {
  /** The backing image name from `?backingImage=`. */
  name: string;
  /** The target URL without `backingImage` (other query keys such as `nfsOptions` kept): opens the driver. */
  targetUrl: string;
  /** The target URL without any query, as Longhorn's `DecodeBackupBackingImageURL` returns it. */
  strippedTargetUrl: string;
}

function parse(url: string, what: string): URL {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new BackupStoreError('InvalidArgument', `invalid ${what} ${JSON.stringify(url)}: not a URL`);
  }
  return parsed;
}

/** Longhorn's `EncodeBackupBackingImageURL`: appends `?backingImage=<name>` (or `&…` when the target has a query). */
export function encodeBackupUrl(name: string, targetUrl: string): string {
  assertBackingImageName(name);
  parseTargetUrl(targetUrl);
  return `${targetUrl}${targetUrl.includes('?') ? '&' : '?'}backingImage=${encodeURIComponent(name)}`;
}

/** Longhorn's `DecodeBackupBackingImageURL`, keeping the other query keys for opening the driver. */
export function parseBackupUrl(backupUrl: string): BackupUrl {
  const q = backupUrl.indexOf('?');
  if (q < 0) {
    throw new BackupStoreError('InvalidArgument', `invalid backup URL ${JSON.stringify(backupUrl)}: missing ?backingImage=<name>`);
  }
  const base = backupUrl.slice(0, q);
  const params = new URLSearchParams(backupUrl.slice(q + 1));
  const name = params.get('backingImage');
  if (name === null || name === '') {
    throw new BackupStoreError('InvalidArgument', `invalid backup URL ${JSON.stringify(backupUrl)}: missing ?backingImage=<name>`);
  }
  assertBackingImageName(name);
  // Rebuild the rest of the query as written (not re-encoded), dropping every backingImage= pair.
  const rest = backupUrl
    .slice(q + 1)
    .split('&')
    .filter((pair) => pair !== '' && decodeURIComponent(pair.split('=')[0] ?? '') !== 'backingImage');
  const targetUrl = rest.length > 0 ? `${base}?${rest.join('&')}` : base;
  parseTargetUrl(targetUrl);
  return { name, targetUrl, strippedTargetUrl: base };
}

export interface S3TargetLocation {
  scheme: 's3';
  bucket: string;
  /** '' when the URL has no `@region`. */
  region: string;
  /** Key prefix without leading or trailing '/'; '' for the bucket root. */
  prefix: string;
}

export interface FileSystemTargetLocation {
  scheme: 'vfs' | 'nfs';
  /** For vfs, the absolute store directory. For nfs, the export path on the server. */
  path: string;
  /** For nfs, the server (host name or address); '' for vfs. */
  host: string;
  /** For nfs, mount options from `nfsOptions` (comma-separated or repeated). */
  mountOptions: string[];
}

export type TargetLocation = S3TargetLocation | FileSystemTargetLocation;

export function parseTargetUrl(targetUrl: string): TargetLocation {
  const u = parse(targetUrl, 'backup target URL');
  const scheme = u.protocol.replace(/:$/, '');
  switch (scheme) {
    case 's3': {
      const hasAt = u.username !== '';
      const bucket = hasAt ? decodeURIComponent(u.username) : u.hostname;
      const region = hasAt ? u.hostname : '';
      if (bucket === '') throw new BackupStoreError('InvalidArgument', `invalid S3 target ${JSON.stringify(targetUrl)}: missing bucket`);
      const prefix = decodeURIComponent(u.pathname).replace(/^\/+/, '').replace(/\/+$/, '');
      return { scheme: 's3', bucket, region, prefix };
    }
    case 'vfs': {
      if (u.host !== '') {
        throw new BackupStoreError('InvalidArgument', `invalid vfs target ${JSON.stringify(targetUrl)}: use vfs:///absolute/path (no host)`);
      }
      const path = decodeURIComponent(u.pathname);
      if (!path.startsWith('/') || path === '/') {
        throw new BackupStoreError('InvalidArgument', `invalid vfs target ${JSON.stringify(targetUrl)}: needs an absolute directory`);
      }
      return { scheme: 'vfs', path: path.replace(/\/+$/, ''), host: '', mountOptions: [] };
    }
    case 'nfs': {
      const path = decodeURIComponent(u.pathname);
      if (u.hostname === '' || path === '' || path === '/') {
        throw new BackupStoreError('InvalidArgument', `invalid nfs target ${JSON.stringify(targetUrl)}: expected nfs://server:/export/path`);
      }
      const mountOptions = u.searchParams.getAll('nfsOptions').flatMap((o) => o.split(',')).filter(Boolean);
      return { scheme: 'nfs', path, host: u.hostname, mountOptions };
    }
    default:
      throw new BackupStoreError(
        'Unsupported',
        `unsupported backup target ${JSON.stringify(targetUrl)}: scheme ${JSON.stringify(scheme)} (supported: s3, nfs, vfs)`,
      );
  }
}
