import { createWriteStream, mkdirSync, type WriteStream } from 'node:fs';
import path from 'node:path';
import { Writable } from 'node:stream';
import { pino, destination as pinoDestination, multistream, stdTimeFunctions, type Level, type Logger as PinoLogger, type StreamEntry } from 'pino';
import pinoPretty from 'pino-pretty';

/** Structured fields of a log line (`image`, `disk`, `uuid`, `node`, `err`, ...). */
export type LogFields = Record<string, unknown>;

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';

/**
 * The logger every process uses: one JSON object per line with `level`, `time`, `component`, `msg` and the fields of
 * the line or of the child logger (`image`, `disk`, `uuid`, ...). The shape controllers rely on (`info(msg)` ...) plus
 * optional fields and child loggers.
 */
export interface Logger {
  debug(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
  /** A logger whose every line carries `bindings` too. */
  child(bindings: LogFields): Logger;
}

/** Where a logger writes: a terminal or pipe (stdout/stderr), a file (appended, created with its directory), or a stream. */
export type LogDestination = 'stdout' | 'stderr' | { file: string } | { stream: Writable };

export interface LogOutput {
  destination: LogDestination;
  /** Lowest level written to this output (default: the logger's level). */
  level?: LogLevel;
  /** `json` (default): one JSON object per line; `pretty`: pino-pretty's human-readable lines. */
  format?: 'json' | 'pretty';
  /** Colors in the pretty form (default: whether the destination is a terminal). */
  colorize?: boolean;
}

export interface CreateLoggerOptions {
  /** The process or part that logs (`controller-manager`, `backing-image-manager`, ...): the `component` field. */
  component: string;
  /** Lowest level logged (default `info`). */
  level?: LogLevel;
  /** Outputs (default: JSON lines on stderr). */
  outputs?: readonly LogOutput[];
  /** Fields on every line (e.g. `node`, `disk`). */
  bindings?: LogFields;
}

/** A root logger: also flushes and closes its file outputs. */
export interface RootLogger extends Logger {
  /** Waits until every line written so far reached its outputs; closes the files it opened. */
  close(): Promise<void>;
}

const LEVEL_RANK: Record<LogLevel, number> = { debug: 20, info: 30, warn: 40, error: 50 };

/** Field names whose values never reach a log line. */
export const REDACTED_FIELDS: readonly string[] = [
  'token',
  'password',
  'secret',
  'authorization',
  'accessKey',
  'secretKey',
  'AWS_SECRET_ACCESS_KEY',
  'AWS_ACCESS_KEY_ID',
  'CRYPTO_KEY_VALUE',
  'headers.authorization',
  '*.token',
  '*.password',
  '*.secret',
  '*.authorization',
  '*.AWS_SECRET_ACCESS_KEY',
  '*.AWS_ACCESS_KEY_ID',
  '*.CRYPTO_KEY_VALUE',
];

/**
 * Hides credentials that appear inside message text: a URL's password (`scheme://user:***@host`), bearer tokens,
 * and signature or token query parameters.
 */
export function redactText(text: string): string {
  return text
    .replace(/([a-z][a-z0-9+.-]*:\/\/[^/\s:@]*:)[^@\s/]+@/gi, '$1***@')
    .replace(/(bearer\s+)[A-Za-z0-9._~+/=-]{16,}/gi, '$1***')
    .replace(/([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|signature|token|access_token)=)[^&\s]+/gi, '$1***');
}

function wrap(p: PinoLogger): Logger {
  const at =
    (level: LogLevel) =>
    (msg: string, fields?: LogFields): void => {
      if (fields) p[level](fields, redactText(msg));
      else p[level](redactText(msg));
    };
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error'), child: (b) => wrap(p.child(b)) };
}

function isTerminal(d: LogDestination): boolean {
  if (d === 'stdout') return process.stdout.isTTY === true;
  if (d === 'stderr') return process.stderr.isTTY === true;
  return false;
}

/** Creates a root logger writing to `outputs`. */
export function createLogger(opts: CreateLoggerOptions): RootLogger {
  const level = opts.level ?? 'info';
  const outputs = opts.outputs?.length ? opts.outputs : [{ destination: 'stderr' as const }];
  const files: WriteStream[] = [];
  const streams: StreamEntry[] = outputs.map((o) => {
    let raw: Writable | number;
    // stdout and stderr are written synchronously: lines logged right before an exit are not lost.
    if (o.destination === 'stdout') raw = 1;
    else if (o.destination === 'stderr') raw = 2;
    else if ('file' in o.destination) {
      mkdirSync(path.dirname(o.destination.file), { recursive: true });
      const f = createWriteStream(o.destination.file, { flags: 'a' });
      files.push(f);
      raw = f;
    } else raw = o.destination.stream;
    const stream =
      o.format === 'pretty'
        ? pinoPretty({ destination: raw, colorize: o.colorize ?? isTerminal(o.destination), sync: true, translateTime: 'SYS:yyyy-mm-dd HH:MM:ss.l', ignore: 'pid,hostname,component', messageFormat: '{component}: {msg}' })
        : typeof raw === 'number'
          ? pinoDestination({ dest: raw, sync: true })
          : raw;
    return { stream, level: o.level ?? level };
  });
  const minLevel = outputs.reduce<LogLevel>((min, o) => (LEVEL_RANK[o.level ?? level] < LEVEL_RANK[min] ? (o.level ?? level) : min), level);
  const root = pino(
    {
      level: minLevel,
      base: { component: opts.component, ...(opts.bindings ?? {}) },
      timestamp: stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      redact: { paths: [...REDACTED_FIELDS], censor: '***' },
    },
    multistream(streams, { dedupe: false }),
  );
  const logger = wrap(root);
  let closed: Promise<void> | undefined;
  return {
    ...logger,
    close: () =>
      (closed ??= (async () => {
        await Promise.all(files.map((f) => new Promise<void>((r) => f.end(r))));
      })()),
  };
}

/** A logger that drops every line (tests, libraries used without one). */
export const silentLogger: Logger = { debug() {}, info() {}, warn() {}, error() {}, child: () => silentLogger };

/** Whether `level` names a log level. */
export function isLogLevel(level: string): level is LogLevel {
  return level in LEVEL_RANK;
}

export type { Level };

/** A stream that hands each complete line written to it to `onLine` (without its newline): logs into a callback. */
export function lineStream(onLine: (line: string) => void): Writable {
  let rest = '';
  return new Writable({
    write(chunk: Buffer | string, _enc, cb) {
      rest += chunk.toString();
      let i: number;
      while ((i = rest.indexOf('\n')) >= 0) {
        onLine(rest.slice(0, i));
        rest = rest.slice(i + 1);
      }
      cb();
    },
    final(cb) {
      if (rest) onLine(rest);
      rest = '';
      cb();
    },
  });
}

const TROUBLE = /\b(fail(ed|s|ure)?|refused|errors?|cannot|corrupt(ed)?|stall(ed)?|timed out|retry(ing)?)\b/i;

/**
 * A `(message) => void` log function (what the data-plane libraries take) writing to `logger`: a message that reports
 * trouble (failed, refused, error, cannot, corrupt, retrying, ...) at `warn`, any other at `info`.
 */
export function messageLog(logger: Logger): (message: string) => void {
  return (message) => (TROUBLE.test(message) ? logger.warn(message) : logger.info(message));
}
