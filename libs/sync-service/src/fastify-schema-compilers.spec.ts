import { describe, it, expect } from '@jest/globals';
import Fastify, { type FastifyInstance } from 'fastify';
import { lazySchemaCompilers } from './fastify-schema-compilers.js';

async function listen(app: FastifyInstance): Promise<string> {
  return app.listen({ host: '127.0.0.1', port: 0 });
}

describe('lazySchemaCompilers', () => {
  it('validates and serializes routes with schemas exactly like fastify’s default compilers', async () => {
    const make = (lazy: boolean) => {
      const app = Fastify(lazy ? { schemaController: lazySchemaCompilers() } : {});
      app.post(
        '/x',
        {
          schema: {
            body: { type: 'object', required: ['n'], properties: { n: { type: 'integer', minimum: 1 } } },
            response: { 200: { type: 'object', properties: { n: { type: 'integer' } } } },
          },
        },
        async (req) => ({ n: (req.body as { n: number }).n, dropped: 'by the response schema' }),
      );
      return app;
    };
    for (const lazy of [false, true]) {
      const app = make(lazy);
      try {
        const url = `${await listen(app)}/x`;
        const post = (body: unknown) => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
        const ok = await post({ n: 2 });
        expect({ lazy, status: ok.status, body: await ok.text() }).toEqual({ lazy, status: 200, body: '{"n":2}' });
        const bad = await post({ n: 0 });
        expect({ lazy, status: bad.status, message: ((await bad.json()) as { message: string }).message }).toEqual({
          lazy,
          status: 400,
          message: 'body/n must be >= 1',
        });
      } finally {
        await app.close();
      }
    }
  });

  it('leaves routes without schemas working', async () => {
    const app = Fastify({ schemaController: lazySchemaCompilers() });
    app.get('/', async () => ({ ok: true }));
    try {
      const r = await fetch(`${await listen(app)}/`);
      expect(await r.json()).toEqual({ ok: true });
    } finally {
      await app.close();
    }
  });
});
