/**
 * The hash workers' program (worker threads of the pool behind {@link HashWorker}). One thread serves many hashing
 * sessions, each with its own running digests. Messages are handled in order: `open` starts a session's digests,
 * `update` hashes a slice of a SharedArrayBuffer (shared, never copied), `digest` returns the hex digests and starts
 * new ones, `peek` returns the digests so far and goes on, `reset` starts new digests, `close` ends the session.
 *
 * With `chainSegment`, the SHA-512 is computed by a SHA-512 chain recorder (`@bis/sha512-chain`, OpenSSL's SHA-512
 * through the addon: the same speed as `createHash`), which also keeps the chaining state at every segment boundary;
 * `digest` then returns the encoded chain too, so the file gets its chain in the pass that makes it.
 */
import { createHash, type Hash } from 'node:crypto';
import { parentPort } from 'node:worker_threads';
import { encodeChainParts, Sha512ChainRecorder } from '@bis/sha512-chain/record';

/** What a session hashes with. */
export interface DigestSessionOptions {
  algorithms: string[];
  /** Record the SHA-512 chain with segments of this many bytes (the `sha512` algorithm must be among `algorithms`). */
  chainSegment?: number;
}

export type DigestRequest =
  | { op: 'open'; id: number; session: number; options: DigestSessionOptions }
  | { op: 'update'; id: number; session: number; buffer: SharedArrayBuffer; offset: number; length: number }
  | { op: 'digest'; id: number; session: number }
  | { op: 'peek'; id: number; session: number }
  | { op: 'reset'; id: number; session: number }
  | { op: 'close'; id: number; session: number };

export interface DigestReply {
  id: number;
  digests?: string[];
  /** With `chainSegment`, on `digest`: the chain of the SHA-512 (`encodeChain` format). */
  chain?: Uint8Array;
  error?: string;
}

/** One running digest: node's `Hash`, or the chain recorder for SHA-512. */
interface Digest {
  update(view: Uint8Array): void;
  peek(): string;
  digest(): { hex: string; chain?: Uint8Array };
}

/** States are moved out of the recorder into compact buffers, so a long image costs 64 bytes a segment, not an object. */
const STATES_PER_CHUNK = 1024;

function chainDigest(segmentSize: number): Digest {
  const rec = new Sha512ChainRecorder(segmentSize);
  const chunks: Buffer[] = [];
  let pending: Buffer[] = [];
  const collect = (): void => {
    pending.push(...rec.drainStates());
    if (pending.length >= STATES_PER_CHUNK) {
      chunks.push(Buffer.concat(pending));
      pending = [];
    }
  };
  return {
    update(view) {
      rec.updateSync(view);
      collect();
    },
    peek: () => rec.checksumSoFar(),
    digest() {
      collect();
      const chain = rec.finish();
      const states = Buffer.concat([...chunks, ...pending, ...chain.states]);
      return { hex: chain.checksum, chain: encodeChainParts(chain, states) };
    },
  };
}

function hashDigest(algorithm: string): Digest {
  const h: Hash = createHash(algorithm);
  return {
    update: (view) => h.update(view),
    peek: () => h.copy().digest('hex'),
    digest: () => ({ hex: h.digest('hex') }),
  };
}

function start(options: DigestSessionOptions): Digest[] {
  return options.algorithms.map((a) =>
    a === 'sha512' && options.chainSegment !== undefined ? chainDigest(options.chainSegment) : hashDigest(a),
  );
}

interface Session {
  options: DigestSessionOptions;
  digests: Digest[];
}

/** Answers one request for one of `sessions`. */
function answer(sessions: Map<number, Session>, m: DigestRequest): DigestReply {
  try {
    if (m.op === 'open') {
      if (sessions.has(m.session)) return { id: m.id, error: `hashing session ${m.session} is already open` };
      sessions.set(m.session, { options: m.options, digests: start(m.options) });
      return { id: m.id };
    }
    if (m.op === 'close') {
      sessions.delete(m.session);
      return { id: m.id };
    }
    const state = sessions.get(m.session);
    if (!state) return { id: m.id, error: `hashing session ${m.session} is not open` };
    switch (m.op) {
      case 'update': {
        const view = new Uint8Array(m.buffer, m.offset, m.length);
        for (const d of state.digests) d.update(view);
        return { id: m.id };
      }
      case 'digest': {
        const done = state.digests.map((d) => d.digest());
        state.digests = start(state.options);
        const chain = done.find((d) => d.chain)?.chain;
        return { id: m.id, digests: done.map((d) => d.hex), ...(chain ? { chain } : {}) };
      }
      case 'peek':
        return { id: m.id, digests: state.digests.map((d) => d.peek()) };
      case 'reset':
        state.digests = start(state.options);
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
  const sessions = new Map<number, Session>();
  port.on('message', (m: DigestRequest) => port.postMessage(answer(sessions, m)));
}
