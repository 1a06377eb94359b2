import type { FastifyInstance } from 'fastify';
import type { Datastore } from '@bis/datastore';
import { SettingKind } from './settings.js';

/** One part of the system the health endpoint reports on: `check` resolves when it is up and throws (or rejects) when not. */
export interface HealthCheck {
  name: string;
  check(): Promise<void> | void;
}

export interface HealthzOptions {
  checks: readonly HealthCheck[];
  /** A check that has not answered after this long counts as failed. Default 5000 ms. */
  timeoutMs?: number;
}

/** The body of `GET /v1/healthz`: `status` is `ok` when every check passed; each check's result is `ok` or its error. */
export interface HealthReport {
  status: 'ok' | 'unavailable';
  checks: Record<string, string>;
}

/** The health paths, answered without a token (see REST_OPEN_PATHS). */
export const HEALTHZ_PATHS = ['/v1/healthz', '/healthz'] as const;

async function runCheck(c: HealthCheck, timeoutMs: number): Promise<string> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      Promise.resolve().then(() => c.check()),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
      }),
    ]);
    return 'ok';
  } catch (err) {
    return (err as Error)?.message || String(err);
  } finally {
    if (timer) clearTimeout(timer);
  }
}

/** Runs every check in parallel and reports them. */
export async function healthReport(opts: HealthzOptions): Promise<HealthReport> {
  const timeoutMs = opts.timeoutMs ?? 5000;
  const results = await Promise.all(opts.checks.map(async (c) => [c.name, await runCheck(c, timeoutMs)] as const));
  const checks = Object.fromEntries(results);
  return { status: results.every(([, r]) => r === 'ok') ? 'ok' : 'unavailable', checks };
}

/**
 * Registers `GET /v1/healthz` (and `/healthz`): 200 with `{"status":"ok","checks":{...}}` when every check passes,
 * 503 with `{"status":"unavailable","checks":{name: error}}` otherwise. The chart's readiness and liveness probes
 * call it; it needs no token (REST_OPEN_PATHS) and reveals no data beyond which part is down.
 */
export function registerHealthz(app: FastifyInstance, opts: HealthzOptions): void {
  for (const url of HEALTHZ_PATHS) {
    app.get(url, async (_req, reply) => {
      const report = await healthReport(opts);
      return reply.code(report.status === 'ok' ? 200 : 503).header('cache-control', 'no-store').send(report);
    });
  }
}

/** The store answers: a list of the namespace's settings (the smallest kind every mode has). */
export function storeHealthCheck(store: Datastore, namespace: string): HealthCheck {
  return { name: 'store', check: async () => void (await store.list(SettingKind, { namespace })) };
}

/** The controllers run (started, informers synced, not stopped). */
export function controllersHealthCheck(running: () => boolean): HealthCheck {
  return {
    name: 'controllers',
    check: () => {
      if (!running()) throw new Error('controllers are not running');
    },
  };
}
