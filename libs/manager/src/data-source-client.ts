import http from 'node:http';
import { authHeaders } from '@bis/internal-auth';

/** The part of the data source's `/v1/file` info a manager checks before Fetch. */
export interface DataSourceFileInfo {
  filePath: string;
  uuid: string;
  state: string;
  size?: number;
  message?: string;
}

function request(address: string, method: string, path: string, timeoutMs: number, token: string | undefined): Promise<string> {
  const m = /^\[?([^\]]*?)\]?:(\d+)$/.exec(address.replace(/^https?:\/\//, ''));
  if (!m) return Promise.reject(new Error(`invalid data source address "${address}": expected host:port`));
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: m[1] || '127.0.0.1', port: Number(m[2]), method, path, headers: authHeaders(token), signal: AbortSignal.timeout(timeoutMs) },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          if (res.statusCode === 200) resolve(text);
          else reject(new Error(`resp.StatusCode(${res.statusCode}) != http.StatusOK(200), response body content: ${text}`));
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** GET `/v1/file` of a data source (10 s, as Longhorn's client); `token` is sent as `authorization: Bearer`. */
export async function getDataSourceFile(address: string, token?: string): Promise<DataSourceFileInfo> {
  const raw = JSON.parse(await request(address, 'GET', '/v1/file', 10_000, token)) as Record<string, unknown>;
  return {
    filePath: String(raw['filePath'] ?? ''),
    uuid: String(raw['uuid'] ?? ''),
    state: String(raw['state'] ?? ''),
    size: typeof raw['size'] === 'number' ? raw['size'] : undefined,
    message: typeof raw['message'] === 'string' ? raw['message'] : undefined,
  };
}

/** POST `/v1/file?action=transfer`: the data source hands its file over. */
export async function transferDataSourceFile(address: string, token?: string): Promise<void> {
  await request(address, 'POST', '/v1/file?action=transfer', 10_000, token);
}
