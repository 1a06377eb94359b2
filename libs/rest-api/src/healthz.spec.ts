import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { EmbeddedDatastore } from '@bis/datastore';
import Fastify, { type FastifyInstance } from 'fastify';
import { promises as fsp } from 'node:fs';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { restAuthHook } from './auth.js';
import { controllersHealthCheck, registerHealthz, storeHealthCheck } from './healthz.js';

const NS = 'longhorn-system';

describe('GET /v1/healthz', () => {
  let dir: string;
  let store: EmbeddedDatastore;
  let app: FastifyInstance;
  let base: string;
  let running: boolean;
  let hang: boolean;
  let storeDown: boolean;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-healthz-'));
    store = await EmbeddedDatastore.open({ dataDir: dir });
    running = true;
    hang = false;
    storeDown = false;
    // The real store, with its API "unreachable" on request (as a Kubernetes API server can be).
    const flaky = new Proxy(store, {
      get: (target, prop, receiver) =>
        prop === 'list' && storeDown ? () => Promise.reject(new Error('connect ECONNREFUSED 127.0.0.1:6443')) : Reflect.get(target, prop, receiver),
    });
    app = Fastify();
    app.addHook('onRequest', restAuthHook('secret-token'));
    registerHealthz(app, {
      checks: [
        storeHealthCheck(flaky, NS),
        controllersHealthCheck(() => running),
        { name: 'slow', check: () => (hang ? new Promise<void>(() => undefined) : undefined) },
      ],
      timeoutMs: 300,
    });
    app.get('/v1/other', async () => ({ ok: true }));
    await app.listen({ host: '127.0.0.1', port: 0 });
    base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
  });
  afterEach(async () => {
    await app.close();
    await store.close().catch(() => undefined);
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('answers 200 with every check ok, without a token (the rest of /v1 needs one)', async () => {
    const res = await fetch(`${base}/v1/healthz`);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('application/json');
    expect(await res.json()).toEqual({ status: 'ok', checks: { store: 'ok', controllers: 'ok', slow: 'ok' } });
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    expect((await fetch(`${base}/v1/other`)).status).toBe(401);
  });

  it('answers 503 naming the failed part: controllers stopped, store unreachable, a check that does not answer', async () => {
    running = false;
    let res = await fetch(`${base}/v1/healthz`);
    expect(res.status).toBe(503);
    expect(await res.json()).toEqual({ status: 'unavailable', checks: { store: 'ok', controllers: 'controllers are not running', slow: 'ok' } });

    running = true;
    hang = true;
    res = await fetch(`${base}/v1/healthz`);
    expect(res.status).toBe(503);
    expect(((await res.json()) as { checks: Record<string, string> }).checks['slow']).toBe('no answer within 300 ms');

    hang = false;
    storeDown = true;
    res = await fetch(`${base}/v1/healthz`);
    expect(res.status).toBe(503);
    const body = (await res.json()) as { status: string; checks: Record<string, string> };
    expect(body.status).toBe('unavailable');
    expect(body.checks['store']).toBe('connect ECONNREFUSED 127.0.0.1:6443');
    expect(body.checks['controllers']).toBe('ok');

    storeDown = false;
    expect((await fetch(`${base}/v1/healthz`)).status).toBe(200);
  });
});
