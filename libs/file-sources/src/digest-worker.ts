/**
 * The hash worker's program (a worker thread started by {@link HashWorker}). Messages are handled in order: `update`
 * hashes a slice of a SharedArrayBuffer (shared, never copied), `digest` returns the hex digests and starts new
 * hashes, `peek` returns the digests so far and goes on, `reset` starts new hashes.
 */
import { createHash, type Hash } from 'node:crypto';
import { parentPort, workerData } from 'node:worker_threads';

export interface DigestWorkerData {
  algorithms: string[];
}

export type DigestRequest =
  | { op: 'update'; id: number; buffer: SharedArrayBuffer; offset: number; length: number }
  | { op: 'digest'; id: number }
  | { op: 'peek'; id: number }
  | { op: 'reset'; id: number };

export interface DigestReply {
  id: number;
  digests?: string[];
  error?: string;
}

function answer(algorithms: string[], state: { hashes: Hash[] }, m: DigestRequest): DigestReply {
  try {
    switch (m.op) {
      case 'update': {
        const view = new Uint8Array(m.buffer, m.offset, m.length);
        for (const h of state.hashes) h.update(view);
        return { id: m.id };
      }
      case 'digest': {
        const digests = state.hashes.map((h) => h.digest('hex'));
        state.hashes = algorithms.map((a) => createHash(a));
        return { id: m.id, digests };
      }
      case 'peek':
        return { id: m.id, digests: state.hashes.map((h) => h.copy().digest('hex')) };
      case 'reset':
        state.hashes = algorithms.map((a) => createHash(a));
        return { id: m.id };
    }
    const other = m as { id: number; op: unknown };
    return { id: other.id, error: `unknown hash worker operation ${String(other.op)}` };
  } catch (e) {
    return { id: m.id, error: e instanceof Error ? e.message : String(e) };
  }
}

if (parentPort) {
  const port = parentPort;
  const { algorithms } = workerData as DigestWorkerData;
  const state = { hashes: algorithms.map((a) => createHash(a)) };
  port.on('message', (m: DigestRequest) => port.postMessage(answer(algorithms, state, m)));
}
