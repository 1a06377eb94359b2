#!/usr/bin/env node
// Cost of one status write of a big object in the embedded datastore: a manager-like object whose status lists F
// files (~490 bytes of JSON each), of which each write changes one. Prints the CPU per write (process.cpuUsage over
// M writes, fdatasync included in the wall time only) against a reference measured in the same run: one
// JSON.stringify of the whole object (what writing it whole to the log costs at least), and the log bytes per write.
// The writer passes the object the last write answered, with one file's entry replaced (as a controller does).
// Build first: npx nx run @bis/datastore:build      Run: node tools/bench/datastore-big-object.mjs [--files 1000,3000,10000] [--writes 300]
// DATASTORE_MODULE=<file.js> runs it against another build (a module exporting EmbeddedDatastore and defineKind).
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';

const { EmbeddedDatastore, defineKind } = await import(process.env.DATASTORE_MODULE ? pathToFileURL(path.resolve(process.env.DATASTORE_MODULE)).href : '@bis/datastore');
const { values } = parseArgs({ options: { files: { type: 'string', default: '1000,3000,10000' }, writes: { type: 'string', default: '300' } } });
const M = Number(values.writes);
const Kind = defineKind({ apiVersion: 'bench.bis.dev/v1', kind: 'Manager', plural: 'managers', namespaced: true });
const cpuMs = (c) => (c.user + c.system) / 1000;

console.log(`node ${process.version}, ${os.cpus()[0]?.model ?? '?'}, load average ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`);
for (const F of values.files.split(',').map(Number)) {
  const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-ds-big-'));
  try {
    const store = await EmbeddedDatastore.open({ dataDir: dir, compactAfterEvents: 1_000_000 });
    const files = {};
    for (let i = 0; i < F; i++) {
      const sum = i.toString(16).padStart(128, 'a');
      files[`img-${i}`] = { name: `img-${i}`, uuid: i.toString(36).padStart(8, '0'), size: 65536, virtualSize: 65536, state: 'ready', progress: 100, currentChecksum: sum, expectedChecksum: sum, message: '', sendingReference: 0, senderManagerAddress: '' };
    }
    let obj = await store.create(Kind, { apiVersion: Kind.apiVersion, kind: Kind.kind, metadata: { name: 'bim-1', namespace: 'bench' }, spec: { diskUUID: 'd' } });
    obj = await store.updateStatus(Kind, { ...obj, status: { currentState: 'running', backingImageFileMap: files } });
    // reference: stringifying the whole object, M times
    let t = process.cpuUsage();
    let bytes = 0;
    for (let j = 0; j < M; j++) bytes += JSON.stringify(obj).length;
    const stringifyMs = cpuMs(process.cpuUsage(t)) / M;
    const logBefore = (await fsp.stat(path.join(dir, 'store.log'))).size;
    t = process.cpuUsage();
    const w0 = performance.now();
    for (let j = 0; j < M; j++) {
      const k = `img-${j % F}`;
      const map = obj.status.backingImageFileMap;
      obj = await store.updateStatus(Kind, { ...obj, status: { ...obj.status, backingImageFileMap: { ...map, [k]: { ...map[k], progress: j % 100 } } } });
    }
    const writeMs = cpuMs(process.cpuUsage(t)) / M;
    const wallMs = (performance.now() - w0) / M;
    const logPerWrite = ((await fsp.stat(path.join(dir, 'store.log'))).size - logBefore) / M;
    await store.close();
    console.log(JSON.stringify({ files: F, objectBytes: bytes / M, writes: M, cpuMsPerWrite: +writeMs.toFixed(2), wallMsPerWrite: +wallMs.toFixed(2), logBytesPerWrite: Math.round(logPerWrite), referenceStringifyMs: +stringifyMs.toFixed(2), ratioWriteVsStringify: +(writeMs / stringifyMs).toFixed(2) }));
  } finally {
    await fsp.rm(dir, { recursive: true, force: true });
  }
}
