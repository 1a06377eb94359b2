import { createHash } from 'node:crypto';
import { constants as fsConstants, createWriteStream, openAsBlob } from 'node:fs';
import { access, readFile, rename, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { get as httpGetPlain, type IncomingMessage } from 'node:http';
import { get as httpsGet } from 'node:https';
import { parseArgs } from 'node:util';
import { createGunzip } from 'node:zlib';
import {
  ApiClientError,
  BisClient,
  errorFromResponse,
  transportError,
  copiesShortfall,
  describeCopies,
  describeSource,
  formatBytes,
  isNotFound,
  parseExpectedChecksum,
  summariseCopies,
  allCopiesFailedReason,
  type BackingImage,
  type BisEvent,
  type BackupBackingImage,
  type BackupTarget,
  type BackupTargetUpdate,
  type CreateBackingImageRequest,
  type SecretInfo,
  type Node,
  type NodeDisk,
} from '@bis/api-client';
import { render, table, type OutputFormat } from './output.js';
import { ProgressBar } from './progress.js';

/** Exit codes scripts can rely on (docs/bictl.md). */
export const Exit = { ok: 0, failed: 1, usage: 2, notFound: 3, timeout: 4, unreachable: 5, interrupted: 130 } as const;

export class UsageError extends Error {}
class CommandFailed extends Error {
  constructor(
    message: string,
    readonly code: number = Exit.failed,
  ) {
    super(message);
  }
}

export interface Io {
  stdout: NodeJS.WriteStream;
  stderr: NodeJS.WriteStream;
  env: NodeJS.ProcessEnv;
  /** Aborted on SIGINT/SIGTERM. */
  signal: AbortSignal;
}

const OPTIONS = {
  server: { type: 'string' },
  output: { type: 'string', short: 'o' },
  help: { type: 'boolean', short: 'h' },
  version: { type: 'boolean' },
  timeout: { type: 'string' },
  wait: { type: 'boolean' },
  url: { type: 'string' },
  'from-image': { type: 'string' },
  checksum: { type: 'string' },
  'min-copies': { type: 'string' },
  'node-selector': { type: 'string' },
  'disk-selector': { type: 'string' },
  disk: { type: 'string', multiple: true },
  target: { type: 'string' },
  gzip: { type: 'boolean' },
  'from-env-file': { type: 'string' },
  'from-file': { type: 'string', multiple: true },
  secret: { type: 'string' },
  'poll-interval': { type: 'string' },
} as const;
type OptionName = keyof typeof OPTIONS;
type Values = { [K in OptionName]?: (typeof OPTIONS)[K] extends { multiple: true } ? string[] : (typeof OPTIONS)[K]['type'] extends 'boolean' ? boolean : string };

interface Command {
  usage: string;
  summary: string;
  args: [min: number, max: number];
  options: OptionName[];
  run(ctx: Ctx, args: string[]): Promise<void>;
}

interface Ctx {
  client: BisClient;
  io: Io;
  v: Values;
  format: OutputFormat;
  timeoutMs: number;
  print(s: string): void;
  note(s: string): void;
}

export const USAGE_HEADER = `bictl: manage backing images through the REST API.

Usage: bictl <group> <command> [arguments] [options]

Global options:
  --server URL        REST API (default: $BICTL_SERVER, else http://127.0.0.1:9500)
  (environment)       BICTL_TOKEN: bearer token of the API (controller-manager --auth-token-file)
  -o, --output FMT    table (default), json or yaml
  --timeout DUR       limit for --wait (default 10m; e.g. 90s, 5m, 1h)
  -h, --help          help for bictl or a command
  --version           print the version

Exit codes: 0 ok, 1 failed, 2 usage error, 3 not found, 4 timed out, 5 server unreachable, 130 interrupted.
`;

function parseDuration(s: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(s.trim());
  if (!m) throw new UsageError(`invalid duration "${s}": use e.g. 90s, 5m or 1h`);
  return Number(m[1]) * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? 's') as 'ms' | 's' | 'm' | 'h'];
}

function positiveInt(s: string, what: string): number {
  const n = Number(s);
  if (!/^\d+$/.test(s.trim()) || !Number.isInteger(n) || n < 1) throw new UsageError(`${what} must be a whole number of at least 1, got "${s}"`);
  return n;
}

const tags = (s: string | undefined): string[] => (s ?? '').split(',').map((t) => t.trim()).filter(Boolean);

function checksumOption(v: Values): string {
  if (!v.checksum) return '';
  try {
    return parseExpectedChecksum(v.checksum)?.wire ?? '';
  } catch (err) {
    throw new UsageError(`--checksum: ${(err as Error).message}`);
  }
}

// ---- rendering ------------------------------------------------------------------------------------------------

function imageRows(list: BackingImage[]): string {
  return table(
    ['name', 'size', 'virtual-size', 'source', 'state', 'copies', 'progress'],
    list.map((bi) => {
      const s = summariseCopies(bi);
      return [bi.name, bi.size ? formatBytes(bi.size) : '-', bi.virtualSize ? formatBytes(bi.virtualSize) : '-', describeSource(bi), s.phase, `${s.ready}/${s.total}`, s.total && !s.allFailed ? `${s.progress}%` : '-'];
    }),
  );
}

/** kubectl's age: `45s`, `12m`, `3h`, `5d`. */
export function age(fromIso: string, now: number): string {
  const t = Date.parse(fromIso);
  if (!Number.isFinite(t)) return '<unknown>';
  const s = Math.max(0, Math.floor((now - t) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 48 * 3600) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

/** `in 40s` / `now`: when the next attempt of a failed copy comes. */
function nextRetry(iso: string | undefined, now: number): string {
  if (!iso) return '-';
  const t = Date.parse(iso);
  if (!Number.isFinite(t)) return iso;
  return t <= now ? `${iso} (due)` : `${iso} (in ${age(new Date(now).toISOString(), t)})`;
}

/** The `Events:` section as `kubectl describe` prints it. */
export function eventsSection(events: BisEvent[] | undefined, now: number): string {
  if (!events) return 'Events:  <unknown: the server does not list events>\n';
  if (!events.length) return 'Events:  <none>\n';
  const rows = events.map((e) => {
    const last = age(e.lastTimestamp, now);
    const when = e.count > 1 ? `${last} (x${e.count} over ${age(e.firstTimestamp, now)})` : last;
    return [e.eventType, e.reason, when, e.source, e.message];
  });
  const t = table(['type', 'reason', 'age', 'from', 'message'], rows).split('\n');
  // kubectl's header is Title Case with a dashed rule under it
  const header = t[0]!.replace(/[A-Z]+/g, (w) => w[0] + w.slice(1).toLowerCase());
  const rule = header.replace(/[^ ]/g, '-');
  return `Events:\n${[header, rule, ...t.slice(1)].filter((l, i, a) => l || i < a.length - 1).map((l) => `  ${l}`).join('\n')}\n`;
}

function imageDetail(bi: BackingImage, events?: BisEvent[], now = Date.now()): string {
  const s = summariseCopies(bi);
  const kv: [string, string][] = [
    ['Name', bi.name],
    ['UUID', bi.uuid || '-'],
    ['State', `${s.phase} (${describeCopies(s)})`],
    ['Source', describeSource(bi)],
    ['Size', bi.size ? `${formatBytes(bi.size)} (${bi.size})` : '-'],
    ['Virtual size', bi.virtualSize ? `${formatBytes(bi.virtualSize)} (${bi.virtualSize})` : '-'],
    ['Min copies', String(bi.minNumberOfCopies)],
    ['Expected checksum', bi.expectedChecksum || '-'],
    ['Current checksum', bi.currentChecksum || '-'],
    ['Node selector', bi.nodeSelector?.join(',') || '-'],
    ['Disk selector', bi.diskSelector?.join(',') || '-'],
  ];
  for (const [k, val] of Object.entries(bi.parameters ?? {})) kv.push([`Parameter ${k}`, val]);
  const shortfall = copiesShortfall(bi);
  if (shortfall) kv.push(['Warning', shortfall.message]);
  const w = Math.max(...kv.map(([k]) => k.length));
  const head = kv.map(([k, val]) => `${(k + ':').padEnd(w + 2)}${val}`).join('\n') + '\n';
  const disks = Object.entries(bi.diskFileStatusMap);
  const copies = disks.length
    ? `\n${table(
        ['disk', 'state', 'progress', 'retries', 'next retry', 'message'],
        disks.map(([d, f]) => [d, f.state || 'not-started', `${f.progress}%`, String(f.retryCount ?? 0), nextRetry(f.nextRetryAt, now), f.message || '-']),
      )}`
    : '';
  return `${head}${copies}\n${eventsSection(events, now)}`;
}

function backupRows(list: BackupBackingImage[]): string {
  return table(
    ['name', 'backing-image', 'target', 'size', 'state', 'progress', 'created'],
    list.map((b) => [b.name, b.backingImageName, b.backupTargetName, b.size ? formatBytes(b.size) : '-', b.state || 'Pending', `${b.progress}%`, b.created || '-']),
  );
}

/** How long ago an RFC 3339 time was, shortly: `40s ago`, `5m ago`, `2h ago`, `3d ago`. */
function ago(time: string, now = Date.now()): string {
  const s = Math.max(0, Math.floor((now - Date.parse(time)) / 1000));
  if (!Number.isFinite(s)) return time;
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 48 * 3600) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

/** A disk's last scrub: `ok 2h ago`, `corrupted 5m ago: <which copy, which segment>`, `scrubbing <copy>`, or `-`. */
function scrubText(d: NodeDisk): string {
  const s = d.scrub;
  if (!s) return '-';
  const last = s.lastScrubResult && s.lastScrubTime ? `${s.lastScrubResult} ${ago(s.lastScrubTime)}${s.lastScrubResult !== 'ok' && s.lastScrubMessage ? `: ${s.lastScrubMessage}` : ''}` : '';
  const now = s.scrubbing ? `scrubbing ${s.scrubbing}` : '';
  return [now, last].filter(Boolean).join(', ') || '-';
}

function nodeRows(list: Node[]): string {
  const rows: string[][] = [];
  for (const n of list) {
    const disks = Object.entries(n.disks ?? {});
    if (!disks.length) rows.push([n.name, String(n.allowScheduling), String(n.evictionRequested), '-', '-', '-', '-']);
    for (const [name, d] of disks) rows.push([n.name, String(n.allowScheduling), String(n.evictionRequested), name, d.diskUUID, d.storageAvailable !== undefined ? formatBytes(d.storageAvailable) : '-', scrubText(d)]);
  }
  return table(['node', 'schedulable', 'eviction', 'disk', 'disk-uuid', 'available', 'scrub'], rows);
}

function targetRows(list: BackupTarget[]): string {
  return table(
    ['name', 'url', 'secret', 'poll-interval', 'available', 'message'],
    list.map((t) => [t.name, t.backupTargetURL || '-', t.credentialSecret || '-', t.pollInterval || '-', String(t.available), t.message || '']),
  );
}

function targetDetail(t: BackupTarget): string {
  const kv: [string, string][] = [
    ['Name', t.name],
    ['URL', t.backupTargetURL || '-'],
    ['Credential secret', t.credentialSecret || '-'],
    ['Poll interval', t.pollInterval || '-'],
    ['Available', String(t.available)],
    ['Message', t.message || '-'],
  ];
  const w = Math.max(...kv.map(([k]) => k.length));
  return kv.map(([k, val]) => `${(k + ':').padEnd(w + 2)}${val}`).join('\n') + '\n';
}

function secretRows(list: SecretInfo[]): string {
  return table(['name', 'keys'], list.map((x) => [x.name, (x.keys ?? []).join(',') || '-']));
}

/** A 404 of a named object becomes exit 3 with a message naming it. */
async function named<T>(what: string, name: string, p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (err) {
    if (isNotFound(err)) throw new CommandFailed(`${what} ${name} not found`, Exit.notFound);
    throw err;
  }
}

const ENV_KEY = /^[-._a-zA-Z0-9]+$/;

/** `KEY=VALUE` lines of an env file: blank lines and `#` comments skipped, optional `export `, quotes removed. */
export function parseEnvFile(text: string, file: string): Record<string, string> {
  const out: Record<string, string> = {};
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith('#')) return;
    const body = line.startsWith('export ') ? line.slice(7).trimStart() : line;
    const eq = body.indexOf('=');
    const key = eq > 0 ? body.slice(0, eq).trim() : '';
    // The message never quotes the line: it may hold a secret value.
    if (!ENV_KEY.test(key)) throw new UsageError(`${file}:${i + 1}: expected KEY=VALUE`);
    let value = body.slice(eq + 1).trim();
    if (value.length >= 2 && (value[0] === '"' || value[0] === "'") && value.endsWith(value[0])) value = value.slice(1, -1);
    out[key] = value;
  });
  return out;
}

/** The data of `secret set`: KEY=VALUE arguments, `--from-env-file FILE` and `--from-file KEY=PATH` (a PEM, say). */
async function secretData(v: Values, args: string[]): Promise<Record<string, string>> {
  const data: Record<string, string> = {};
  if (v['from-env-file']) {
    const text = await readFile(v['from-env-file'], 'utf8').catch((err: NodeJS.ErrnoException) => {
      throw new UsageError(`cannot read ${v['from-env-file']}: ${err.code ?? err.message}`);
    });
    Object.assign(data, parseEnvFile(text, v['from-env-file']));
  }
  for (const [n, a] of args.entries()) {
    const eq = a.indexOf('=');
    if (eq <= 0 || !ENV_KEY.test(a.slice(0, eq))) throw new UsageError(`argument ${n + 2} must be KEY=VALUE (letters, digits, '-', '_', '.' in KEY)`);
    data[a.slice(0, eq)] = a.slice(eq + 1);
  }
  for (const spec of v['from-file'] ?? []) {
    const eq = spec.indexOf('=');
    if (eq <= 0 || !ENV_KEY.test(spec.slice(0, eq))) throw new UsageError(`--from-file must be KEY=PATH, got "${spec}"`);
    const file = spec.slice(eq + 1);
    data[spec.slice(0, eq)] = await readFile(file, 'utf8').catch((err: NodeJS.ErrnoException) => {
      throw new UsageError(`cannot read ${file}: ${err.code ?? err.message}`);
    });
  }
  if (!Object.keys(data).length) throw new UsageError('give the secret\'s data: KEY=VALUE..., --from-env-file FILE or --from-file KEY=PATH');
  return data;
}

// ---- waiting --------------------------------------------------------------------------------------------------

/**
 * Ready when `minNumberOfCopies` copies are ready, or, when the server reports that the selectors allow fewer disks
 * than that, when each of those disks has a ready copy (a warning names the shortfall): never waits for a copy that
 * cannot exist.
 */
function copiesDone(bi: BackingImage): boolean {
  if (!bi.currentChecksum) return false;
  const ready = summariseCopies(bi).ready;
  if (ready >= Math.max(1, bi.minNumberOfCopies)) return true;
  const short = copiesShortfall(bi);
  return !!short && short.allowed >= 1 && ready >= short.allowed;
}

/**
 * An upload the server already failed (every copy failed: a checksum mismatch, a size mismatch, a data source that
 * stopped) cannot be resumed: the data source is gone. Says so at once, with the server's reason and what to do.
 */
function uploadFailure(bi: BackingImage): CommandFailed | undefined {
  const msg = allCopiesFailedReason(bi);
  if (msg === undefined) return undefined;
  return new CommandFailed(
    `the upload of backing image ${bi.name} failed on the server${msg ? `: ${msg}` : ''}\nit cannot be resumed: delete it (bictl image rm ${bi.name} --wait) and run the upload again`,
  );
}

function failIfUploadFailed(bi: BackingImage): void {
  const failure = uploadFailure(bi);
  if (failure) throw failure;
}

async function waitReady(ctx: Ctx, name: string): Promise<BackingImage> {
  const bi = await waitCopies(ctx, name);
  const short = copiesShortfall(bi);
  const ready = summariseCopies(bi).ready;
  if (short && ready < bi.minNumberOfCopies) ctx.note(`bictl: warning: ${short.message}; ${ready} of ${bi.minNumberOfCopies} copies are ready, on every disk that can hold one`);
  return bi;
}

async function waitCopies(ctx: Ctx, name: string): Promise<BackingImage> {
  const bar = new ProgressBar(ctx.io.stderr, name);
  try {
    return await ctx.client.waitForBackingImage(name, copiesDone, {
      timeoutMs: ctx.timeoutMs,
      signal: ctx.io.signal,
      failed: (bi) => {
        const s = summariseCopies(bi);
        if (s.deleting) return `backing image ${name} is being deleted`;
        const msg = allCopiesFailedReason(bi);
        if (msg === undefined) return undefined;
        return `every copy of backing image ${name} failed${msg ? `: ${msg}` : ''}`;
      },
      onUpdate: (bi) => {
        const s = summariseCopies(bi);
        bar.percent(s.progress, `${describeCopies(s)}`);
      },
    });
  } finally {
    bar.done();
  }
}

async function sleep(ms: number, signal: AbortSignal): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => (clearTimeout(t), reject(signal.reason)), { once: true });
  });
}


/** GET with node:http(s); rejects with the API's error (as ApiClientError) for a non-2xx answer. */
function httpGet(url: string, signal: AbortSignal, headers: Record<string, string> = {}): Promise<IncomingMessage> {
  const label = `GET ${new URL(url).pathname}`;
  return new Promise((resolve, reject) => {
    const get = url.startsWith('https:') ? httpsGet : httpGetPlain;
    const req = get(url, { signal, headers }, (res) => {
      const status = res.statusCode ?? 0;
      if (status >= 200 && status < 300) return resolve(res);
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.length < 64 && chunks.push(c));
      res.on('end', () => {
        errorFromResponse(new Response(Buffer.concat(chunks), { status }), label).then(reject, reject);
      });
      res.on('error', (err) => reject(transportError(err, label, signal)));
    });
    req.on('error', (err) => reject(transportError(err, label, signal)));
  });
}

// ---- commands -------------------------------------------------------------------------------------------------

const CREATE_OPTS: OptionName[] = ['checksum', 'min-copies', 'node-selector', 'disk-selector', 'wait', 'timeout'];

function createRequest(v: Values, name: string, req: Pick<CreateBackingImageRequest, 'sourceType' | 'parameters'>): CreateBackingImageRequest {
  return {
    name,
    ...req,
    expectedChecksum: checksumOption(v),
    minNumberOfCopies: v['min-copies'] ? positiveInt(v['min-copies'], '--min-copies') : undefined,
    nodeSelector: tags(v['node-selector']),
    diskSelector: tags(v['disk-selector']),
    dataEngine: 'v1',
  };
}

export const COMMANDS: Record<string, Command> = {
  'image ls': {
    usage: 'image ls',
    summary: 'list backing images',
    args: [0, 0],
    options: [],
    run: async (ctx) => {
      const list = await ctx.client.listBackingImages({ signal: ctx.io.signal });
      ctx.print(render(ctx.format, list, () => (list.length ? imageRows(list) : 'No backing images.\n')));
    },
  },
  'image get': {
    usage: 'image get NAME',
    summary: 'show a backing image with its copies',
    args: [1, 1],
    options: [],
    run: async (ctx, [name]) => {
      const bi = await ctx.client.getBackingImage(name, { signal: ctx.io.signal });
      // The events as `kubectl describe` lists them (a server without /v1/events: said so, not an error).
      const events = ctx.format === 'json' || ctx.format === 'yaml' ? undefined : await ctx.client.listEvents({ kind: 'BackingImage', name }, { signal: ctx.io.signal }).catch(() => undefined);
      ctx.print(render(ctx.format, bi, () => imageDetail(bi, events)));
    },
  },
  'image create': {
    usage: 'image create NAME (--url URL | --from-image IMAGE) [--checksum SUM] [--min-copies N] [--node-selector TAGS] [--disk-selector TAGS] [--wait]',
    summary: 'create a backing image from a URL or by cloning another one',
    args: [1, 1],
    options: ['url', 'from-image', ...CREATE_OPTS],
    run: async (ctx, [name]) => {
      const { v } = ctx;
      if (!!v.url === !!v['from-image']) throw new UsageError('give exactly one source: --url URL or --from-image IMAGE');
      if (v.url && !/^https?:\/\//i.test(v.url)) throw new UsageError(`--url must be an http:// or https:// URL, got "${v.url}"`);
      const req: Pick<CreateBackingImageRequest, 'sourceType' | 'parameters'> = v.url
        ? { sourceType: 'download', parameters: { url: v.url } }
        : { sourceType: 'clone', parameters: { 'backing-image': v['from-image'] as string, encryption: 'ignore' } };
      let bi = await ctx.client.createBackingImage(createRequest(v, name, req), { signal: ctx.io.signal });
      if (v.wait) bi = await waitReady(ctx, bi.name);
      ctx.print(render(ctx.format, bi, () => (v.wait ? `backing image ${bi.name} is ready (${describeCopies(summariseCopies(bi))})\n` : `backing image ${bi.name} created\n`)));
    },
  },
  'image upload': {
    usage: 'image upload NAME FILE [--checksum SUM] [--min-copies N] [--node-selector TAGS] [--disk-selector TAGS] [--wait]',
    summary: 'create a backing image from a local file (run it again to resume an interrupted upload)',
    args: [2, 2],
    options: CREATE_OPTS,
    run: async (ctx, [name, file]) => {
      const st = await stat(file).catch(() => undefined); // a file that cannot be stat'ed is reported just below
      if (!st?.isFile()) throw new UsageError(`${file} is not a readable file`);
      if (st.size === 0) throw new UsageError(`${file} is empty`);
      let existing: BackingImage | undefined;
      try {
        existing = await ctx.client.getBackingImage(name, { signal: ctx.io.signal });
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
      if (existing) {
        if (existing.sourceType !== 'upload') throw new CommandFailed(`backing image ${name} exists with source type ${existing.sourceType}; choose another name`);
        if (existing.currentChecksum) throw new CommandFailed(`backing image ${name} has already been uploaded`);
        failIfUploadFailed(existing);
        ctx.note(`resuming the upload of ${name}`);
      } else {
        await ctx.client.createBackingImage(createRequest(ctx.v, name, { sourceType: 'upload', parameters: {} }), { signal: ctx.io.signal });
      }
      const bar = new ProgressBar(ctx.io.stderr, name);
      let at = 0;
      try {
        await ctx.client.uploadBackingImage(name, await openAsBlob(file), {
          signal: ctx.io.signal,
          // an upload the server failed (e.g. its checksum check after the last byte) is not waited for
          failure: async () => {
            const now = await ctx.client.getBackingImage(name, { signal: ctx.io.signal }).catch(() => undefined);
            return now && uploadFailure(now);
          },
          onProgress: (p) => {
            at = p.offset;
            bar.bytes(p.offset, p.size, p.offset === p.size);
          },
        });
      } catch (err) {
        bar.done();
        if (err instanceof ApiClientError && err.kind === 'aborted') throw new CommandFailed(`upload interrupted at ${at} of ${st.size} bytes; run the same command again to resume`, Exit.interrupted);
        // The server may have failed the transfer meanwhile: say that rather than the last HTTP error.
        // If the status cannot be read either, the transfer error below is reported.
        const now = await ctx.client.getBackingImage(name, { signal: ctx.io.signal }).catch(() => undefined);
        if (now) failIfUploadFailed(now);
        throw err;
      }
      bar.done();
      const bi = ctx.v.wait ? await waitReady(ctx, name) : await ctx.client.getBackingImage(name, { signal: ctx.io.signal });
      failIfUploadFailed(bi); // e.g. the server's checksum check at the end of the transfer
      ctx.print(render(ctx.format, bi, () => `uploaded ${formatBytes(st.size)} to backing image ${name}${ctx.v.wait ? ` (${describeCopies(summariseCopies(bi))})` : ''}\n`));
    },
  },
  'image rm': {
    usage: 'image rm NAME... [--wait]',
    summary: 'delete backing images',
    args: [1, Infinity],
    options: ['wait', 'timeout'],
    run: async (ctx, names) => {
      for (const name of names) await ctx.client.deleteBackingImage(name, { signal: ctx.io.signal });
      if (ctx.v.wait) {
        const deadline = Date.now() + ctx.timeoutMs;
        for (const name of names) {
          for (;;) {
            try {
              await ctx.client.getBackingImage(name, { signal: ctx.io.signal });
            } catch (err) {
              if (isNotFound(err)) break;
              throw err;
            }
            if (Date.now() > deadline) throw new CommandFailed(`timed out waiting for backing image ${name} to be deleted`, Exit.timeout);
            await sleep(500, ctx.io.signal);
          }
        }
      }
      ctx.print(render(ctx.format, { deleted: names }, () => names.map((n) => `backing image ${n} ${ctx.v.wait ? 'deleted' : 'is being deleted'}\n`).join('')));
    },
  },
  'image cleanup': {
    usage: 'image cleanup NAME --disk DISK_UUID [--disk DISK_UUID]...',
    summary: 'remove the copies on the given disks',
    args: [1, 1],
    options: ['disk'],
    run: async (ctx, [name]) => {
      const disks = ctx.v.disk ?? [];
      if (!disks.length) throw new UsageError('give the disks to clean up with --disk DISK_UUID');
      // The API ignores a disk without a copy (Longhorn's behaviour): say so instead of claiming a clean-up.
      const current = await ctx.client.getBackingImage(name, { signal: ctx.io.signal });
      const copies = Object.keys(current.diskFileStatusMap ?? {});
      const unknown = disks.filter((d) => !copies.includes(d));
      if (unknown.length) {
        throw new CommandFailed(
          `backing image ${name} has no copy on disk${unknown.length > 1 ? 's' : ''} ${unknown.join(', ')}; its copies are on ${copies.length ? copies.join(', ') : 'no disk yet'} (disk UUIDs, see "bictl image get ${name}")`,
          Exit.notFound,
        );
      }
      const bi = await ctx.client.cleanupBackingImage(name, disks, { signal: ctx.io.signal });
      ctx.print(render(ctx.format, bi, () => `cleaning up ${disks.length} cop${disks.length > 1 ? 'ies' : 'y'} of backing image ${name}\n`));
    },
  },
  'image min-copies': {
    usage: 'image min-copies NAME N',
    summary: 'set the minimum number of copies',
    args: [2, 2],
    options: [],
    run: async (ctx, [name, n]) => {
      const bi = await ctx.client.updateMinNumberOfCopies(name, positiveInt(n, 'N'), { signal: ctx.io.signal });
      ctx.print(render(ctx.format, bi, () => `backing image ${name} now keeps at least ${bi.minNumberOfCopies} copies\n`));
    },
  },
  'image download': {
    usage: 'image download NAME FILE [--gzip]   (FILE "-" writes to stdout)',
    summary: 'download the image file, verifying its SHA-512 (the server sends it gzip-compressed; --gzip keeps that)',
    args: [2, 2],
    options: ['gzip'],
    run: async (ctx, [name, file]) => {
      if (file !== '-') await checkDestination(file);
      const bi = await ctx.client.getBackingImage(name, { signal: ctx.io.signal });
      // node:http rather than fetch: undici's body stream costs ~10x the CPU of the transfer on big files.
      const res = await httpGet(ctx.client.downloadUrl(name), ctx.io.signal, ctx.client.requestHeaders());
      // Longhorn's sync server sends the file gzip-compressed as `<name>.gz` (not as a Content-Encoding).
      const gzipped = /\.gz"?\s*(;|$)/i.test(String(res.headers['content-disposition'] ?? ''));
      const keepGzip = !!ctx.v.gzip;
      if (keepGzip && !gzipped) {
        res.destroy();
        throw new CommandFailed(`the server sent ${name} uncompressed; drop --gzip`);
      }
      const total = keepGzip ? Number(res.headers['content-length'] ?? -1) : bi.size || -1;
      const bar = new ProgressBar(ctx.io.stderr, name);
      const hash = createHash('sha512');
      let done = 0;
      const meter = new Transform({
        transform(chunk: Buffer, _enc, cb) {
          hash.update(chunk);
          done += chunk.length;
          bar.bytes(done, total);
          cb(null, chunk);
        },
      });
      const toStdout = file === '-';
      const part = `${file}.part`;
      const stages: (NodeJS.ReadableStream | NodeJS.WritableStream | NodeJS.ReadWriteStream)[] = [res];
      if (gzipped && !keepGzip) stages.push(createGunzip());
      stages.push(meter, toStdout ? ctx.io.stdout : createWriteStream(part));
      try {
        await pipeline(stages as unknown as [NodeJS.ReadableStream, NodeJS.WritableStream], { end: !toStdout, signal: ctx.io.signal });
        bar.bytes(done, total, true);
        bar.done();
        if (!keepGzip) {
          if (bi.size && done !== bi.size) throw new CommandFailed(`download of ${name} ended after ${done} of ${bi.size} bytes`);
          const sum = hash.digest('hex');
          if (bi.currentChecksum && sum !== bi.currentChecksum) throw new CommandFailed(`downloaded data of ${name} has SHA-512 ${sum}, expected ${bi.currentChecksum}`);
        }
        if (!toStdout) await rename(part, file);
      } catch (err) {
        bar.done();
        if (!toStdout) await rm(part, { force: true });
        throw err;
      }
      if (!toStdout) ctx.note(`downloaded ${formatBytes(done)} to ${file}${keepGzip ? ' (gzip, as served)' : ' (SHA-512 verified)'}`);
    },
  },
  'backup create': {
    usage: 'backup create IMAGE [--target TARGET] [--wait]',
    summary: 'back up a backing image to a backup target',
    args: [1, 1],
    options: ['target', 'wait', 'timeout'],
    run: async (ctx, [image]) => {
      const before = new Set((await ctx.client.listBackups({ signal: ctx.io.signal })).map((b) => b.name));
      await ctx.client.backupBackingImage(image, ctx.v.target, { signal: ctx.io.signal });
      const deadline = Date.now() + (ctx.v.wait ? ctx.timeoutMs : 10_000);
      const bar = new ProgressBar(ctx.io.stderr, image);
      let bk: BackupBackingImage | undefined;
      try {
        for (;;) {
          bk = (await ctx.client.listBackups({ signal: ctx.io.signal })).find((b) => b.backingImageName === image && !before.has(b.name)) ?? bk;
          if (bk && !ctx.v.wait) break;
          if (bk?.state === 'Completed') break;
          if (bk?.state === 'Error') throw new CommandFailed(`backup ${bk.name} failed: ${bk.error || 'unknown error'}`);
          if (bk) bar.percent(bk.progress, bk.state || 'Pending');
          if (Date.now() > deadline) {
            if (!bk) break;
            throw new CommandFailed(`timed out waiting for backup ${bk.name} (state ${bk.state || 'Pending'}, ${bk.progress}%)`, Exit.timeout);
          }
          await sleep(500, ctx.io.signal);
        }
      } finally {
        bar.done();
      }
      ctx.print(render(ctx.format, bk ?? { backingImage: image }, () => (bk ? `backup ${bk.name} of ${image} ${bk.state === 'Completed' ? 'completed' : 'started'}\n` : `backup of ${image} requested\n`)));
    },
  },
  'backup ls': {
    usage: 'backup ls',
    summary: 'list backups of backing images',
    args: [0, 0],
    options: [],
    run: async (ctx) => {
      const list = await ctx.client.listBackups({ signal: ctx.io.signal });
      ctx.print(render(ctx.format, list, () => (list.length ? backupRows(list) : 'No backups.\n')));
    },
  },
  'backup get': {
    usage: 'backup get NAME',
    summary: 'show a backup',
    args: [1, 1],
    options: [],
    run: async (ctx, [name]) => {
      const b = await ctx.client.getBackup(name, { signal: ctx.io.signal });
      ctx.print(render(ctx.format, b, () => backupRows([b])));
    },
  },
  'backup restore': {
    usage: 'backup restore NAME [--wait]',
    summary: 'create the backing image again from a backup',
    args: [1, 1],
    options: ['wait', 'timeout'],
    run: async (ctx, [name]) => {
      const b = await ctx.client.getBackup(name, { signal: ctx.io.signal });
      await ctx.client.restoreBackup(name, {}, { signal: ctx.io.signal });
      const bi = ctx.v.wait ? await waitReady(ctx, b.backingImageName) : undefined;
      ctx.print(render(ctx.format, bi ?? { backingImage: b.backingImageName, backup: name }, () => `backing image ${b.backingImageName} ${bi ? 'restored' : 'is being restored'} from ${name}\n`));
    },
  },
  'backup rm': {
    usage: 'backup rm NAME...',
    summary: 'delete backups (the data in the backup target too)',
    args: [1, Infinity],
    options: [],
    run: async (ctx, names) => {
      for (const n of names) await ctx.client.deleteBackup(n, { signal: ctx.io.signal });
      ctx.print(render(ctx.format, { deleted: names }, () => names.map((n) => `backup ${n} deleted\n`).join('')));
    },
  },
  'secret set': {
    usage: 'secret set NAME (KEY=VALUE... | --from-env-file FILE) [--from-file KEY=PATH]...',
    summary: 'create or replace a credential secret (values are never printed)',
    args: [1, Infinity],
    options: ['from-env-file', 'from-file'],
    run: async (ctx, [name, ...pairs]) => {
      const data = await secretData(ctx.v, pairs);
      const s = await ctx.client.putSecret(name, data, { signal: ctx.io.signal });
      ctx.print(render(ctx.format, { name: s.name, keys: s.keys }, () => `secret ${s.name} set (keys: ${(s.keys ?? []).join(', ')})\n`));
    },
  },
  'secret ls': {
    usage: 'secret ls',
    summary: 'list credential secrets and the names of their keys',
    args: [0, 0],
    options: [],
    run: async (ctx) => {
      const list = (await ctx.client.listSecrets({ signal: ctx.io.signal })).map((x) => ({ name: x.name, keys: x.keys ?? [] }));
      ctx.print(render(ctx.format, list, () => (list.length ? secretRows(list as SecretInfo[]) : 'No secrets.\n')));
    },
  },
  'secret rm': {
    usage: 'secret rm NAME...',
    summary: 'delete credential secrets',
    args: [1, Infinity],
    options: [],
    run: async (ctx, names) => {
      for (const n of names) await named('secret', n, ctx.client.deleteSecret(n, { signal: ctx.io.signal }));
      ctx.print(render(ctx.format, { deleted: names }, () => names.map((n) => `secret ${n} deleted\n`).join('')));
    },
  },
  'target ls': {
    usage: 'target ls',
    summary: 'list backup targets: URL, secret, poll interval, availability and message',
    args: [0, 0],
    options: [],
    run: async (ctx) => {
      const list = await ctx.client.listBackupTargets({ signal: ctx.io.signal });
      ctx.print(render(ctx.format, list, () => (list.length ? targetRows(list) : 'No backup targets.\n')));
    },
  },
  'target get': {
    usage: 'target get NAME',
    summary: 'show a backup target',
    args: [1, 1],
    options: [],
    run: async (ctx, [name]) => {
      const t = await named('backup target', name, ctx.client.getBackupTarget(name, { signal: ctx.io.signal }));
      ctx.print(render(ctx.format, t, () => targetDetail(t)));
    },
  },
  'target set': {
    usage: 'target set NAME [--url URL] [--secret SECRET] [--poll-interval DUR]   (--secret "" removes it)',
    summary: "change a backup target's URL, credential secret or poll interval",
    args: [1, 1],
    options: ['url', 'secret', 'poll-interval'],
    run: async (ctx, [name]) => {
      const { v } = ctx;
      const fields: BackupTargetUpdate = {};
      if (v.url !== undefined) fields.backupTargetURL = v.url;
      if (v.secret !== undefined) fields.credentialSecret = v.secret;
      if (v['poll-interval'] !== undefined) fields.pollInterval = v['poll-interval'];
      if (!Object.keys(fields).length) throw new UsageError('give at least one of --url, --secret, --poll-interval');
      await named('backup target', name, ctx.client.getBackupTarget(name, { signal: ctx.io.signal }));
      const t = await named('backup target', name, ctx.client.updateBackupTarget(name, fields, { signal: ctx.io.signal }));
      ctx.print(render(ctx.format, t, () => `backup target ${t.name} updated (${t.backupTargetURL || 'no URL'})\n`));
    },
  },
  'node ls': {
    usage: 'node ls',
    summary: 'list nodes and their disks',
    args: [0, 0],
    options: [],
    run: async (ctx) => {
      const list = await ctx.client.listNodes({ signal: ctx.io.signal });
      ctx.print(render(ctx.format, list, () => nodeRows(list)));
    },
  },
  'node evict': {
    usage: 'node evict NAME',
    summary: 'stop scheduling on a node and move its copies away',
    args: [1, 1],
    options: [],
    run: async (ctx, [name]) => {
      const n = await ctx.client.evictNode(name, { signal: ctx.io.signal });
      ctx.print(render(ctx.format, n, () => `eviction requested for node ${name}\n`));
    },
  },
};

export function helpText(): string {
  const w = Math.max(...Object.keys(COMMANDS).map((k) => k.length));
  return `${USAGE_HEADER}\nCommands:\n${Object.entries(COMMANDS)
    .map(([k, c]) => `  ${k.padEnd(w + 2)}${c.summary}`)
    .join('\n')}\n\nRun "bictl <group> <command> --help" for a command's arguments.\n`;
}

/** Runs one invocation; resolves the exit code. */
export async function run(argv: string[], io: Io, version: string): Promise<number> {
  let v: Values;
  let positionals: string[];
  try {
    const parsed = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
    v = parsed.values as Values;
    positionals = parsed.positionals;
  } catch (err) {
    io.stderr.write(`bictl: ${(err as Error).message}\nRun "bictl --help" for usage.\n`);
    return Exit.usage;
  }
  if (v.version) {
    io.stdout.write(`bictl ${version}\n`);
    return Exit.ok;
  }
  const key = positionals.slice(0, 2).join(' ');
  const cmd = COMMANDS[key];
  if (!cmd) {
    if (v.help || positionals.length === 0) {
      io.stdout.write(helpText());
      return v.help ? Exit.ok : Exit.usage;
    }
    io.stderr.write(`bictl: unknown command "${key}"\nRun "bictl --help" for the list of commands.\n`);
    return Exit.usage;
  }
  if (v.help) {
    io.stdout.write(`Usage: bictl ${cmd.usage}\n\n${cmd.summary}\n`);
    return Exit.ok;
  }
  const args = positionals.slice(2);
  const allowed = new Set<string>(['server', 'output', 'help', 'version', ...cmd.options]);
  try {
    for (const k of Object.keys(v)) if (!allowed.has(k)) throw new UsageError(`option --${k} does not apply to "bictl ${key}"`);
    if (args.length < cmd.args[0] || args.length > cmd.args[1]) throw new UsageError(`wrong number of arguments\nUsage: bictl ${cmd.usage}`);
    const format = (v.output ?? 'table') as OutputFormat;
    if (!['table', 'json', 'yaml'].includes(format)) throw new UsageError(`-o must be table, json or yaml, got "${v.output}"`);
    const server = v.server ?? io.env['BICTL_SERVER'] ?? 'http://127.0.0.1:9500';
    if (!/^https?:\/\/[^/]/i.test(server)) throw new UsageError(`--server must be an http(s) URL, got "${server}"`);
    const ctx: Ctx = {
      client: new BisClient({ server, token: io.env['BICTL_TOKEN'] || undefined }),
      io,
      v,
      format,
      timeoutMs: v.timeout ? parseDuration(v.timeout) : 600_000,
      print: (s) => io.stdout.write(s),
      note: (s) => io.stderr.write(`${s}\n`),
    };
    await cmd.run(ctx, args);
    return Exit.ok;
  } catch (err) {
    return reportError(err, io);
  }
}

/**
 * Refuses a download destination whose folder is missing, not a folder or not writable, before anything is fetched:
 * the message says what to do instead of a raw `ENOENT … x.part`.
 */
async function checkDestination(file: string): Promise<void> {
  const dir = path.dirname(path.resolve(file));
  let st;
  try {
    st = await stat(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
      throw new CommandFailed(`cannot save to ${file}: the folder ${dir} does not exist; create it (mkdir -p ${dir}) or give a path in an existing folder`);
    }
    throw err;
  }
  if (!st.isDirectory()) throw new CommandFailed(`cannot save to ${file}: ${dir} is not a folder; give a path in an existing folder`);
  try {
    await access(dir, fsConstants.W_OK);
  } catch {
    throw new CommandFailed(`cannot save to ${file}: the folder ${dir} is not writable by this user; give a path in a folder you can write to`);
  }
}

const FS_ERRORS: Record<string, (p: string) => string> = {
  ENOENT: (p) => `${p} does not exist (or its folder does not): check the path`,
  EACCES: (p) => `permission denied on ${p}: use a path this user can read or write`,
  EPERM: (p) => `operation not permitted on ${p}: use a path this user can read or write`,
  ENOSPC: (p) => `no space left on the device of ${p}: free some space or write elsewhere`,
  EROFS: (p) => `${p} is on a read-only file system: write elsewhere`,
  EISDIR: (p) => `${p} is a folder: give a file name`,
  ENOTDIR: (p) => `a part of ${p} is not a folder: check the path`,
};

/** A file-system error as a person reads it (what went wrong with which path, and what to do), else undefined. */
export function describeFsError(err: unknown): string | undefined {
  const e = err as NodeJS.ErrnoException;
  const f = e && typeof e.code === 'string' ? FS_ERRORS[e.code] : undefined;
  return f && e.path ? f(e.path) : undefined;
}

function reportError(err: unknown, io: Io): number {
  if (err instanceof UsageError) {
    io.stderr.write(`bictl: ${err.message}\n`);
    return Exit.usage;
  }
  if (err instanceof CommandFailed) {
    io.stderr.write(`bictl: ${err.message}\n`);
    return err.code;
  }
  if (err instanceof ApiClientError) {
    io.stderr.write(`bictl: ${err.message}\n`);
    if (err.status === 401) {
      io.stderr.write(`bictl: the API needs its bearer token: ${io.env['BICTL_TOKEN'] ? 'BICTL_TOKEN is not it' : 'set BICTL_TOKEN'}\n`);
    }
    switch (err.kind) {
      case 'not-found':
        return Exit.notFound;
      case 'timeout':
        return Exit.timeout;
      case 'network':
        return Exit.unreachable;
      case 'aborted':
        return Exit.interrupted;
      default:
        return Exit.failed;
    }
  }
  if (io.signal.aborted) {
    io.stderr.write('bictl: interrupted\n');
    return Exit.interrupted;
  }
  io.stderr.write(`bictl: ${describeFsError(err) ?? (err instanceof Error ? err.message : String(err))}\n`);
  return Exit.failed;
}
