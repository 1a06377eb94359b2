import { Slab, type SlabAllocator } from './received-hasher.js';

/**
 * Received pieces written and verified after their request was answered, at most, per receiver (each holds its
 * receive buffer until both are done). The sender does not wait for the disk or the hash, and with eight segments
 * waiting the SHA-512 scheduler compresses them in one AVX-512 pass.
 */
const MAX_DEFERRED_PIECES = 16;
/**
 * Pieces pending after their answer in all the receivers of this process together (beyond it each receiver keeps at
 * least MIN_DEFERRED_PIECES): three receives at once would otherwise hold three times the memory of one.
 */
const PROCESS_MAX_DEFERRED_PIECES = 16;
const MIN_DEFERRED_PIECES = 2;
/**
 * Free slabs kept for reuse by the receivers without the in-order hash, all receivers of the process together: one
 * per sender worker and one per pending piece. Fewer would make a receiver allocate slabs over and over (fresh
 * memory costs page faults, and every new buffer counts as external memory that pushes V8 into full garbage
 * collections).
 */
const SLAB_POOL_FREE = 4 + PROCESS_MAX_DEFERRED_PIECES;

/**
 * What the ssync receivers of one process share: the budget of pieces pending after their answer (their receive
 * buffers stay allocated until written and verified), and the free receive buffers (slabs) kept for reuse. Every
 * receiver uses the process-wide instance `processReceiveBudget`; a separate instance isolates a receiver (tests).
 */
export class ProcessReceiveBudget {
  #deferredPieces = 0;
  /** Free slabs by size and kind (page-aligned or plain memory). */
  readonly #freeSlabs = new Map<string, Slab[]>();
  #freeSlabCount = 0;

  /** Pieces pending after their answer in all receivers. */
  get deferredPieces(): number {
    return this.#deferredPieces;
  }

  /** Free slabs kept, all sizes. */
  get freeSlabs(): number {
    return this.#freeSlabCount;
  }

  /**
   * Whether a receiver that holds `own` pending pieces must wait for one of them before deferring another: beyond
   * its own limit, or beyond the process's while it holds at least its minimum.
   */
  mustWaitToDefer(own: number): boolean {
    return own >= MAX_DEFERRED_PIECES || (this.#deferredPieces >= PROCESS_MAX_DEFERRED_PIECES && own >= MIN_DEFERRED_PIECES);
  }

  pieceDeferred(): void {
    this.#deferredPieces++;
  }

  pieceSettled(): void {
    this.#deferredPieces--;
  }

  /** A kept free slab of this size and kind, if any. */
  takeSlab(slabSize: number, aligned: boolean): Slab | undefined {
    const s = this.#freeList(slabSize, aligned).pop();
    if (s) this.#freeSlabCount--;
    return s;
  }

  /** Keeps a slab no longer used for reuse, unless enough are kept already (then it is left to the garbage collector). */
  keepSlab(slabSize: number, aligned: boolean, s: Slab): void {
    if (this.#freeSlabCount < SLAB_POOL_FREE) {
      this.#freeList(slabSize, aligned).push(s);
      this.#freeSlabCount++;
    }
  }

  #freeList(slabSize: number, aligned: boolean): Slab[] {
    const key = `${slabSize}:${aligned ? 'aligned' : 'plain'}`;
    let free = this.#freeSlabs.get(key);
    if (!free) this.#freeSlabs.set(key, (free = []));
    return free;
  }
}

/** The budget shared by every receiver of this process. */
export const processReceiveBudget = new ProcessReceiveBudget();

/** Where a receiver gets its receive buffers: this pool, or the in-order hasher (which keeps written slabs). */
export interface SlabSource {
  acquire(begin: number): Promise<Slab>;
  release(s: Slab): void;
}

/** Receive buffers of one size for a receiver that does not hash in order: reused through the process budget. */
export class SlabPool implements SlabSource {
  constructor(
    readonly slabSize: number,
    private readonly aligned: boolean,
    readonly allocate: SlabAllocator,
    private readonly budget: ProcessReceiveBudget = processReceiveBudget,
  ) {}

  async acquire(_begin: number): Promise<Slab> {
    return this.budget.takeSlab(this.slabSize, this.aligned) ?? new Slab(this.allocate(this.slabSize, false));
  }

  release(s: Slab): void {
    this.budget.keepSlab(this.slabSize, this.aligned, s);
  }
}

/**
 * The pieces of one receiver written or verified after their answer. Each holds its slab until it settles and counts
 * against the process budget meanwhile.
 */
export class DeferredPieces {
  readonly #held = new Set<Promise<void>>();

  constructor(private readonly budget: ProcessReceiveBudget = processReceiveBudget) {}

  get size(): number {
    return this.#held.size;
  }

  /** This receiver may not defer another piece before one of its pieces settled (`anySettled`). */
  get full(): boolean {
    return this.budget.mustWaitToDefer(this.#held.size);
  }

  /** Resolves when one of the pending pieces settled (never when none is pending). */
  anySettled(): Promise<void> {
    return Promise.race(this.#held);
  }

  /** Holds a piece until every one of `work` settled, then calls `release` (which frees its slab). */
  hold(work: Promise<void>[], release: () => void): void {
    const held = Promise.allSettled(work).then(() => {
      release();
      this.#held.delete(held);
      this.budget.pieceSettled();
    });
    this.#held.add(held);
    this.budget.pieceDeferred();
  }

  /** Resolves once no piece is pending (including pieces deferred meanwhile). */
  async drain(): Promise<void> {
    while (this.#held.size > 0) await Promise.allSettled([...this.#held]);
  }
}
