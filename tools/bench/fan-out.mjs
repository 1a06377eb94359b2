#!/usr/bin/env node
// Benchmark: peer-to-peer fan-out in Kubernetes mode, on the test cluster of @bis/kube/testing (a real kube-apiserver
// from KUBEBUILDER_ASSETS, `ChartCluster`: the chart applied, N nodes in network namespaces, every pod one of the
// built apps), each pod's link capped with tc netem (default 1000 Mbit/s and 1 ms of delay at each end).
// A sparse image (default 2 GiB, 50 % holes: 8 MiB of random data, 8 MiB hole) is served by an HTTP origin on the
// cluster's bridge. In the same run:
//   one copy:  an image with minNumberOfCopies 1, from the REST create to its one copy ready (downloaded, verified);
//   N copies:  the same content under another name with minNumberOfCopies N (one disk per node): create -> N ready.
// Prints both times, the ratio (N copies / one copy; the goal is <= 1.5 for 8 nodes) and when each copy became
// ready, then checks every copy on the nodes' disks against the image's SHA-512 with sha512sum (outside the times).
// Needs root (network namespaces), KUBEBUILDER_ASSETS and the built apps (npx nx run-many -t build).
// Usage: node tools/bench/fan-out.mjs [--nodes 8] [--gib 2] [--rate-mbit 1000] [--delay-ms 1] [--keep]
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const { ChartCluster, LinkShapeUnsupportedError, clusterSkipReason } = await import(path.join(repo, 'libs/kube/dist/testing/index.js'));
const { describeMachine } = await import('./machine.mjs');
const run = promisify(execFile);

const opt = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
};
const NODES = opt('nodes', 8);
const SIZE = opt('gib', 2) * 2 ** 30;
const RATE = opt('rate-mbit', 1000);
const DELAY = opt('delay-ms', 1);
const KEEP = process.argv.includes('--keep');
const SEG = 8 << 20;
const POLL_MS = 100;

const skip = clusterSkipReason();
if (skip) {
  console.error(`fan-out benchmark cannot run here: ${skip}`);
  process.exit(2);
}
console.log(await describeMachine(repo));
console.log(`fan-out: ${NODES} nodes, image ${SIZE / 2 ** 30} GiB with 50 % holes, links ${RATE} Mbit/s + ${DELAY} ms each way`);

const work = await fsp.mkdtemp(path.join(os.tmpdir(), 'bis-fan-out-'));
const imageFile = path.join(work, 'image.raw');
const h = createHash('sha512');
{
  const fh = await fsp.open(imageFile, 'w');
  const zeros = Buffer.alloc(SEG);
  for (let off = 0; off < SIZE; off += SEG) {
    const data = (off / SEG) % 2 === 0;
    const buf = data ? randomBytes(SEG) : zeros;
    if (data) await fh.write(buf, 0, SEG, off);
    h.update(buf);
  }
  await fh.truncate(SIZE);
  await fh.close();
}
const checksum = h.digest('hex');

const names = Array.from({ length: NODES }, (_, i) => `node-${i + 1}`);
const started = Date.now();
// Kubernetes' default node-monitor grace (40 s): with 8 nodes' pods on a small machine the test kubelet renews its
// leases late, and the suites' 6 s grace turned healthy nodes not ready mid-transfer (their copies then waited).
const cc = await ChartCluster.start({ nodes: names, allowHostAddress: true, nodeMonitorGracePeriodMs: 40_000 });
let exitCode = 0;
try {
  console.log(`cluster of ${NODES} nodes up in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  let delay = DELAY;
  try {
    for (const n of names) await cc.cluster.shapeLink(n, { rateMbit: RATE, delayMs: delay });
  } catch (err) {
    if (!(err instanceof LinkShapeUnsupportedError)) throw err;
    console.log(`NOTE: ${err.message}; the links are capped at ${RATE} Mbit/s with no added delay`);
    delay = 0;
    for (const n of names) await cc.cluster.shapeLink(n, { rateMbit: RATE });
  }
  const origin = await cc.serveOrigin({ '/image.raw': { file: imageFile } });

  /** Creates `name` with `copies` copies and waits until that many are ready; when each became ready (s). */
  const converge = async (name, copies) => {
    const t0 = Date.now();
    await cc.createImage('node-1', { name, sourceType: 'download', parameters: { url: `${origin}/image.raw` }, expectedChecksum: checksum, minNumberOfCopies: copies });
    const readyAt = new Map();
    for (;;) {
      const now = (Date.now() - t0) / 1000;
      for (const c of await cc.readyCopies(name)) if (!readyAt.has(c.disk)) readyAt.set(c.disk, { node: c.node, file: c.file, at: now });
      if (readyAt.size >= copies) return { seconds: now, copies: [...readyAt.values()].sort((a, b) => a.at - b.at) };
      if (now > 1800) throw new Error(`${name}: ${readyAt.size} of ${copies} copies ready after 30 minutes\n${await cc.state(name)}`);
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  };

  const one = await converge('fan-one', 1);
  console.log(`one copy: ${one.seconds.toFixed(2)} s (create -> ready on ${one.copies[0].node})`);
  const all = await converge('fan-all', NODES);
  console.log(`${NODES} copies: ${all.seconds.toFixed(2)} s; ready at ${all.copies.map((c) => `${c.node} ${c.at.toFixed(1)} s`).join(', ')}`);
  const ratio = all.seconds / one.seconds;
  console.log(`ratio ${NODES} copies / one copy: ${ratio.toFixed(2)}x (goal <= 1.5x)`);

  const sums = await Promise.all([...one.copies, ...all.copies].map(async (c) => (await run('sha512sum', [c.file], { maxBuffer: 1 << 20 })).stdout.split(' ')[0]));
  const bad = sums.filter((s) => s !== checksum).length;
  console.log(`checked ${sums.length} copies with sha512sum: ${bad === 0 ? 'all match' : `${bad} DO NOT MATCH`}`);
  if (bad) exitCode = 1;
  console.log(`load ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
} catch (err) {
  console.error(err instanceof Error ? err.message : String(err));
  exitCode = 1;
} finally {
  if (KEEP) process.env.BIS_CLUSTER_KEEP = '1';
  await cc.stop();
  await fsp.rm(work, { recursive: true, force: true });
}
process.exit(exitCode);
