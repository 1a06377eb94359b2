export {
  DEFAULT_CHAIN_SEGMENT,
  SHA512_BLOCK,
  SHA512_INITIAL_STATE,
  type Sha512State,
  nativeSha512ChainAvailable,
  advanceSync,
  advance,
  advanceZeros,
  advanceMany,
  multiBufferLanes,
  finalizeHex,
} from './state.js';
export { Sha512BatchScheduler, sharedSha512Scheduler, type Sha512BatchSchedulerOptions } from './scheduler.js';
export {
  type Sha512Chain,
  encodeChain,
  encodeChainParts,
  decodeChain,
  segmentCount,
  CHAIN_MAGIC,
  CHAIN_VERSION,
  CHAIN_HEADER_BYTES,
  MAX_CHAIN_SEGMENT,
} from './chain.js';
export { Sha512ChainUnavailableError, Sha512ChainMismatchError, Sha512ChainFormatError } from './errors.js';
export { Sha512ChainRecorder } from './recorder.js';
export { Sha512ChainVerifier, type Sha512ChainVerifierOptions } from './verifier.js';
export {
  nativeAddonStatus,
  DISABLE_NATIVE_ENV,
  IMPL_ENV,
  ADDON_PATH_ENV,
  avx512Available,
  avx2Available,
  implAvailable,
  IMPL_LANES,
  sha512ChainImpl,
  type Sha512Impl,
  type Sha512Lanes,
} from './native.js';
export {
  computeFileChain,
  verifyFileChain,
  type ComputeFileChainOptions,
  type VerifyFileChainOptions,
  FILE_CHAIN_READ_SIZE,
  FILE_CHAIN_ZERO_STEP,
} from './file.js';
