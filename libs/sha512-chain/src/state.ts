import { Sha512ChainUnavailableError } from './errors.js';
import { IMPL_LANES, nativeAddon, nativeAddonStatus, sha512ChainImpl, type Sha512ChainAddon, type Sha512Impl } from './native.js';

/** Default distance between two recorded chaining states: 2 MiB (Longhorn's sync block size). */
export const DEFAULT_CHAIN_SEGMENT = 2 * 1024 * 1024;
/** SHA-512 block size: chaining states exist only between whole blocks. */
export const SHA512_BLOCK = 128;
/** Bytes of a chaining state: h0..h7, 8 bytes each. */
export const SHA512_STATE_BYTES = 64;

/** A SHA-512 chaining state: 64 bytes, h0..h7 big-endian (FIPS 180-4 §6.4). */
export type Sha512State = Buffer;

const INITIAL_STATE_HEX =
  '6a09e667f3bcc908bb67ae8584caa73b3c6ef372fe94f82ba54ff53a5f1d36f1' +
  '510e527fade682d19b05688c2b3e6c1f1f83d9abfb41bd6b5be0cd19137e2179';

/** The SHA-512 initial hash value H(0) (FIPS 180-4 §5.3.5): the state before any block. */
export const SHA512_INITIAL_STATE: Sha512State = Buffer.from(INITIAL_STATE_HEX, 'hex');

/** A private copy of the initial state (the exported buffer could be written to by a caller). */
export function initialState(): Sha512State {
  return Buffer.from(INITIAL_STATE_HEX, 'hex');
}

/** True when the native addon is loaded; when false, every hashing function throws `Sha512ChainUnavailableError`. */
export function nativeSha512ChainAvailable(): boolean {
  return nativeAddon() !== null;
}

/** The addon, or a `Sha512ChainUnavailableError`. */
export function requireAddon(): Sha512ChainAddon {
  const addon = nativeAddon();
  if (!addon) throw new Sha512ChainUnavailableError(nativeAddonStatus());
  return addon;
}

export function assertState(state: unknown, what = 'state'): asserts state is Uint8Array {
  if (!(state instanceof Uint8Array)) throw new TypeError(`${what} must be a Buffer of 64 bytes`);
  if (state.length !== SHA512_STATE_BYTES) {
    throw new RangeError(`${what} must be exactly 64 bytes (h0..h7 big-endian), got ${state.length}`);
  }
}

export function assertBlockLength(length: number, what: string): void {
  if (!Number.isSafeInteger(length) || length < 0) {
    throw new RangeError(`${what} must be a non-negative safe integer, got ${String(length)}`);
  }
  if (length % SHA512_BLOCK !== 0) {
    throw new RangeError(`${what} must be a multiple of 128 bytes (whole SHA-512 blocks), got ${length}`);
  }
}

function assertData(data: unknown): asserts data is Uint8Array {
  if (!(data instanceof Uint8Array)) throw new TypeError('data must be a Uint8Array');
  assertBlockLength(data.length, 'data length');
}

/** The state after compressing `data` (whole 128-byte blocks) into `state`, on the calling thread. */
export function advanceSync(state: Sha512State, data: Uint8Array): Sha512State {
  const addon = requireAddon();
  assertState(state);
  assertData(data);
  return addon.advance(state, data);
}

/**
 * The state after compressing `data` (whole 128-byte blocks) into `state`, on the libuv thread pool. Do not change
 * `data` until the promise settles.
 */
export async function advance(state: Sha512State, data: Uint8Array): Promise<Sha512State> {
  const addon = requireAddon();
  assertState(state);
  assertData(data);
  return addon.advanceAsync(state, data);
}

/** The state after compressing `length` zero bytes (a multiple of 128) into `state`, without allocating them. */
export async function advanceZeros(state: Sha512State, length: number): Promise<Sha512State> {
  const addon = requireAddon();
  assertState(state);
  assertBlockLength(length, 'zero length');
  return addon.advanceZerosAsync(state, length);
}

/** Synchronous `advanceZeros` (for small lengths on the calling thread). */
export function advanceZerosSync(state: Sha512State, length: number): Sha512State {
  const addon = requireAddon();
  assertState(state);
  assertBlockLength(length, 'zero length');
  return addon.advanceZeros(state, length);
}

/** Largest number of messages one `advanceMany` call takes. */
export const ADVANCE_MANY_MAX = 4096;

/**
 * The states after compressing each message (`length` bytes, whole 128-byte blocks; `null` = zeros) into its own
 * state, on the libuv thread pool: `states[i]` with `data[i]` gives `result[i]`. With AVX-512 the addon compresses
 * eight messages at once, with AVX2 four (see `multiBufferLanes`). Do not change the data until the promise settles. `impl` forces an
 * implementation (default: `BIS_SHA512_CHAIN_IMPL`, else AVX-512 where the CPU has it).
 */
export async function advanceMany(
  states: readonly Sha512State[],
  data: ReadonlyArray<Uint8Array | null>,
  length: number,
  impl?: Sha512Impl,
): Promise<Sha512State[]> {
  const addon = requireAddon();
  const lanes = IMPL_LANES[sha512ChainImpl(impl)];
  if (states.length !== data.length) {
    throw new RangeError(`advanceMany needs one state per message: ${states.length} states, ${data.length} messages`);
  }
  if (states.length === 0) return [];
  if (states.length > ADVANCE_MANY_MAX) throw new RangeError(`advanceMany takes at most ${ADVANCE_MANY_MAX} messages, got ${states.length}`);
  assertBlockLength(length, 'message length');
  states.forEach((s, i) => assertState(s, `states[${i}]`));
  data.forEach((d, i) => {
    if (d === null) return;
    if (!(d instanceof Uint8Array)) throw new TypeError(`data[${i}] must be a Uint8Array or null`);
    if (d.length !== length) throw new RangeError(`data[${i}] must be exactly ${length} bytes, got ${d.length}`);
  });
  const out = await addon.advanceManyAsync(Buffer.concat(states), data, length, lanes);
  return states.map((_, i) => out.subarray(i * SHA512_STATE_BYTES, (i + 1) * SHA512_STATE_BYTES));
}

/**
 * Messages `advanceMany` compresses at once with `impl` (default: the process-wide choice, `BIS_SHA512_CHAIN_IMPL`):
 * 8 with AVX-512, 4 with AVX2, 1 with OpenSSL, 0 without the addon.
 */
export function multiBufferLanes(impl?: Sha512Impl): number {
  if (!nativeAddon()) return 0;
  return IMPL_LANES[sha512ChainImpl(impl)];
}

const EMPTY = new Uint8Array(0);

/**
 * The SHA-512 (lowercase hex) of a message of `totalLength` bytes: `state` holds every whole 128-byte block of it,
 * `tail` the last `totalLength % 128` bytes.
 */
export function finalizeHex(state: Sha512State, totalLength: number, tail: Uint8Array = EMPTY): string {
  const addon = requireAddon();
  assertState(state);
  if (!Number.isSafeInteger(totalLength) || totalLength < 0) {
    throw new RangeError(`totalLength must be a non-negative safe integer, got ${String(totalLength)}`);
  }
  if (!(tail instanceof Uint8Array)) throw new TypeError('tail must be a Uint8Array');
  if (tail.length !== totalLength % SHA512_BLOCK) {
    throw new RangeError(
      `tail must hold the last totalLength % 128 = ${totalLength % SHA512_BLOCK} bytes, got ${tail.length}`,
    );
  }
  return addon.finalize(state, totalLength, tail).toString('hex');
}

/** Byte-wise equality of two states. */
export function sameState(a: Uint8Array, b: Uint8Array): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.length).equals(b);
}
