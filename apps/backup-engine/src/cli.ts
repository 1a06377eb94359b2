import { parseArgs, type ParseArgsConfig } from 'node:util';
import {
  BackupStoreError,
  createBackup,
  deleteBackup,
  encodeBackupInfo,
  gcTarget,
  goIndentTabs,
  inspectBackup,
  listBackingImageBackups,
  LOCK_TIMING_ENV,
  lockTimingFromEnv,
  parseCompressionMethod,
  restoreBackup,
  verifyTarget,
  type BackupCredential,
  type LockTiming,
} from '@bis/backupstore';

/** Credential keys read from the environment (Longhorn's backup-target secret keys). */
export const CREDENTIAL_ENV_KEYS = [
  'AWS_ACCESS_KEY_ID',
  'AWS_SECRET_ACCESS_KEY',
  'AWS_SESSION_TOKEN',
  'AWS_ENDPOINTS',
  'AWS_CERT',
  'AWS_REGION',
  'VIRTUAL_HOSTED_STYLE',
  'HTTP_PROXY',
  'HTTPS_PROXY',
  'NO_PROXY',
] as const;

export const USAGE = `usage: backup-engine <command> [options]

commands:
  backup  --target <url> --name <name> --file <path> [--compression lz4|gzip|none] [--concurrency N]
          [--label k=v]... [--checksum <sha512>] [--secret s] [--secret-namespace ns]
  restore --backup-url <url> --output <file> [--root <dir>] [--concurrency N]
          --root confines --output to <dir> (relative to it, or an absolute path inside it; no "..", no link
          leading out of it)
  ls      --target <url>
  inspect --backup-url <url>
  rm      --backup-url <url>
  gc      --target <url> [--dry-run]
  verify  --target <url> [--concurrency N]

common options:
  --credential k=v   credential key (repeatable; overrides the environment: ${CREDENTIAL_ENV_KEYS.join(', ')})
  --json             print one JSON document on stdout
  -h, --help

environment:
  ${CREDENTIAL_ENV_KEYS.join(', ')}  credential keys
  ${Object.values(LOCK_TIMING_ENV).join(', ')}
      lock timing in milliseconds (test and operations knob; default Longhorn's 150000, 60000, 2000)

A backup URL is the target URL with ?backingImage=<name>. Targets: s3://bucket@region/path, nfs://server:/path, vfs:///path.
Exit status: 0 ok, 1 the operation failed, 2 usage error.`;

export class UsageError extends Error {}

export interface CliIo {
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream & { isTTY?: boolean; columns?: number };
  env: Readonly<Record<string, string | undefined>>;
  signal: AbortSignal;
}

const OPTIONS = {
  target: { type: 'string' },
  name: { type: 'string' },
  file: { type: 'string' },
  compression: { type: 'string' },
  concurrency: { type: 'string' },
  label: { type: 'string', multiple: true },
  checksum: { type: 'string' },
  secret: { type: 'string' },
  'secret-namespace': { type: 'string' },
  'backup-url': { type: 'string' },
  output: { type: 'string' },
  root: { type: 'string' },
  'dry-run': { type: 'boolean' },
  credential: { type: 'string', multiple: true },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const satisfies ParseArgsConfig['options'];

const ALLOWED: Record<string, readonly (keyof typeof OPTIONS)[]> = {
  backup: ['target', 'name', 'file', 'compression', 'concurrency', 'label', 'checksum', 'secret', 'secret-namespace'],
  restore: ['backup-url', 'output', 'root', 'concurrency'],
  ls: ['target'],
  inspect: ['backup-url'],
  rm: ['backup-url'],
  gc: ['target', 'dry-run'],
  verify: ['target', 'concurrency'],
};
const COMMON: readonly (keyof typeof OPTIONS)[] = ['credential', 'json', 'help'];

function keyValues(values: readonly string[] | undefined, what: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const v of values ?? []) {
    const eq = v.indexOf('=');
    if (eq <= 0) throw new UsageError(`invalid ${what} ${JSON.stringify(v)}: expected key=value with a non-empty key`);
    out[v.slice(0, eq)] = v.slice(eq + 1);
  }
  return out;
}

function required(value: string | undefined, flag: string): string {
  if (value === undefined || value === '') throw new UsageError(`missing --${flag}`);
  return value;
}

function concurrencyOf(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value) || Number(value) < 1) throw new UsageError(`invalid --concurrency ${JSON.stringify(value)}: a positive integer`);
  return Number(value);
}

/** A one-line progress bar redrawn on stderr (only used when stderr is a terminal). */
class ProgressBar {
  private lastDraw = 0;
  constructor(private readonly io: CliIo, private readonly label: string) {}
  update(done: number, total: number, force = false): void {
    const now = Date.now();
    if (!force && now - this.lastDraw < 100) return;
    this.lastDraw = now;
    const width = Math.max(10, Math.min(40, (this.io.stderr.columns ?? 80) - 50));
    const frac = total > 0 ? Math.min(1, done / total) : 1;
    const filled = Math.round(frac * width);
    const mib = (n: number) => (n / 1048576).toFixed(1);
    this.io.stderr.write(`\r${this.label} [${'#'.repeat(filled)}${'-'.repeat(width - filled)}] ${(frac * 100).toFixed(0).padStart(3)}% ${mib(done)}/${mib(total)} MiB`);
  }
  finish(): void {
    this.io.stderr.write('\n');
  }
}

/** Runs one command line; returns the exit status. */
export async function runCli(argv: readonly string[], io: CliIo): Promise<number> {
  const print = (s: string) => io.stdout.write(s.endsWith('\n') ? s : s + '\n');
  const [command, ...rest] = argv;
  if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
    print(USAGE);
    return command === undefined ? 2 : 0;
  }
  let values: ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: false; strict: true }>>['values'];
  try {
    const allowed = ALLOWED[command];
    if (!allowed) throw new UsageError(`unknown command ${JSON.stringify(command)}`);
    values = parseArgs({ args: [...rest], options: OPTIONS, allowPositionals: false, strict: true }).values;
    for (const k of Object.keys(values) as (keyof typeof OPTIONS)[]) {
      if (!allowed.includes(k) && !COMMON.includes(k)) throw new UsageError(`option --${k} does not apply to ${command}`);
    }
  } catch (err) {
    io.stderr.write(`backup-engine: ${(err as Error).message}\n\n${USAGE}\n`);
    return 2;
  }
  if (values.help) {
    print(USAGE);
    return 0;
  }
  const json = values.json === true;
  const tty = io.stderr.isTTY === true;
  try {
    const credential: BackupCredential = {
      ...Object.fromEntries(CREDENTIAL_ENV_KEYS.flatMap((k) => (io.env[k] !== undefined ? [[k, io.env[k] as string]] : []))),
      ...keyValues(values.credential, '--credential'),
    };
    let lockTiming: LockTiming | undefined;
    try {
      lockTiming = lockTimingFromEnv(io.env);
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    const common = { credential, signal: io.signal, ...(lockTiming ? { lockTiming } : {}) };
    const output = (doc: unknown, text: string) => print(json ? JSON.stringify(doc, null, 2) : text);
    switch (command) {
      case 'backup': {
        const compression = parseCompressionMethod(values.compression ?? 'lz4');
        const labels = values.label ? keyValues(values.label, '--label') : null;
        const opts = {
          target: required(values.target, 'target'),
          name: required(values.name, 'name'),
          filePath: required(values.file, 'file'),
        };
        const bar = tty ? new ProgressBar(io, `backup ${opts.name}`) : undefined;
        const result = await createBackup({
          ...opts, ...common, compression, labels, concurrency: concurrencyOf(values.concurrency),
          ...(values.checksum ? { checksum: values.checksum } : {}),
          secret: values.secret ?? '', secretNamespace: values['secret-namespace'] ?? '',
          onProgress: bar ? (p) => bar.update(p.processedBytes, p.totalBytes, p.progress === 100) : undefined,
        });
        bar?.finish();
        output(
          result,
          result.alreadyExisted
            ? `backup ${result.name} already exists: ${result.backupUrl}`
            : `backed up ${result.name}: ${result.backupUrl}\n  size ${result.size}, ${result.blockCount} blocks (${result.uploadedBlocks} uploaded, ${result.uploadedBytes} bytes stored; ${result.reusedBlocks} already in the store; ${result.zeroBlocks} all-zero skipped)\n  sha512 ${result.sha512}`,
        );
        return 0;
      }
      case 'restore': {
        const backupUrl = required(values['backup-url'], 'backup-url');
        const bar = tty ? new ProgressBar(io, 'restore') : undefined;
        const result = await restoreBackup({
          ...common, backupUrl, output: required(values.output, 'output'), root: values.root, concurrency: concurrencyOf(values.concurrency),
          onProgress: bar ? (p) => bar.update(p.processedBytes, p.totalBytes, p.progress === 100) : undefined,
        });
        bar?.finish();
        // the verified chain is for the programs that restore through the library (stored with the file); the CLI's
        // output stays a summary
        const { chain: _chain, ...summary } = result;
        output(summary, `restored ${result.name} to ${values.output}: ${result.size} bytes, sha512 ${result.sha512} (verified ${result.verification === 'sha512-chain' ? 'in parallel with the SHA-512 chain' : 'sequentially'})`);
        return 0;
      }
      case 'ls': {
        const entries = await listBackingImageBackups(required(values.target, 'target'), common);
        output(
          entries,
          entries.length === 0
            ? 'no backing image backups'
            : entries.map((e) => `${e.name}\t${e.state}\t${e.size ?? ''}\t${e.compressionMethod ?? ''}\t${e.completeTime ?? e.error ?? ''}`).join('\n'),
        );
        return 0;
      }
      case 'inspect': {
        const info = await inspectBackup(required(values['backup-url'], 'backup-url'), common);
        // Both forms print Longhorn's BackupInfo document (tab-indented, as `inspect-backing-image` does).
        print(goIndentTabs(encodeBackupInfo(info)));
        return 0;
      }
      case 'rm': {
        const r = await deleteBackup(required(values['backup-url'], 'backup-url'), common);
        output(
          r,
          `removed ${r.name}${r.configRemoved ? '' : ' (it had no config)'}; ${r.gc.swept ? `removed ${r.gc.removedBlocks.length} unreferenced blocks` : `blocks kept: ${r.gc.skippedReason}`}`,
        );
        return 0;
      }
      case 'gc': {
        const r = await gcTarget(required(values.target, 'target'), { ...common, dryRun: values['dry-run'] === true });
        output(
          r,
          r.swept
            ? `${r.dryRun ? 'would remove' : 'removed'} ${r.removedBlocks.length} of ${r.totalBlocks} blocks (${r.referencedBlocks} referenced)`
            : `garbage collection skipped: ${r.skippedReason}`,
        );
        return 0;
      }
      case 'verify': {
        const r = await verifyTarget(required(values.target, 'target'), { ...common, concurrency: concurrencyOf(values.concurrency) });
        const lines = [`${r.ok ? 'ok' : 'FAILED'}: ${r.backups} backups, ${r.checkedBlocks} blocks checked, ${r.problems.length} problems`];
        for (const p of r.problems) lines.push(`  ${p.problem} ${p.path} (used by ${p.backups.join(', ')}): ${p.detail}`);
        for (const s of r.skippedBackups) lines.push(`  skipped ${s.name}: ${s.reason}`);
        output(r, lines.join('\n'));
        return r.ok ? 0 : 1;
      }
    }
    return 2;
  } catch (err) {
    if (tty) io.stderr.write('\n');
    if (err instanceof UsageError) {
      io.stderr.write(`backup-engine: ${err.message}\n\n${USAGE}\n`);
      return 2;
    }
    const message = err instanceof Error ? err.message : String(err);
    const code = err instanceof BackupStoreError ? err.code : 'Error';
    if (json) print(JSON.stringify({ error: message, code }, null, 2));
    io.stderr.write(`backup-engine ${command}: ${message}\n`);
    return 1;
  }
}
