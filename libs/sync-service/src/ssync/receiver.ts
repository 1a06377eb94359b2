import { promises as fsp } from 'node:fs';
import { ReceiveSession } from './receive-session.js';
import { SsyncReceiveError } from './receive-error.js';
import type { SsyncReceiveResult, SsyncReceiverOptions } from './receiver-types.js';
import type { Sha512Chain } from '@bis/sha512-chain';
import type { SegmentKind } from './chain-check.js';

// The receiver's parts: `receive-session.ts` (the state of one receive and its request handlers), `chain-check.ts`
// (verification against the sender's SHA-512 chain), `piece-writer.ts` (direct and buffered writes),
// `process-receive-budget.ts` (what all receivers of the process share: pending pieces and free slabs),
// `received-hasher.ts` (the in-order SHA-512) and `receiver-http.ts` (the HTTP/1.1 server).
export type { ReceivedChainStats, SsyncReceiveResult, SsyncReceiverOptions } from './receiver-types.js';
export { SsyncReceiveError } from './receive-error.js';
export type { SegmentKind } from './chain-check.js';

/** What a forwarding sender needs of a receive still under way (see `sendFile`'s `forward`). */
export interface ForwardableReceive {
  /** The sender's chain once accepted; undefined when the receive goes on without one. Rejects when it fails first. */
  readonly chain: Promise<Sha512Chain | undefined>;
  /** Resolves when segment `index` is in the file and verified (rejects when the receive fails). */
  segmentFinal(index: number): Promise<SegmentKind>;
  /** The parts of [begin, end) received as holes (and not as data), in order; asked once their segment is final. */
  holesIn(begin: number, end: number): Array<[number, number]>;
}

export interface SsyncReceiver {
  /** The port actually listened on. */
  readonly port: number;
  /** Settles when the sender has closed a complete file (resolve) or the transfer failed / was cancelled (reject). */
  readonly done: Promise<SsyncReceiveResult>;
  /** Resolves when the HTTP server is closed and the port is free again. */
  readonly closed: Promise<void>;
  /**
   * The sender answered that it is busy and will be asked again: the stall timeout starts again (until the sender's
   * first request, after which its requests keep the receive alive).
   */
  keepWaiting(): void;
  /** The receive as a source for forwarding what is verified while the rest is still being received. */
  readonly forwardable: ForwardableReceive;
}

/**
 * Receiver side of Longhorn's sparse file-sync protocol (`/v1-ssync/`: open, writeData, sendHole, getChecksum,
 * close). Differences from Longhorn, all wire-compatible:
 * - `close` completes the receive only when every byte of [0, size) was covered by writeData or sendHole; a sender
 *   that aborted half-way (Longhorn's sender still calls close) leaves an incomplete file, which fails here instead
 *   of being reported complete (data-plane quirk §10-6);
 * - `getChecksum` answers `null` (= "send the data") unless the range is data in a target that existed before.
 */
export async function startSsyncReceiver(opts: SsyncReceiverOptions): Promise<SsyncReceiver> {
  opts.signal?.throwIfAborted();
  let fileAlreadyExists = false;
  try {
    await fsp.stat(opts.filePath);
    fileAlreadyExists = true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const session = new ReceiveSession(opts, fileAlreadyExists);
  const port = await session.listen(opts.port, opts.host ?? '0.0.0.0');
  const forwardable: ForwardableReceive = {
    chain: session.chainKnown.then((c) => c?.chain),
    segmentFinal: async (index) => {
      const check = await session.chainKnown;
      if (!check) throw new SsyncReceiveError('the receive has no SHA-512 chain: its segments cannot be forwarded before it completes');
      return check.whenFinal(index);
    },
    holesIn: (begin, end) => session.holesIn(begin, end),
  };
  forwardable.chain.catch(() => undefined); // asked for by a forwarding sender only
  return { port, done: session.done, closed: session.closed, keepWaiting: () => session.keepWaiting(), forwardable };
}
