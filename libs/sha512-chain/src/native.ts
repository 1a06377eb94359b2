import { createRequire } from 'node:module';

/** The functions of the `sha512_chain` N-API addon (`native/src/sha512_chain.c`). States are 64-byte buffers. */
export interface Sha512ChainAddon {
  /** Compresses `data` (a multiple of 128 bytes) into a copy of `state`, on the calling thread. */
  advance(state: Uint8Array, data: Uint8Array): Buffer;
  /** Same as `advance`, on the libuv thread pool; `data` is referenced until the promise settles. */
  advanceAsync(state: Uint8Array, data: Uint8Array): Promise<Buffer>;
  /** Compresses `length` zero bytes (a multiple of 128) without allocating them, on the calling thread. */
  advanceZeros(state: Uint8Array, length: number): Buffer;
  /** Same as `advanceZeros`, on the libuv thread pool. */
  advanceZerosAsync(state: Uint8Array, length: number): Promise<Buffer>;
  /** The SHA-512 digest (64 bytes) of a message of `totalLength` bytes whose whole blocks are compressed in `state`. */
  finalize(state: Uint8Array, totalLength: number, tail: Uint8Array): Buffer;
  /**
   * Advances n independent states (64 bytes each, back to back in `states`) over n messages of `length` bytes each
   * (`null` = zeros), on the calling thread; returns the n new states back to back. With AVX-512, eight messages are
   * compressed at once (`multiBufferLanes` is then 8).
   */
  advanceMany(states: Uint8Array, data: ReadonlyArray<Uint8Array | null>, length: number, lanes?: Sha512Lanes): Buffer;
  /** Same as `advanceMany`, on a thread of its own; every data view is referenced until the promise settles. */
  advanceManyAsync(states: Uint8Array, data: ReadonlyArray<Uint8Array | null>, length: number, lanes?: Sha512Lanes): Promise<Buffer>;
  /** The widest path of this build and CPU: 8 (AVX-512 eight lanes), 4 (AVX2 four lanes) or 1 (OpenSSL). */
  readonly multiBufferLanes: number;
  /** Every `lanes` value this build and CPU accept (1 always; 4 with AVX2; 8 with AVX-512F/BW). */
  readonly supportedLanes: readonly number[];
}

/** Set to `0` to skip loading the addon (the library then behaves as if it were not built). */
export const DISABLE_NATIVE_ENV = 'BIS_SHA512_CHAIN_NATIVE';
/** Absolute path of a `sha512_chain.node` to load instead of the one built in this package. */
export const ADDON_PATH_ENV = 'BIS_SHA512_CHAIN_ADDON';
/**
 * Which SHA-512 runs `advanceMany`: `avx512` (eight messages per pass; an error where the CPU lacks AVX-512F/BW),
 * `avx2` (four messages per pass; an error where the CPU lacks AVX2), `openssl` (OpenSSL message by message; on arm64
 * OpenSSL itself uses the ARMv8.2 SHA-512 instructions where the CPU has them), or `auto` (the default: the widest the
 * CPU has).
 */
export const IMPL_ENV = 'BIS_SHA512_CHAIN_IMPL';

/** The implementations of `advanceMany`. */
export type Sha512Impl = 'openssl' | 'avx2' | 'avx512';
/** Messages one pass of each implementation compresses at once (the addon's `lanes`). */
export type Sha512Lanes = 1 | 4 | 8;
export const IMPL_LANES: Readonly<Record<Sha512Impl, Sha512Lanes>> = { openssl: 1, avx2: 4, avx512: 8 };
const IMPL_SETTINGS = ['openssl', 'avx2', 'avx512', 'auto'] as const;
const IMPL_NEEDS: Readonly<Record<Sha512Impl, string>> = { openssl: 'OpenSSL', avx2: 'AVX2', avx512: 'AVX-512F/BW' };

/** Whether the loaded addon can run an implementation (this build, this CPU, this OS). */
export function implAvailable(impl: Sha512Impl): boolean {
  const addon = nativeAddon();
  if (!addon) return false;
  return addon.supportedLanes.includes(IMPL_LANES[impl]);
}

/** Whether the loaded addon can run the AVX-512 eight-lane SHA-512 (this build, this CPU, this OS). */
export function avx512Available(): boolean {
  return implAvailable('avx512');
}

/** Whether the loaded addon can run the AVX2 four-lane SHA-512 (this build, this CPU, this OS). */
export function avx2Available(): boolean {
  return implAvailable('avx2');
}

/**
 * The implementation `advanceMany` uses: `explicit` when given, else `BIS_SHA512_CHAIN_IMPL` (read here only), else
 * `auto`. Throws when the value is unknown or asks for AVX-512 where it is not available.
 */
export function sha512ChainImpl(explicit?: Sha512Impl, env?: NodeJS.ProcessEnv): Sha512Impl {
  // the process-wide choice is settled once (advanceMany asks for every pass)
  if (explicit === undefined && env === undefined) return (processImpl ??= resolveImpl(undefined, process.env));
  return resolveImpl(explicit, env ?? process.env);
}

let processImpl: Sha512Impl | undefined;

function resolveImpl(explicit: Sha512Impl | undefined, env: NodeJS.ProcessEnv): Sha512Impl {
  const value = explicit ?? (env[IMPL_ENV] || 'auto');
  const source = explicit !== undefined ? 'impl option' : IMPL_ENV;
  if (!(IMPL_SETTINGS as readonly string[]).includes(value)) {
    throw new RangeError(`${source}=${JSON.stringify(value)} is not a SHA-512 implementation: use ${IMPL_SETTINGS.join(', ')}`);
  }
  if (value === 'auto') return avx512Available() ? 'avx512' : avx2Available() ? 'avx2' : 'openssl';
  const impl = value as Sha512Impl;
  if (impl !== 'openssl' && !implAvailable(impl)) {
    throw new RangeError(
      `${source}=${impl} but ${nativeAddon() ? `this CPU (or build) has no ${IMPL_NEEDS[impl]}` : `the addon is not loaded (${nativeAddonStatus()})`}`,
    );
  }
  return impl;
}

const ADDON_PATH = '../native/build/Release/sha512_chain.node';
const ADDON_FUNCTIONS = [
  'advance',
  'advanceAsync',
  'advanceZeros',
  'advanceZerosAsync',
  'finalize',
  'advanceMany',
  'advanceManyAsync',
] as const;

let loaded: { addon: Sha512ChainAddon | null; reason: string } | undefined;

function isAddon(value: unknown): value is Sha512ChainAddon {
  if (typeof value !== 'object' || value === null) return false;
  const v = value as Record<string, unknown>;
  return (
    ADDON_FUNCTIONS.every((name) => typeof v[name] === 'function') &&
    typeof v['multiBufferLanes'] === 'number' &&
    Array.isArray(v['supportedLanes'])
  );
}

/** Loads the addon on first use; returns null (from then on) when it cannot be loaded. */
export function nativeAddon(): Sha512ChainAddon | null {
  if (loaded) return loaded.addon;
  if (process.env[DISABLE_NATIVE_ENV] === '0') {
    loaded = { addon: null, reason: `disabled by ${DISABLE_NATIVE_ENV}=0` };
    return null;
  }
  try {
    const value: unknown = createRequire(import.meta.url)(process.env[ADDON_PATH_ENV] || ADDON_PATH);
    if (!isAddon(value)) throw new Error(`the module does not export ${ADDON_FUNCTIONS.join(', ')}`);
    loaded = { addon: value, reason: 'loaded' };
  } catch (err) {
    loaded = { addon: null, reason: err instanceof Error ? err.message : String(err) };
  }
  return loaded.addon;
}

/** Why the addon is or is not in use (for diagnostics). */
export function nativeAddonStatus(): string {
  nativeAddon();
  return loaded?.reason ?? 'not loaded';
}
