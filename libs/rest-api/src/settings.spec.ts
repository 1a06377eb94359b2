import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { EmbeddedDatastore } from '@bis/datastore';
import Fastify, { type FastifyInstance } from 'fastify';
import { promises as fsp } from 'node:fs';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { ApiRegistry, restApiPlugin } from './api.js';
import { SettingKind, SettingsService, settingsResource } from './settings.js';

const NS = 'longhorn-system';

describe('settings resource', () => {
  let dir: string;
  let store: EmbeddedDatastore;
  let app: FastifyInstance;
  beforeEach(async () => {
    dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-api-'));
    store = await EmbeddedDatastore.open({ dataDir: dir });
    const service = new SettingsService({ store, namespace: NS });
    app = Fastify();
    await app.register(restApiPlugin, { registry: new ApiRegistry().addResource(settingsResource(service)), defaultStreamPeriodMs: 50 });
  });
  afterEach(async () => {
    await app.close();
    await store.close();
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('lists every known setting with its definition, defaults when no CR exists', async () => {
    const r = await app.inject({ method: 'GET', url: '/v1/settings', headers: { host: 'm:9500' } });
    expect(r.statusCode).toBe(200);
    const body = r.json();
    expect(body.resourceType).toBe('setting');
    expect(body.createTypes).toEqual({});
    const names = body.data.map((s: { id: string }) => s.id);
    expect(names).toContain('backing-image-cleanup-wait-interval');
    expect([...names].sort()).toEqual(names);
    const s = body.data.find((x: { id: string }) => x.id === 'backing-image-cleanup-wait-interval');
    expect(s).toMatchObject({
      type: 'setting',
      name: 'backing-image-cleanup-wait-interval',
      value: '60',
      applied: false,
      links: { self: 'http://m:9500/v1/settings/backing-image-cleanup-wait-interval' },
      actions: {},
      definition: { type: 'int', default: '60', category: 'general', readOnly: false, required: true, valueIntRange: { min: 0 } },
    });
    const schema = (await app.inject({ method: 'GET', url: '/v1/schemas/setting' })).json();
    expect(schema.resourceMethods).toEqual(['GET', 'PUT']);
    expect(schema.collectionMethods).toEqual(['GET']);
  });

  it('PUT validates and stores the value in the datastore', async () => {
    const r = await app.inject({ method: 'PUT', url: '/v1/settings/backing-image-cleanup-wait-interval', payload: { value: '1' } });
    expect(r.statusCode).toBe(200);
    expect(r.json()).toMatchObject({ id: 'backing-image-cleanup-wait-interval', value: '1' });
    expect((await store.get(SettingKind, 'backing-image-cleanup-wait-interval', NS)).value).toBe('1');
    const again = await app.inject({ method: 'PUT', url: '/v1/settings/backing-image-cleanup-wait-interval', payload: { value: '2' } });
    expect(again.json().value).toBe('2');
    expect((await app.inject({ method: 'GET', url: '/v1/settings/backing-image-cleanup-wait-interval' })).json().value).toBe('2');
    const opt = await app.inject({ method: 'PUT', url: '/v1/settings/backup-compression-method', payload: { value: 'gzip' } });
    expect(opt.json().value).toBe('gzip');
  });

  it('rejects bad values with clear 500 errors (400 for a body of the wrong type) and unknown settings with 404', async () => {
    const cases: [string, unknown, number, RegExp][] = [
      ['default-min-number-of-backing-image-copies', { value: '0' }, 500, /invalid value for setting default-min-number-of-backing-image-copies: must be >= 1 \(got 0\)/],
      ['backing-image-cleanup-wait-interval', { value: 'ten' }, 500, /must be an integer/],
      ['backup-compression-method', { value: 'zip' }, 500, /must be one of "none", "lz4", "gzip"/],
      ['replica-file-sync-http-client-timeout', { value: '500' }, 500, /must be <= 120/],
      ['default-backing-image-manager-image', { value: 'x' }, 500, /setting default-backing-image-manager-image is read-only/],
      ['backing-image-cleanup-wait-interval', { value: 5 }, 400, /field "value" must be a string, got 5/],
      ['backing-image-cleanup-wait-interval', {}, 500, /field "value" is required and must be a string/],
      ['no-such-setting', { value: '1' }, 404, /setting no-such-setting not found/],
    ];
    for (const [name, payload, status, msg] of cases) {
      const r = await app.inject({ method: 'PUT', url: `/v1/settings/${name}`, payload: payload as object });
      expect({ name, status: r.statusCode }).toEqual({ name, status });
      expect(r.json()).toMatchObject({ type: 'error', status });
      expect(r.json().message).toMatch(msg);
    }
    const get = await app.inject({ method: 'GET', url: '/v1/settings/no-such-setting' });
    expect(get.statusCode).toBe(404);
    expect(get.json()).toMatchObject({ type: 'error', status: 404, code: 'Not Found' });
    const del = await app.inject({ method: 'DELETE', url: '/v1/settings/backing-image-cleanup-wait-interval' });
    expect(del.statusCode).toBe(405);
    // Nothing was written by the rejected requests.
    expect((await store.list(SettingKind, { namespace: NS })).items).toEqual([]);
  });

  it('ensureDefaults creates a CR per setting and keeps existing values', async () => {
    const service = new SettingsService({ store, namespace: NS });
    await service.set('backup-concurrent-limit', '4');
    await service.ensureDefaults();
    const { items } = await store.list(SettingKind, { namespace: NS });
    expect(items.find((i) => i.metadata.name === 'backup-concurrent-limit')?.value).toBe('4');
    expect(items.find((i) => i.metadata.name === 'backing-image-recovery-wait-interval')?.value).toBe('300');
    await service.set('default-backing-image-manager-image', 'bim:v1', { system: true });
    expect((await service.get('default-backing-image-manager-image'))?.value).toBe('bim:v1');
  });

  it('ensureDefaults with onError reports a refused setting and still creates the others', async () => {
    // A store that refuses empty values (as the 1.20 API server build of the tests does for custom resources).
    const refusing = new Proxy(store, {
      get(target, prop, receiver) {
        if (prop === 'create') {
          return async (kind: unknown, obj: { value?: string; metadata: { name: string } }) => {
            if (obj.value === '') throw Object.assign(new Error(`Setting ${obj.metadata.name} is invalid: value: Invalid value: "null"`), { reason: 'Invalid' });
            return (target.create as (k: unknown, o: unknown) => Promise<unknown>).call(target, kind, obj);
          };
        }
        return Reflect.get(target, prop, receiver) as unknown;
      },
    });
    const service = new SettingsService({ store: refusing, namespace: NS });
    await expect(service.ensureDefaults()).rejects.toThrow(/Invalid value/);
    const refused: string[] = [];
    await service.ensureDefaults({ 'default-backing-image-manager-image': 'bim:v2' }, (name, err) => refused.push(`${name}: ${err.message}`));
    expect(refused.length).toBeGreaterThan(0);
    expect(refused.every((r) => /Invalid value/.test(r))).toBe(true);
    expect(refused.some((r) => r.startsWith('default-backing-image-manager-image'))).toBe(false);
    const { items } = await store.list(SettingKind, { namespace: NS });
    expect(items.find((i) => i.metadata.name === 'default-backing-image-manager-image')?.value).toBe('bim:v2');
    expect(items.find((i) => i.metadata.name === 'backing-image-recovery-wait-interval')?.value).toBe('300');
    // A refused setting reads as its built-in default.
    const name = refused[0]!.split(':')[0]!;
    expect((await service.get(name))?.applied).toBe(false);
  });

  it('works over a real listening server, including the /v1/ws list stream', async () => {
    await app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = app.server.address() as AddressInfo;
    const base = `http://127.0.0.1:${port}`;
    const v1 = await fetch(`${base}/v1`);
    expect(v1.headers.get('x-api-schemas')).toBe(`${base}/v1/schemas`);
    const s = (await (await fetch(`${base}/v1/settings/backup-concurrent-limit`)).json()) as { value: string; links: { self: string } };
    expect(s.value).toBe('2');
    // The Python client updates through links.self.
    const put = await fetch(s.links.self, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ value: '3' }) });
    expect(put.status).toBe(200);
    expect(((await put.json()) as { value: string }).value).toBe('3');

    interface WsClient {
      on(ev: 'message', l: (data: Buffer) => void): void;
      on(ev: 'open' | 'close', l: () => void): void;
      on(ev: 'error', l: (e: Error) => void): void;
      close(): void;
    }
    const { default: WebSocket } = (await import('ws' as string)) as { default: new (url: string) => WsClient };
    const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/ws/100ms/settings`);
    const messages: { type: string; data: { id: string; value: string }[] }[] = [];
    let notify: (() => void) | undefined;
    ws.on('message', (d) => {
      messages.push(JSON.parse(d.toString()));
      notify?.();
    });
    const next = (count: number): Promise<void> =>
      new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`only ${messages.length} messages`)), 5000);
        const check = (): void => {
          if (messages.length >= count) {
            clearTimeout(t);
            notify = undefined;
            resolve();
          }
        };
        notify = check;
        check();
      });
    await next(1);
    expect(messages[0].type).toBe('collection');
    expect(messages[0].data.find((x) => x.id === 'backup-concurrent-limit')?.value).toBe('3');
    await fetch(s.links.self, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ value: '7' }) });
    await next(2);
    expect(messages[1].data.find((x) => x.id === 'backup-concurrent-limit')?.value).toBe('7');
    const closed = new Promise<void>((r) => ws.on('close', r));
    ws.close();
    await closed;
  });
});
