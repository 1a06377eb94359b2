import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

export interface ImageServerOptions {
  /** The bytes served at /img (already compressed when testing decompression). */
  body: Buffer;
  /** Answer HEAD with 405 (servers that reject HEAD, longhorn#7892). */
  refuseHead?: boolean;
  /** Ignore Range and do not advertise Accept-Ranges. */
  noRanges?: boolean;
  /** For the first `drops` GETs of /img: send the headers, `dropAfterBytes` bytes of the body, then reset the connection. */
  dropAfterBytes?: number;
  drops?: number;
  /** Send `stallAfterBytes` bytes then stop sending (the connection stays open). */
  stallAfterBytes?: number;
  /** Send /img with chunked encoding (no Content-Length). */
  noContentLength?: boolean;
  /** Write speed limit in bytes per 10 ms tick (slow server). */
  bytesPerTick?: number;
  /** Paths that answer 302 to a location (relative or absolute). */
  redirects?: Record<string, string>;
  /** The first `times` GETs of /img answer this HTTP status (e.g. 500). */
  failFirst?: { status: number; times: number };
}

export interface RecordedRequest {
  method: string;
  url: string;
  range: string | undefined;
  authorization: string | undefined;
  referer: string | undefined;
  connection: string | undefined;
  userAgent: string | undefined;
}

export interface ImageServer {
  url: string;
  port: number;
  requests: RecordedRequest[];
  close(): Promise<void>;
}

/** A real HTTP server on 127.0.0.1 with the misbehaviours download sources must cope with. */
export async function startImageServer(o: ImageServerOptions): Promise<ImageServer> {
  const requests: RecordedRequest[] = [];
  const sockets = new Set<Socket>();
  let gets = 0;
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const path = (req.url ?? '/').split('?')[0]!;
    requests.push({
      method: req.method ?? '',
      url: req.url ?? '',
      range: req.headers.range,
      authorization: req.headers.authorization,
      referer: req.headers.referer,
      connection: req.headers.connection,
      userAgent: req.headers['user-agent'],
    });
    const target = o.redirects?.[path];
    if (target) {
      res.writeHead(302, { location: target }).end();
      return;
    }
    if (path !== '/img') {
      res.writeHead(404).end('not found');
      return;
    }
    if (req.method === 'GET' && o.failFirst && o.failFirst.times > 0) {
      o.failFirst.times--;
      res.writeHead(o.failFirst.status, { 'content-type': 'text/plain' }).end('failing on purpose');
      return;
    }
    if (req.method === 'HEAD' && o.refuseHead) {
      res.writeHead(405).end();
      return;
    }
    const total = o.body.length;
    let start = 0;
    let end = total - 1;
    let status = 200;
    const headers: Record<string, string | number> = { 'content-type': 'application/octet-stream' };
    if (!o.noRanges) headers['accept-ranges'] = 'bytes';
    const m = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? '');
    if (m && !o.noRanges) {
      start = Number(m[1]);
      end = m[2] ? Math.min(Number(m[2]), total - 1) : total - 1;
      if (start >= total) {
        res.writeHead(416, { 'content-range': `bytes */${total}` }).end();
        return;
      }
      status = 206;
      headers['content-range'] = `bytes ${start}-${end}/${total}`;
    }
    if (!o.noContentLength) headers['content-length'] = end - start + 1;
    res.writeHead(status, headers);
    if (req.method === 'HEAD') {
      res.end();
      return;
    }
    const n = ++gets;
    let data = o.body.subarray(start, end + 1);
    let after: 'end' | 'drop' | 'stall' = 'end';
    if (o.dropAfterBytes !== undefined && n <= (o.drops ?? 1) && data.length > o.dropAfterBytes) {
      data = data.subarray(0, o.dropAfterBytes);
      after = 'drop';
    } else if (o.stallAfterBytes !== undefined && data.length > o.stallAfterBytes) {
      data = data.subarray(0, o.stallAfterBytes);
      after = 'stall';
    }
    const finish = (): void => {
      if (after === 'end') res.end();
      else if (after === 'drop') setTimeout(() => req.socket.destroy(), 20);
    };
    if (o.bytesPerTick) {
      let at = 0;
      const tick = (): void => {
        if (res.destroyed) return;
        const part = data.subarray(at, at + o.bytesPerTick!);
        at += part.length;
        if (part.length > 0) res.write(part);
        if (at >= data.length) finish();
        else setTimeout(tick, 10);
      };
      tick();
    } else {
      res.write(data, () => finish());
    }
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}
