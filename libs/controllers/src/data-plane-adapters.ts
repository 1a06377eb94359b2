import http from 'node:http';
import { authHeaders } from '@bis/internal-auth';
import { deleteBackup, encodeBackupUrl, inspectBackup, listBackingImageBackups } from '@bis/backupstore';
import type { BackupTargetApi, DataSourceApi, DataSourceFileInfo } from './data-plane.js';

/** Longhorn's data-source client timeout for `GET /v1/file`. */
const DATA_SOURCE_GET_TIMEOUT_MS = 10_000;

/** Largest `GET /v1/file` answer read (it is a few hundred bytes of JSON). */
const DATA_SOURCE_MAX_ANSWER_BYTES = 1 << 20;

/**
 * The data source's HTTP API (`GET /v1/file`) at `host:port`, for any data plane whose data sources speak HTTP.
 * Each call uses its own connection, closed after the answer (`node:http` without an agent): every data source
 * listens on its own port and lives for one transfer, and the global `fetch` keeps a connection pool per origin
 * it ever reached (about 25 KiB of heap each, never released), which grew with every image prepared.
 * `token` (the system's internal token) is sent as `authorization: Bearer <token>`.
 */
export function httpDataSourceClient(address: string, token?: string): DataSourceApi {
  return {
    async get(): Promise<DataSourceFileInfo> {
      const url = `http://${address}/v1/file`;
      const { status, body } = await getText(url, DATA_SOURCE_GET_TIMEOUT_MS, token);
      if (status !== 200) throw new Error(`GET ${url}: HTTP ${status} ${body}`);
      let b: Partial<DataSourceFileInfo>;
      try {
        b = JSON.parse(body) as Partial<DataSourceFileInfo>;
      } catch {
        throw new Error(`GET ${url}: the answer is not JSON: ${body.slice(0, 200)}`);
      }
      return {
        state: b.state ?? '',
        size: Number(b.size ?? 0),
        progress: Number(b.progress ?? 0),
        currentChecksum: b.currentChecksum ?? '',
        message: b.message ?? '',
        ...(typeof b.unpaddedChecksum === 'string' && b.unpaddedChecksum ? { unpaddedSize: Number(b.unpaddedSize ?? 0), unpaddedChecksum: b.unpaddedChecksum } : {}),
      };
    },
  };
}

/** One GET on a connection of its own (closed afterwards), with a timeout over the whole exchange. */
function getText(url: string, timeoutMs: number, token: string | undefined): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { agent: false, headers: { connection: 'close', ...authHeaders(token) } }, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        size += c.length;
        if (size > DATA_SOURCE_MAX_ANSWER_BYTES) {
          req.destroy(new Error(`GET ${url}: the answer is larger than ${DATA_SOURCE_MAX_ANSWER_BYTES} bytes`));
          return;
        }
        chunks.push(c);
      });
      res.on('end', () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') });
      });
      res.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
    });
    const timer = setTimeout(() => req.destroy(new Error(`GET ${url}: no answer within ${timeoutMs} ms`)), timeoutMs);
    req.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

/**
 * Backup-target operations done in-process by the backup engine (`@bis/backupstore`), with the target's credential
 * passed per call (Longhorn runs them through its engine binary with the credential in the process environment).
 */
export const backupstoreTargetApi: BackupTargetApi = {
  async listBackingImages(targetURL, credential) {
    return (await listBackingImageBackups(targetURL, { credential })).filter((e) => e.state === 'complete').map((e) => e.name);
  },
  backingImageURL: (targetURL, biName) => encodeBackupUrl(biName, targetURL),
  async inspectBackingImage(url, credential) {
    const i = await inspectBackup(url, { credential });
    return {
      name: i.name,
      url: i.url,
      size: i.size,
      checksum: i.checksum,
      labels: i.labels ?? {},
      compressionMethod: i.compressionMethod,
      secret: i.secret,
      secretNamespace: i.secretNamespace,
      createdAt: i.completeAt,
    };
  },
  async deleteBackingImage(url, credential) {
    await deleteBackup(url, { credential });
  },
};
