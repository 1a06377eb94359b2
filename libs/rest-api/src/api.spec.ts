import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import Fastify, { type FastifyInstance } from 'fastify';
import { ApiRegistry, parseGoDuration, restApiPlugin, type ApiResource } from './api.js';
import { ApiError } from './errors.js';
import { checkInput } from './schema.js';

interface Thing {
  name: string;
  size: number;
  tags: string[];
}

/** A small in-memory resource that exercises every framework feature. */
function thingRegistry(things: Map<string, Thing>): ApiRegistry {
  return new ApiRegistry()
    .addType({ id: 'resizeInput', resourceFields: { size: { type: 'int', min: 0 } } })
    .addResource<Thing>({
      schema: {
        id: 'thing',
        pluralName: 'things',
        collectionMethods: ['GET', 'POST'],
        resourceMethods: ['GET', 'DELETE'],
        resourceActions: { resize: { input: 'resizeInput', output: 'thing' }, poke: {} },
        resourceFields: {
          name: { type: 'string', required: true, unique: true, create: true },
          size: { type: 'int', create: true },
          tags: { type: 'array[string]', create: true },
          mode: { type: 'enum', options: ['a', 'b'], create: true },
        },
      },
      handlers: {
        id: (t) => t.name,
        toFields: (t) => ({ name: t.name, size: t.size, tags: t.tags }),
        list: async () => [...things.values()],
        get: async (_ctx, id) => things.get(id),
        create: async (_ctx, input) => {
          const t = { name: String(input.name ?? ''), size: Number(input.size ?? 0), tags: (input.tags as string[]) ?? [] };
          if (things.has(t.name)) throw new ApiError(500, `thing ${t.name} already exists`);
          things.set(t.name, t);
          return t;
        },
        delete: async (_ctx, id) => {
          if (!things.delete(id)) throw new ApiError(404, `thing ${id} not found`);
        },
        actions: {
          resize: async (_ctx, id, input) => {
            const t = things.get(id);
            if (!t) throw new ApiError(404, `thing ${id} not found`);
            t.size = input.size as number;
            return t;
          },
          poke: async () => undefined,
        },
      },
    });
}

describe('rest-api framework (fastify.inject)', () => {
  let app: FastifyInstance;
  let things: Map<string, Thing>;
  beforeEach(async () => {
    things = new Map([['b', { name: 'b', size: 2, tags: [] }], ['a', { name: 'a', size: 1, tags: ['x'] }]]);
    app = Fastify();
    await app.register(restApiPlugin, { registry: thingRegistry(things) });
    await app.ready();
  });
  afterEach(async () => {
    await app.close();
  });

  it('serves schemas with collection links, methods, actions and fields', async () => {
    const r = await app.inject({ method: 'GET', url: '/v1/schemas', headers: { host: 'api.local:9500' } });
    expect(r.statusCode).toBe(200);
    expect(r.headers['x-api-schemas']).toBe('http://api.local:9500/v1/schemas');
    const body = r.json();
    expect(body.type).toBe('collection');
    expect(body.resourceType).toBe('schema');
    const thing = body.data.find((s: { id: string }) => s.id === 'thing');
    expect(thing).toMatchObject({
      type: 'schema',
      pluralName: 'things',
      links: { self: 'http://api.local:9500/v1/schemas/thing', collection: 'http://api.local:9500/v1/things' },
      collectionMethods: ['GET', 'POST'],
      resourceMethods: ['GET', 'DELETE'],
      resourceActions: { resize: { input: 'resizeInput', output: 'thing' }, poke: {} },
    });
    expect(thing.resourceFields.name).toEqual({ type: 'string', required: true, unique: true, create: true });
    const input = body.data.find((s: { id: string }) => s.id === 'resizeInput');
    expect(input.links.collection).toBeUndefined();
    const one = await app.inject({ method: 'GET', url: '/v1/schemas/thing' });
    expect(one.json().id).toBe('thing');
    const missing = await app.inject({ method: 'GET', url: '/v1/schemas/nope' });
    expect(missing.statusCode).toBe(404);
    expect(missing.json()).toMatchObject({ type: 'error', status: 404, code: 'Not Found', message: 'schema nope not found', detail: '' });
  });

  it('GET /v1 links the schemas (what the Python client follows)', async () => {
    const r = await app.inject({ method: 'GET', url: '/v1', headers: { host: 'h:1' } });
    expect(r.headers['x-api-schemas']).toBe('http://h:1/v1/schemas');
    expect(r.json()).toMatchObject({ id: 'v1', type: 'apiVersion', links: { schemas: 'http://h:1/v1/schemas', things: 'http://h:1/v1/things' } });
  });

  it('lists a sorted collection with envelopes, createTypes and action links', async () => {
    const r = await app.inject({ method: 'GET', url: '/v1/things', headers: { host: 'h:1' } });
    const body = r.json();
    expect(body).toMatchObject({ type: 'collection', resourceType: 'thing', links: { self: 'http://h:1/v1/things' }, createTypes: { thing: 'http://h:1/v1/things' } });
    expect(body.data.map((d: ApiResource) => d.id)).toEqual(['a', 'b']);
    expect(body.data[0]).toEqual({
      id: 'a',
      type: 'thing',
      name: 'a',
      size: 1,
      tags: ['x'],
      links: { self: 'http://h:1/v1/things/a' },
      actions: { resize: 'http://h:1/v1/things/a?action=resize', poke: 'http://h:1/v1/things/a?action=poke' },
    });
  });

  it('serializes a list item by item into exactly the envelope JSON (content type, key order, empty list)', async () => {
    const r = await app.inject({ method: 'GET', url: '/v1/things', headers: { host: 'h:1' } });
    expect(r.statusCode).toBe(200);
    expect(r.headers['content-type']).toBe('application/json; charset=utf-8');
    expect(r.headers['x-api-schemas']).toBe('http://h:1/v1/schemas');
    const body = r.json();
    expect(Object.keys(body)).toEqual(['type', 'resourceType', 'links', 'createTypes', 'actions', 'data']);
    expect(r.body).toBe(JSON.stringify(body));
    const one = (await app.inject({ method: 'GET', url: '/v1/things/b', headers: { host: 'h:1' } })).json();
    expect(body.data[1]).toEqual(one);
    things.clear();
    const empty = await app.inject({ method: 'GET', url: '/v1/things', headers: { host: 'h:1' } });
    expect(empty.json()).toEqual({ ...body, data: [] });
  });

  it('builds links from X-API-request-url or X-Forwarded-* headers', async () => {
    const a = await app.inject({ method: 'GET', url: '/v1/things/a', headers: { 'x-api-request-url': 'https://lb.example:8443/v1/things/a' } });
    expect(a.json().links.self).toBe('https://lb.example:8443/v1/things/a');
    const b = await app.inject({ method: 'GET', url: '/v1/things/a', headers: { 'x-forwarded-proto': 'https', 'x-forwarded-host': 'proxy', 'x-forwarded-port': '9443' } });
    expect(b.json().links.self).toBe('https://proxy:9443/v1/things/a');
    expect(b.headers['x-api-schemas']).toBe('https://proxy:9443/v1/schemas');
  });

  it('creates, runs actions (output or empty 200), deletes with an empty 200', async () => {
    const c = await app.inject({ method: 'POST', url: '/v1/things', payload: { name: 'c', size: 3, tags: ['t'] } });
    expect(c.statusCode).toBe(200);
    expect(c.json()).toMatchObject({ id: 'c', type: 'thing', size: 3 });
    const resized = await app.inject({ method: 'POST', url: '/v1/things/c?action=resize', payload: { size: 10 } });
    expect(resized.json()).toMatchObject({ id: 'c', size: 10 });
    const poke = await app.inject({ method: 'POST', url: '/v1/things/c?action=poke' });
    expect(poke.statusCode).toBe(200);
    expect(poke.body).toBe('');
    const del = await app.inject({ method: 'DELETE', url: '/v1/things/c' });
    expect(del.statusCode).toBe(200);
    expect(del.body).toBe('');
    const gone = await app.inject({ method: 'GET', url: '/v1/things/c' });
    expect(gone.statusCode).toBe(404);
    expect(gone.json()).toMatchObject({ type: 'error', status: 404, code: 'Not Found', message: 'thing c not found' });
  });

  it('answers malformed input with 400 and refusals with 500 cattle errors, with clear messages', async () => {
    const badType = await app.inject({ method: 'POST', url: '/v1/things', payload: { name: 'd', size: 'big', tags: [1], mode: 'z' } });
    expect(badType.statusCode).toBe(400);
    expect(badType.json()).toMatchObject({ type: 'error', status: 400, code: 'Bad Request' });
    expect(badType.json().message).toBe(
      'invalid input for thing: field "size" must be an integer, got "big"; field "tags[0]" must be a string, got 1; field "mode" must be one of "a", "b", got "z"',
    );
    const badAction = await app.inject({ method: 'POST', url: '/v1/things/a?action=resize', payload: { size: -1 } });
    expect(badAction.statusCode).toBe(400);
    expect(badAction.json().message).toBe('invalid input for action resize: field "size" must be >= 0, got -1');
    for (const headers of [{ 'content-type': 'application/json' }, {}, { 'content-type': 'text/plain' }]) {
      const badJson = await app.inject({ method: 'POST', url: '/v1/things', headers, payload: '{"name":' });
      expect({ headers, status: badJson.statusCode }).toEqual({ headers, status: 400 });
      expect(badJson.json()).toMatchObject({ type: 'error', status: 400, code: 'Bad Request' });
      expect(badJson.json().message).toMatch(/^request body is not valid JSON: /);
    }
    const notObject = await app.inject({ method: 'POST', url: '/v1/things', payload: '[1]' });
    expect(notObject.statusCode).toBe(400);
    const tooLarge = await app.inject({ method: 'POST', url: '/v1/things', payload: JSON.stringify({ name: 'x'.repeat(2 << 20) }) });
    expect(tooLarge.statusCode).toBe(413);
    expect(tooLarge.json()).toMatchObject({ type: 'error', status: 413 });
    const dup = await app.inject({ method: 'POST', url: '/v1/things', payload: { name: 'a' } });
    expect(dup.statusCode).toBe(500);
    expect(dup.json().message).toBe('thing a already exists');
  });

  it('reads JSON bodies whatever their Content-Type, or without one (as Longhorn and its Python client)', async () => {
    for (const [i, headers] of [{}, { 'content-type': 'text/plain;charset=UTF-8' }, { 'content-type': 'application/x-www-form-urlencoded' }, { 'content-type': 'application/json; charset=utf-8' }].entries()) {
      const name = `ct${i}`;
      const r = await app.inject({ method: 'POST', url: '/v1/things', headers: { accept: 'application/json', ...headers }, payload: JSON.stringify({ name, size: 3 }) });
      expect({ headers, status: r.statusCode }).toEqual({ headers, status: 200 });
      expect(r.json()).toMatchObject({ id: name, type: 'thing', size: 3 });
    }
    const resized = await app.inject({ method: 'POST', url: '/v1/things/a?action=resize', payload: JSON.stringify({ size: 9 }) });
    expect(resized.statusCode).toBe(200);
  });

  it('unknown actions and methods get a plain 405 with an empty body; unknown paths a 404 error', async () => {
    const unknownAction = await app.inject({ method: 'POST', url: '/v1/things/a?action=explode' });
    expect(unknownAction.statusCode).toBe(405);
    expect(unknownAction.body).toBe('');
    expect(unknownAction.headers['content-type']).toMatch(/^text\/plain/);
    const put = await app.inject({ method: 'PUT', url: '/v1/things/a', payload: {} });
    expect(put.statusCode).toBe(405);
    const route = await app.inject({ method: 'GET', url: '/v1/nothing' });
    expect(route.statusCode).toBe(404);
    expect(route.json().type).toBe('error');
  });
});

describe('rest-api list rendering reused per object (renderDependsOnObjectOnly)', () => {
  it('renders an object once while it is the same object, again when it is replaced or the base URL differs', async () => {
    const rendered: string[] = [];
    const items: Thing[] = [
      { name: 'b', size: 2, tags: [] },
      { name: 'a', size: 1, tags: ['x'] },
    ];
    const registry = new ApiRegistry().addResource<Thing>({
      schema: { id: 'thing', pluralName: 'things', collectionMethods: ['GET'], resourceFields: { name: { type: 'string' }, size: { type: 'int' } } },
      handlers: {
        id: (t) => t.name,
        toFields: (t) => {
          rendered.push(t.name);
          return { name: t.name, size: t.size };
        },
        renderDependsOnObjectOnly: true,
        list: async () => [...items],
      },
    });
    const app = Fastify();
    await app.register(restApiPlugin, { registry });
    await app.ready();
    try {
      const list = async (host = 'api.local') => {
        const r = await app.inject({ method: 'GET', url: '/v1/things', headers: { host } });
        expect(r.statusCode).toBe(200);
        return r.json().data.map((d: { id: string; size: number; links: { self: string } }) => `${d.id}:${d.size}:${d.links.self}`);
      };
      expect(await list()).toEqual(['a:1:http://api.local/v1/things/a', 'b:2:http://api.local/v1/things/b']);
      expect(rendered.sort()).toEqual(['a', 'b']);
      rendered.length = 0;
      expect(await list()).toEqual(['a:1:http://api.local/v1/things/a', 'b:2:http://api.local/v1/things/b']);
      expect(rendered).toEqual([]);
      // a new version is a new object: only it is rendered again
      items[0] = { name: 'b', size: 3, tags: [] };
      expect(await list()).toEqual(['a:1:http://api.local/v1/things/a', 'b:3:http://api.local/v1/things/b']);
      expect(rendered).toEqual(['b']);
      rendered.length = 0;
      // links carry the base URL: another host renders again
      expect(await list('other.local:9500')).toEqual(['a:1:http://other.local:9500/v1/things/a', 'b:3:http://other.local:9500/v1/things/b']);
      expect(rendered.sort()).toEqual(['a', 'b']);
      rendered.length = 0;
      // an object gone, the others unchanged: the list is new (not the last body again)
      items.splice(1, 1);
      expect(await list('other.local:9500')).toEqual(['b:3:http://other.local:9500/v1/things/b']);
      expect(rendered).toEqual([]);
      // non-ASCII text is encoded once, as UTF-8, and the length is that of the bytes
      items.push({ name: 'ü-✓', size: 4, tags: [] });
      const r = await app.inject({ method: 'GET', url: '/v1/things', headers: { host: 'api.local' } });
      expect(Number(r.headers['content-length'])).toBe(r.rawPayload.length);
      expect(r.json().data.map((d: { id: string }) => d.id)).toEqual(['b', 'ü-✓']);
      expect(r.headers['content-type']).toBe('application/json; charset=utf-8');
    } finally {
      await app.close();
    }
  });
});

describe('helpers', () => {
  it('parses Go durations', () => {
    expect(parseGoDuration('1s')).toBe(1000);
    expect(parseGoDuration('500ms')).toBe(500);
    expect(parseGoDuration('1m30s')).toBe(90_000);
    expect(parseGoDuration('abc')).toBeUndefined();
    expect(parseGoDuration('5')).toBeUndefined();
  });
  it('checkInput checks maps and rejects non-object bodies', () => {
    const schema = { id: 'x', resourceFields: { parameters: { type: 'map[string]' } } };
    expect(checkInput(schema, { parameters: { url: 'http://x' } })).toEqual([]);
    expect(checkInput(schema, { parameters: { n: 1 } })).toEqual(['field "parameters.n" must be a string, got 1']);
    expect(checkInput(schema, [1])).toEqual(['request body must be a JSON object']);
  });
});
