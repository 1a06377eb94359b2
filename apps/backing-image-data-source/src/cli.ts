import { parseHostPort } from '@bis/net-address';
import { readFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { readTokenFile, type InternalAuth } from '@bis/internal-auth';
import { createLogger, messageLog } from '@bis/logging';
import type { DataSourceRunIO } from '@bis/data-source/host';
import type { InstanceServer } from '@bis/data-source';
import type { FileSourceKind } from '@bis/file-sources/source-provider';
import {
  DataSourceConfigError,
  DEFAULT_EXPORT_RECEIVER_PORT,
  parseKeyValues,
  validateDataSourceConfig,
  type DataSourceType,
} from '@bis/data-source/config';

const USAGE = `usage: backing-image-data-source --name N --uuid U --source-type T [--parameters k=v]... [--checksum C]
       [--credential k=v]... [--listen host:port] [--sync-listen host:port] [--disk-path dir]
       [--allow-source-hosts hosts-or-CIDRs] [--ca-bundle file.pem] [--stall-timeout seconds]
       [--begin-timeout seconds] [--download-connections n] [--export-receiver-port port]
       [--max-size bytes] [--storage-reserved bytes]
       [--internal-token-file file [--allow-unauthenticated-internal-calls]]`;

/** The file sources each source type launches (an export as qcow2 streams the converted file as an upload). */
const SOURCE_KINDS: Record<DataSourceType, readonly FileSourceKind[]> = {
  download: ['download'],
  upload: ['upload'],
  restore: ['restore'],
  clone: ['clone'],
  'export-from-volume': ['upload'],
};

/**
 * The credential of a data source (JSON object of strings) comes by this environment variable, so it never shows on
 * a command line (`ps`); `--credential k=v` flags (Longhorn's) are still accepted and win over it.
 */
export const CREDENTIAL_ENV = 'BACKING_IMAGE_DATA_SOURCE_CREDENTIAL';

/** Parses {@link CREDENTIAL_ENV}; an invalid value is a configuration error that never echoes the value. */
export function credentialFromEnv(env: Readonly<Record<string, string | undefined>>): Record<string, string> {
  const raw = env[CREDENTIAL_ENV];
  if (raw === undefined || raw === '') return {};
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    throw new DataSourceConfigError(`invalid ${CREDENTIAL_ENV}: not JSON`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new DataSourceConfigError(`invalid ${CREDENTIAL_ENV}: not a JSON object`);
  const out: Record<string, string> = {};
  for (const [k, val] of Object.entries(v)) {
    if (typeof val !== 'string') throw new DataSourceConfigError(`invalid ${CREDENTIAL_ENV}: the value of ${k} is not a string`);
    out[k] = val;
  }
  return out;
}

const REPEATED = new Set(['parameters', 'credential']);
const SINGLE = new Set([
  'listen', 'sync-listen', 'disk-path', 'name', 'uuid', 'source-type', 'checksum', 'allow-source-hosts', 'ca-bundle',
  'stall-timeout', 'begin-timeout', 'download-connections', 'export-receiver-port', 'max-size', 'storage-reserved',
  'internal-token-file',
]);
/** Flags without a value. */
const BOOLEAN = new Set(['allow-unauthenticated-internal-calls']);

export interface ParsedArgs {
  single: Record<string, string>;
  repeated: Record<string, string[]>;
  flags: Set<string>;
}

/** Strict flag parsing: unknown flags and missing values are errors (`--flag value` or `--flag=value`). */
export function parseArgs(argv: readonly string[]): ParsedArgs {
  const single: Record<string, string> = {};
  const repeated: Record<string, string[]> = { parameters: [], credential: [] };
  const flags = new Set<string>();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--debug') continue; // Longhorn passes it; logging is always on
    if (BOOLEAN.has(a.slice(2))) {
      flags.add(a.slice(2));
      continue;
    }
    if (!a.startsWith('--')) throw new DataSourceConfigError(`unexpected argument "${a}"\n${USAGE}`);
    let key = a.slice(2);
    let value: string | undefined;
    const eq = key.indexOf('=');
    if (eq >= 0) {
      value = key.slice(eq + 1);
      key = key.slice(0, eq);
    }
    if (!SINGLE.has(key) && !REPEATED.has(key)) throw new DataSourceConfigError(`unknown flag --${key}\n${USAGE}`);
    if (value === undefined) {
      value = argv[++i];
      if (value === undefined) throw new DataSourceConfigError(`flag --${key} needs a value`);
    }
    if (REPEATED.has(key)) repeated[key]!.push(value);
    else single[key] = value;
  }
  return { single, repeated, flags };
}

function hostPort(flag: string, v: string): { host: string; port: number } {
  try {
    return parseHostPort(v, { what: `--${flag}`, defaultHost: '0.0.0.0' });
  } catch (e) {
    throw new DataSourceConfigError((e as Error).message);
  }
}

function bytes(flag: string, v: string | undefined, dflt: number, min: number): number {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(n) || n < min) {
    throw new DataSourceConfigError(`invalid --${flag} "${v}": a whole number of bytes >= ${min} is required`);
  }
  return n;
}

function seconds(flag: string, v: string | undefined, dflt: number): number {
  if (v === undefined) return dflt * 1000;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new DataSourceConfigError(`invalid --${flag} "${v}": a positive number of seconds is required`);
  return n * 1000;
}

async function readDiskUUID(diskPath: string): Promise<string> {
  try {
    const cfg = JSON.parse(await readFile(path.join(diskPath, 'longhorn-disk.cfg'), 'utf8')) as { diskUUID?: unknown };
    return typeof cfg.diskUUID === 'string' ? cfg.diskUUID : '';
  } catch {
    return '';
  }
}

/** Runs the data source until SIGINT/SIGTERM. Returns an exit code for configuration errors. */
export async function runDataSourceCli(argv: readonly string[]): Promise<number | undefined> {
  if (argv.some((a) => a === '--help' || a === '-h')) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  const env = { ...process.env };
  // Not passed on to anything this process starts.
  delete process.env[CREDENTIAL_ENV];
  const ac = new AbortController();
  const stop = (): void => ac.abort();
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  try {
    return await runDataSource(argv, { env, signal: ac.signal });
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
  }
}

function addressOf(server: { address(): AddressInfo | string | null }): string {
  const a = server.address();
  return a !== null && typeof a === 'object' ? `${a.address}:${a.port}` : String(a);
}

/**
 * Runs one data source until `io.signal` aborts: its HTTP API and its sync server, each on its own address. Returns an
 * exit code (2 for a configuration error, 0 after a stop). Nothing here touches process-wide state (signals,
 * environment, exit), so a host runs several at once.
 */
export async function runDataSource(argv: readonly string[], io: DataSourceRunIO): Promise<number> {
  const errors = io.errors ?? ((line: string) => process.stderr.write(`${line}\n`));
  let args: ParsedArgs;
  let config;
  try {
    args = parseArgs(argv);
    config = validateDataSourceConfig({
      name: args.single['name'],
      uuid: args.single['uuid'],
      sourceType: args.single['source-type'],
      parameters: parseKeyValues('--parameters', args.repeated['parameters']!),
      credential: { ...credentialFromEnv(io.env), ...parseKeyValues('--credential', args.repeated['credential']!) },
      checksum: args.single['checksum'],
    });
  } catch (e) {
    errors(`backing-image-data-source: ${(e as Error).message}`);
    return 2;
  }
  const s = args.single;
  const tokenFile = s['internal-token-file'];
  const allowUnauthenticated = args.flags.has('allow-unauthenticated-internal-calls');
  if (allowUnauthenticated && !tokenFile) {
    errors('backing-image-data-source: --allow-unauthenticated-internal-calls needs --internal-token-file');
    return 2;
  }
  let internalAuth: InternalAuth | undefined;
  try {
    internalAuth = tokenFile ? { token: await readTokenFile(tokenFile), allowUnauthenticated } : undefined;
  } catch (e) {
    errors(`backing-image-data-source: ${(e as Error).message}`);
    return 2;
  }
  const listen = hostPort('listen', s['listen'] ?? 'localhost:8000');
  const syncListen = hostPort('sync-listen', s['sync-listen'] ?? 'localhost:8001');
  const diskPath = s['disk-path'] ?? '/data/';
  const stallTimeoutMs = seconds('stall-timeout', s['stall-timeout'], 30);
  const beginTimeoutMs = seconds('begin-timeout', s['begin-timeout'], 60);
  // The backing-image-max-size setting and the disk's reserve, from the controller (default: 2 TiB, no reserve).
  const sizeLimit = { maxImageSize: bytes('max-size', s['max-size'], 2 * 1024 ** 4, 1), reservedBytes: bytes('storage-reserved', s['storage-reserved'], 0, 0) };
  const connections = Number(s['download-connections'] ?? '1');
  if (!Number.isInteger(connections) || connections < 1 || connections > 16) {
    throw new DataSourceConfigError(`invalid --download-connections "${s['download-connections']}": 1 to 16`);
  }
  // JSON lines on stderr (the runtime appends them to the data source's log file; in Kubernetes, the pod log).
  const log = messageLog(
    createLogger({
      component: 'backing-image-data-source',
      bindings: { image: config.name, uuid: config.uuid, sourceType: config.sourceType, diskPath },
      ...(io.logDestination ? { outputs: [{ destination: io.logDestination }] } : {}),
    }),
  );
  // Download credentials become origin request headers (never process environment, never in-cluster calls).
  const downloadHeaders = config.sourceType === 'download' ? config.credential : {};
  const env = io.env;
  // Only what this source type needs is loaded, after the arguments are valid (one process per image being
  // prepared: its start cost is paid for every image). A download loads the HTTP client; no source type loads the
  // backup engine before a restore runs, nor the peer transfer, SHA-512 chain and block-mapping modules before the
  // sync service uses them.
  const [{ loadFileSources }, { SyncService }, { startSyncServer }, { DataSource, buildDataSourceApp }] = await Promise.all([
    import('@bis/file-sources/source-provider'),
    import('@bis/sync-service/service'),
    import('@bis/sync-service/server'),
    import('@bis/data-source'),
  ]);
  const sources = await loadFileSources({
    allowSourceHosts: (s['allow-source-hosts'] ?? '').split(','),
    downloadHeaders,
    caBundlePath: s['ca-bundle'],
    proxy: {
      http: env['HTTP_PROXY'] ?? env['http_proxy'],
      https: env['HTTPS_PROXY'] ?? env['https_proxy'],
      noProxy: env['NO_PROXY'] ?? env['no_proxy'],
    },
    stallTimeoutMs,
    parallel: { connections },
    sizeLimit,
    // Credentials go to the backup engine per call, never through process environment.
    // The backup engine is loaded only by a restore data source: the other source types (one process per image) do
    // not pay for loading it at start.
    restoreBackup: async (a) => {
      const { restoreBackup } = await import('@bis/backupstore');
      const r = await restoreBackup({
        backupUrl: a.backupUrl,
        output: a.output,
        root: diskPath, // the restore destination is confined to the disk
        concurrency: a.concurrency,
        credential: a.credential,
        signal: a.signal,
        onProgress: (p) => a.onProgress(p.processedBytes, p.totalBytes),
        checkSize: a.checkSize,
      });
      return { size: r.size, sha512: r.sha512, ...(r.chain ? { chain: r.chain } : {}) };
    },
  }, SOURCE_KINDS[config.sourceType]);
  const sync = new SyncService({ diskPath, sources, beginTimeoutMs, internalAuth, log });
  // In a data-source host the servers share the host's fastify apps (io.servers); alone, each has its own.
  const servers = io.servers;
  const syncServer: InstanceServer = servers
    ? await servers.listenSync(sync, syncListen, internalAuth)
    : await startSyncServer(sync, syncListen, { auth: internalAuth }).then((app) => ({ server: app.server, close: () => app.close() }));
  const ds = new DataSource({
    config,
    diskPath,
    diskUUID: await readDiskUUID(diskPath),
    sync,
    beginTimeoutMs,
    exportReceiverPort: Number(s['export-receiver-port'] ?? DEFAULT_EXPORT_RECEIVER_PORT),
    sizeLimit,
    internalAuth,
    log,
  });
  await ds.start();
  let app: InstanceServer;
  if (servers) app = await servers.listenDataSource(ds, listen, internalAuth, log);
  else {
    const own = await buildDataSourceApp({ dataSource: ds }, { ...(internalAuth ? { auth: internalAuth } : {}), onRefused: (req, reason) => log(`refused ${req.url}: ${reason}`) });
    await own.listen({ host: listen.host, port: listen.port });
    app = { server: own.server, close: () => own.close() };
  }
  log(`data source: internal calls ${!internalAuth ? 'are NOT authenticated (no --internal-token-file)' : allowUnauthenticated ? 'need the token when they send one; calls without a token are admitted' : 'need the token'}`);
  const http = addressOf(app.server);
  log(`data source ${config.name}-${config.uuid} (${config.sourceType}) listening on ${http}`);
  io.onListening?.({ http, sync: addressOf(syncServer.server) });
  if (!io.signal.aborted) await new Promise<void>((resolve) => io.signal.addEventListener('abort', () => resolve(), { once: true }));
  log('shutting down');
  await ds.close();
  await app.close();
  await syncServer.close();
  await sync.close();
  return 0;
}
