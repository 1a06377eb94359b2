/**
 * A small in-process stand-in of the backing-image REST API for the client's, the CLI's and the UI's tests: real
 * HTTP and websockets on loopback, real files in a temp dir, real downloads from the given URL and real SHA-512
 * checks, the cattle envelopes and Longhorn's error strings. It models one node with `disks` disks; copies move
 * through pending → in-progress → ready with progress, with a short step delay so a UI can watch them.
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdtemp, rm, copyFile, stat, unlink, appendFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGzip } from 'node:zlib';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import websocket from '@fastify/websocket';

export interface ApiDoubleOptions {
  disks?: number;
  /** Delay between the simulated steps of a copy (default 150 ms). */
  stepMs?: number;
  /** Directory of a static UI to serve at `/` (what the controller manager does with @bis/ui-server). */
  register?: (app: FastifyInstance) => Promise<void>;
}

export interface ApiDouble {
  url: string;
  app: FastifyInstance;
  dir: string;
  /** Disk UUIDs. */
  disks: string[];
  close(): Promise<void>;
}

interface FileStatus {
  state: string;
  progress: number;
  message: string;
  lastStateTransitionTime: string;
}

interface Image {
  name: string;
  uuid: string;
  sourceType: string;
  parameters: Record<string, string>;
  diskSelector: string[];
  nodeSelector: string[];
  minNumberOfCopies: number;
  expectedChecksum: string;
  dataEngine: string;
  secret: string;
  secretNamespace: string;
  size: number;
  virtualSize: number;
  currentChecksum: string;
  deletionTimestamp: string;
  files: Map<string, FileStatus>;
  /** Where the bytes are once the first copy exists. */
  path: string;
  upload?: { size: number; offset: number; hash: ReturnType<typeof createHash> };
}

interface Backup {
  name: string;
  backingImageName: string;
  backupTargetName: string;
  state: string;
  progress: number;
  error: string;
  url: string;
  created: string;
  size: number;
  checksum: string;
  path: string;
}

const NAME_RE = /^[a-z0-9][a-z0-9_.-]+$/;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export async function startApiDouble(opts: ApiDoubleOptions = {}): Promise<ApiDouble> {
  const dir = await mkdtemp(join(tmpdir(), 'bis-api-double-'));
  const stepMs = opts.stepMs ?? 150;
  const disks = Array.from({ length: opts.disks ?? 3 }, (_, i) => `disk-uuid-${i + 1}`);
  const images = new Map<string, Image>();
  const backups = new Map<string, Backup>();
  let version = 0;
  let closed = false;
  const changed = (): void => {
    version++;
  };
  const now = (): string => new Date().toISOString();
  const setFile = (img: Image, disk: string, state: string, progress: number, message = ''): void => {
    const prev = img.files.get(disk);
    img.files.set(disk, { state, progress, message, lastStateTransitionTime: prev && prev.state === state ? prev.lastStateTransitionTime : now() });
    changed();
  };

  const app = Fastify({ logger: false, bodyLimit: 1 << 30 });
  app.addContentTypeParser('application/octet-stream', (_req, payload, done) => done(null, payload));
  app.addContentTypeParser('multipart/form-data', (_req, payload, done) => done(null, payload));
  await app.register(websocket);
  app.setErrorHandler((err: Error & { statusCode?: number }, req, reply) => {
    const status = err instanceof HttpError ? err.status : (err.statusCode ?? 500);
    void reply.status(status).send({ type: 'error', status, code: status === 404 ? 'Not Found' : 'Internal Server Error', message: err.message, detail: '', links: { self: req.url }, actions: {} });
  });

  const base = (req: FastifyRequest): string => `http://${req.headers.host}`;
  const renderImage = (img: Image, b: string): Record<string, unknown> => {
    const self = `${b}/v1/backingimages/${img.name}`;
    return {
      id: img.name,
      type: 'backingImage',
      links: { self },
      actions: Object.fromEntries(['backingImageCleanup', 'upload', 'backupBackingImageCreate', 'updateMinNumberOfCopies'].map((a) => [a, `${self}?action=${a}`])),
      name: img.name,
      uuid: img.uuid,
      sourceType: img.sourceType,
      parameters: img.parameters,
      diskSelector: img.diskSelector,
      nodeSelector: img.nodeSelector,
      minNumberOfCopies: img.minNumberOfCopies,
      expectedChecksum: img.expectedChecksum,
      dataEngine: img.dataEngine,
      diskFileStatusMap: Object.fromEntries([...img.files].map(([k, v]) => [k, { dataEngine: 'v1', ...v }])),
      size: img.size,
      virtualSize: img.virtualSize,
      currentChecksum: img.currentChecksum,
      secret: img.secret,
      secretNamespace: img.secretNamespace,
      deletionTimestamp: img.deletionTimestamp,
    };
  };
  const renderBackup = (bk: Backup, b: string): Record<string, unknown> => {
    const self = `${b}/v1/backupbackingimages/${bk.name}`;
    return {
      id: bk.name,
      type: 'backupBackingImage',
      links: { self },
      actions: { backupBackingImageRestore: `${self}?action=backupBackingImageRestore` },
      name: bk.name,
      state: bk.state,
      progress: bk.progress,
      error: bk.error,
      url: bk.url,
      created: bk.created,
      size: bk.size,
      labels: {},
      messages: {},
      compressionMethod: 'lz4',
      secret: '',
      secretNamespace: '',
      backingImageName: bk.backingImageName,
      backupTargetName: bk.backupTargetName,
    };
  };
  const collection = (type: string, b: string, seg: string, data: Record<string, unknown>[]): Record<string, unknown> => ({
    type: 'collection',
    resourceType: type,
    links: { self: `${b}/v1/${seg}` },
    data: data.sort((x, y) => String(x['id']).localeCompare(String(y['id']))),
  });
  const imageOr404 = (name: string): Image => {
    const img = images.get(name);
    if (!img) throw new HttpError(404, `backingimages.longhorn.io "${name}" not found`);
    return img;
  };

  /** Checks the finished first file against the expected checksum, then replicates it. */
  const finishFirstCopy = async (img: Image, disk: string, sha512: string, other?: { algo: string; hex: string; actual: string }): Promise<void> => {
    const st = await stat(img.path);
    const expected = img.expectedChecksum;
    const mismatch = other ? other.hex !== other.actual : expected && expected !== sha512;
    if (mismatch) {
      setFile(img, disk, 'failed', 0, `the expected checksum ${other ? other.hex : expected} doesn't match the file actual checksum ${other ? other.actual : sha512}`);
      return;
    }
    img.size = st.size;
    img.virtualSize = st.size;
    img.currentChecksum = sha512;
    setFile(img, disk, 'ready', 100);
    for (const d of disks.filter((x) => x !== disk).slice(0, Math.max(0, img.minNumberOfCopies - 1))) void replicate(img, d);
  };
  const replicate = async (img: Image, disk: string): Promise<void> => {
    for (const p of [0, 50]) {
      if (closed || !images.has(img.name)) return;
      setFile(img, disk, p === 0 ? 'pending' : 'in-progress', p);
      await sleep(stepMs);
    }
    if (images.has(img.name) && img.files.has(disk)) setFile(img, disk, 'ready', 100);
  };

  const hashesFor = (expected: string): { algo: string; hex: string } | undefined => {
    const m = /^(sha256|sha1|md5):([0-9a-f]+)$/.exec(expected);
    return m ? { algo: m[1], hex: m[2] } : undefined;
  };

  const produceFromStream = async (img: Image, disk: string, body: Readable, total: number): Promise<void> => {
    const sha = createHash('sha512');
    const alt = hashesFor(img.expectedChecksum);
    const altHash = alt ? createHash(alt.algo) : undefined;
    let done = 0;
    setFile(img, disk, 'in-progress', 0);
    await pipeline(
      body,
      async function* (src: AsyncIterable<Buffer>) {
        for await (const chunk of src) {
          sha.update(chunk);
          altHash?.update(chunk);
          done += chunk.length;
          if (total > 0) setFile(img, disk, 'in-progress', Math.min(99, Math.floor((done * 100) / total)));
          yield chunk;
        }
      },
      createWriteStream(img.path),
    );
    await sleep(stepMs);
    await finishFirstCopy(img, disk, sha.digest('hex'), alt && altHash ? { ...alt, actual: altHash.digest('hex') } : undefined);
  };

  const startSource = async (img: Image): Promise<void> => {
    const disk = disks[0];
    setFile(img, disk, 'pending', 0);
    await sleep(stepMs);
    if (!images.has(img.name)) return;
    try {
      switch (img.sourceType) {
        case 'download': {
          const res = await fetch(img.parameters['url']);
          if (!res.ok || !res.body) throw new Error(`expected status code 200 from ${img.parameters['url']}, got ${res.status}`);
          await produceFromStream(img, disk, Readable.fromWeb(res.body as import('node:stream/web').ReadableStream), Number(res.headers.get('content-length') ?? -1));
          return;
        }
        case 'upload':
          return; // waits in `pending` for the upload requests
        case 'clone': {
          const src = imageOr404(img.parameters['backing-image']);
          await produceFromStream(img, disk, createReadStream(src.path), src.size);
          return;
        }
        case 'restore': {
          const bk = [...backups.values()].find((b) => b.url === img.parameters['backup-url']);
          if (!bk) throw new Error(`backup ${img.parameters['backup-url']} not found`);
          await produceFromStream(img, disk, createReadStream(bk.path), bk.size);
          return;
        }
        default:
          throw new Error(`source type ${img.sourceType} is not available`);
      }
    } catch (err) {
      setFile(img, disk, 'failed', 0, (err as Error).message);
    }
  };

  // ---- backing images ----
  app.get('/v1/backingimages', async (req) => collection('backingImage', base(req), 'backingimages', [...images.values()].map((i) => renderImage(i, base(req)))));
  app.get<{ Params: { name: string } }>('/v1/backingimages/:name', async (req) => renderImage(imageOr404(req.params.name), base(req)));
  app.post<{ Body: Record<string, unknown> }>('/v1/backingimages', async (req) => {
    const b = (req.body ?? {}) as Record<string, unknown>;
    const name = String(b['name'] ?? '').toLowerCase();
    if (!NAME_RE.test(name)) throw new HttpError(500, `invalid name ${JSON.stringify(b['name'] ?? '')}: must match ^[a-z0-9][a-z0-9_.-]+$`);
    if (images.has(name)) throw new HttpError(500, `backingimages.longhorn.io "${name}" already exists`);
    const sourceType = String(b['sourceType'] ?? '');
    if (!['download', 'upload', 'clone', 'restore', 'export-from-volume'].includes(sourceType)) throw new HttpError(500, `spec.sourceType: Unsupported value: "${sourceType}"`);
    const parameters = (b['parameters'] ?? {}) as Record<string, string>;
    if (sourceType === 'download' && !parameters['url']) throw new HttpError(500, 'invalid parameter: url is required for source type download');
    if (sourceType === 'clone' && !images.has(parameters['backing-image'] ?? '')) throw new HttpError(500, `cannot find the source backing image ${parameters['backing-image'] ?? ''}`);
    if (sourceType === 'export-from-volume') throw new HttpError(500, `volume ${parameters['volume-name'] ?? ''} not found`);
    const checksum = String(b['expectedChecksum'] ?? '').trim();
    if (checksum && !/^[0-9a-f]{128}$/.test(checksum) && !hashesFor(checksum)) throw new HttpError(500, `invalid checksum ${checksum}`);
    const min = Number(b['minNumberOfCopies'] ?? 0) || 1;
    if (min < 1) throw new HttpError(500, `minimum number of backing image copies ${min} must larger than 0`);
    const img: Image = {
      name,
      uuid: randomUUID().slice(0, 8),
      sourceType,
      parameters,
      diskSelector: (b['diskSelector'] as string[]) ?? [],
      nodeSelector: (b['nodeSelector'] as string[]) ?? [],
      minNumberOfCopies: min,
      expectedChecksum: checksum,
      dataEngine: String(b['dataEngine'] ?? 'v1') || 'v1',
      secret: String(b['secret'] ?? ''),
      secretNamespace: String(b['secretNamespace'] ?? ''),
      size: 0,
      virtualSize: 0,
      currentChecksum: '',
      deletionTimestamp: '',
      files: new Map(),
      path: join(dir, `${name}-${randomBytes(4).toString('hex')}`),
    };
    images.set(name, img);
    changed();
    const rendered = renderImage(img, base(req));
    void startSource(img);
    return rendered;
  });
  app.delete<{ Params: { name: string } }>('/v1/backingimages/:name', async (req, reply) => {
    const img = imageOr404(req.params.name);
    img.deletionTimestamp = new Date().toString();
    changed();
    setTimeout(() => {
      images.delete(img.name);
      changed();
      void unlink(img.path).catch(() => undefined);
    }, stepMs * 2);
    return reply.send('');
  });
  app.post<{ Params: { name: string }; Querystring: Record<string, string> }>('/v1/backingimages/:name', async (req, reply) => {
    const img = imageOr404(req.params.name);
    const q = req.query;
    const body = (req.body ?? {}) as Record<string, unknown>;
    switch (q['action']) {
      case 'backingImageCleanup': {
        const requested = ((body['disks'] as string[]) ?? []).filter((d) => img.files.has(d));
        const readyLeft = [...img.files].filter(([d, f]) => !requested.includes(d) && f.state === 'ready').length;
        if (readyLeft < img.minNumberOfCopies) throw new HttpError(500, 'failed to do cleanup since there will be no enough ready files for HA after the deletion');
        for (const d of requested) img.files.delete(d);
        changed();
        return renderImage(img, base(req));
      }
      case 'updateMinNumberOfCopies': {
        const n = Number(body['minNumberOfCopies']);
        if (!Number.isInteger(n) || n < 1) throw new HttpError(500, `minimum number of backing image copies ${body['minNumberOfCopies']} must larger than 0`);
        img.minNumberOfCopies = n;
        const have = img.files.size;
        if (img.currentChecksum) for (const d of disks.filter((x) => !img.files.has(x)).slice(0, Math.max(0, n - have))) void replicate(img, d);
        changed();
        return renderImage(img, base(req));
      }
      case 'backupBackingImageCreate': {
        if (!img.currentChecksum) throw new HttpError(500, `backing image ${img.name} has no ready file to back up`);
        const name = `${img.name}-${randomBytes(4).toString('hex')}`;
        const bk: Backup = {
          name,
          backingImageName: img.name,
          backupTargetName: String(body['backupTargetName'] ?? '') || 'default',
          state: 'InProgress',
          progress: 0,
          error: '',
          url: `vfs:///backupstore?backingImage=${img.name}`,
          created: '',
          size: img.size,
          checksum: img.currentChecksum,
          path: join(dir, `backup-${name}`),
        };
        backups.set(name, bk);
        changed();
        void (async () => {
          await sleep(stepMs);
          await copyFile(img.path, bk.path);
          bk.progress = 100;
          bk.state = 'Completed';
          bk.created = now();
          changed();
        })();
        return reply.send('');
      }
      case 'uploadOffset': {
        if (img.sourceType !== 'upload' || img.files.get(disks[0])?.state !== 'pending' && !img.upload) throw new HttpError(500, `upload server for backing image ${img.name} has not been initiated`);
        return { size: img.upload?.size ?? 0, offset: img.upload?.offset ?? 0 };
      }
      case 'uploadPart':
      case 'upload': {
        if (img.sourceType !== 'upload') throw new HttpError(400, `cannot do upload since data source type is ${img.sourceType} rather than upload`);
        const size = Number(q['size']);
        const offset = q['action'] === 'upload' ? 0 : Number(q['offset']);
        if (!Number.isInteger(size) || size <= 0) throw new HttpError(400, 'invalid size');
        if (!img.upload) {
          img.upload = { size, offset: 0, hash: createHash('sha512') };
          setFile(img, disks[0], 'in-progress', 0);
        }
        const up = img.upload;
        if (offset !== up.offset) throw new HttpError(409, `upload offset ${offset} does not match the expected offset ${up.offset}`);
        const src = req.body as Readable;
        for await (const chunk of src as AsyncIterable<Buffer>) {
          if (up.offset + chunk.length > up.size) throw new HttpError(400, `more than ${up.size} bytes uploaded`);
          up.hash.update(chunk);
          await appendFile(img.path, chunk);
          up.offset += chunk.length;
          setFile(img, disks[0], 'in-progress', Math.floor((up.offset * 100) / up.size));
        }
        if (up.offset === up.size) {
          await finishFirstCopy(img, disks[0], up.hash.digest('hex'));
        }
        return { size: up.size, offset: up.offset };
      }
      default:
        return reply.status(405).type('text/plain').send('');
    }
  });
  app.get<{ Params: { name: string } }>('/v1/backingimages/:name/download', async (req, reply) => {
    const img = imageOr404(req.params.name);
    if (![...img.files.values()].some((f) => f.state === 'ready')) throw new HttpError(500, `backing image ${img.name} has no ready copy to download yet (copies: ${[...img.files].map(([d, f]) => `disk ${d} ${f.state}`).join('; ') || 'none yet'})`);
    // Like Longhorn's sync server: the file gzip-compressed, named `<name>.gz`, chunked.
    return reply.header('content-type', 'application/octet-stream').header('content-disposition', `attachment; filename=${img.name}.gz`).send(createReadStream(img.path).pipe(createGzip({ level: 1 })));
  });

  // ---- backups, targets, nodes, settings ----
  app.get('/v1/backupbackingimages', async (req) => collection('backupBackingImage', base(req), 'backupbackingimages', [...backups.values()].map((b) => renderBackup(b, base(req)))));
  app.get<{ Params: { name: string } }>('/v1/backupbackingimages/:name', async (req) => {
    const bk = backups.get(req.params.name);
    if (!bk) throw new HttpError(404, `backupbackingimages.longhorn.io "${req.params.name}" not found`);
    return renderBackup(bk, base(req));
  });
  app.delete<{ Params: { name: string } }>('/v1/backupbackingimages/:name', async (req, reply) => {
    const bk = backups.get(req.params.name);
    if (!bk) throw new HttpError(404, `backupbackingimages.longhorn.io "${req.params.name}" not found`);
    backups.delete(bk.name);
    changed();
    await unlink(bk.path).catch(() => undefined);
    return reply.send('');
  });
  app.post<{ Params: { name: string }; Querystring: Record<string, string> }>('/v1/backupbackingimages/:name', async (req, reply) => {
    const bk = backups.get(req.params.name);
    if (!bk) throw new HttpError(404, `backupbackingimages.longhorn.io "${req.params.name}" not found`);
    if (req.query['action'] !== 'backupBackingImageRestore') return reply.status(405).send('');
    if (images.has(bk.backingImageName)) throw new HttpError(500, `backing image ${bk.backingImageName} already exists`);
    const img: Image = {
      name: bk.backingImageName,
      uuid: randomUUID().slice(0, 8),
      sourceType: 'restore',
      parameters: { 'backup-url': bk.url, 'backup-target-name': bk.backupTargetName, 'concurrent-limit': '2' },
      diskSelector: [],
      nodeSelector: [],
      minNumberOfCopies: 1,
      expectedChecksum: bk.checksum,
      dataEngine: 'v1',
      secret: '',
      secretNamespace: '',
      size: 0,
      virtualSize: 0,
      currentChecksum: '',
      deletionTimestamp: '',
      files: new Map(),
      path: join(dir, `${bk.backingImageName}-${randomBytes(4).toString('hex')}`),
    };
    images.set(img.name, img);
    changed();
    void startSource(img);
    return reply.send('');
  });
  app.get('/v1/backuptargets', async (req) =>
    collection('backupTarget', base(req), 'backuptargets', [
      { id: 'default', type: 'backupTarget', links: { self: `${base(req)}/v1/backuptargets/default` }, actions: {}, name: 'default', backupTargetURL: 'vfs:///backupstore', available: true, message: '', pollInterval: '5m0s' },
    ]),
  );
  const node = (b: string): Record<string, unknown> => ({
    id: 'node-1',
    type: 'node',
    links: { self: `${b}/v1/nodes/node-1` },
    actions: {},
    name: 'node-1',
    address: '127.0.0.1',
    allowScheduling: nodeState.allowScheduling,
    evictionRequested: nodeState.evictionRequested,
    tags: [],
    disks: Object.fromEntries(disks.map((u, i) => [`disk-${i + 1}`, { path: join(dir, `disk-${i + 1}`), diskUUID: u, allowScheduling: true, evictionRequested: false, storageAvailable: 10 * 2 ** 30, storageMaximum: 20 * 2 ** 30, tags: [], scrub: scrubOf(i) }])),
  });
  const nodeState = { allowScheduling: true, evictionRequested: false };
  // the disks' last scrubs: the first clean 2 hours ago, the second found a corrupt copy 5 minutes ago, the others none yet
  const scrubOf = (i: number): Record<string, unknown> | null => {
    const ago = (ms: number) => new Date(Date.now() - ms).toISOString();
    if (i === 0) return { lastScrubTime: ago(2 * 3600_000 + 60_000), lastScrubResult: 'ok', lastScrubMessage: '', lastScrubFiles: 2, scrubbing: '' };
    if (i === 1) return { lastScrubTime: ago(5 * 60_000 + 5_000), lastScrubResult: 'corrupted', lastScrubMessage: 'base: SHA-512 chain mismatch in segment 3', lastScrubFiles: 1, scrubbing: '' };
    return null;
  };
  app.get('/v1/nodes', async (req) => collection('node', base(req), 'nodes', [node(base(req))]));
  app.get<{ Params: { name: string } }>('/v1/nodes/:name', async (req) => {
    if (req.params.name !== 'node-1') throw new HttpError(404, `nodes.longhorn.io "${req.params.name}" not found`);
    return node(base(req));
  });
  app.put<{ Params: { name: string } }>('/v1/nodes/:name', async (req) => {
    if (req.params.name !== 'node-1') throw new HttpError(404, `nodes.longhorn.io "${req.params.name}" not found`);
    const b = (req.body ?? {}) as Record<string, unknown>;
    if (typeof b['allowScheduling'] === 'boolean') nodeState.allowScheduling = b['allowScheduling'];
    if (typeof b['evictionRequested'] === 'boolean') nodeState.evictionRequested = b['evictionRequested'];
    return node(base(req));
  });

  // ---- websocket list streams ----
  const stream = (render: (b: string) => unknown) => (socket: { send(s: string): void; on(e: string, f: () => void): void; readyState: number }, req: FastifyRequest) => {
    let last = '';
    let seen = -1;
    const tick = (): void => {
      if (seen === version) return;
      seen = version;
      const text = JSON.stringify(render(base(req)));
      if (text !== last && socket.readyState === 1) {
        last = text;
        socket.send(text);
      }
    };
    tick();
    const t = setInterval(tick, 100);
    socket.on('close', () => clearInterval(t));
  };
  const biList = (b: string): unknown => collection('backingImage', b, 'backingimages', [...images.values()].map((i) => renderImage(i, b)));
  const bkList = (b: string): unknown => collection('backupBackingImage', b, 'backupbackingimages', [...backups.values()].map((x) => renderBackup(x, b)));
  for (const [seg, render] of [['backingimages', biList], ['backupbackingimages', bkList]] as const) {
    app.get(`/v1/ws/${seg}`, { websocket: true }, stream(render) as never);
    app.get(`/v1/ws/:period/${seg}`, { websocket: true }, stream(render) as never);
  }

  if (opts.register) await opts.register(app);
  const url = await app.listen({ host: '127.0.0.1', port: 0 });
  return {
    url,
    app,
    dir,
    disks,
    close: async () => {
      closed = true;
      await app.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Serves `files` (path → bytes) over HTTP on loopback, for download sources. */
export async function startFileServer(files: Record<string, Buffer>): Promise<{ url: string; close(): Promise<void> }> {
  const app = Fastify({ logger: false });
  app.get<{ Params: { '*': string } }>('/*', async (req, reply: FastifyReply) => {
    const body = files['/' + req.params['*']];
    if (!body) return reply.status(404).send('not found');
    return reply.header('content-type', 'application/octet-stream').send(body);
  });
  const url = await app.listen({ host: '127.0.0.1', port: 0 });
  return { url, close: () => app.close() };
}
