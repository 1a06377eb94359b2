export { nativeSha512ChainAvailable, multiBufferLanes } from './state.js';
export { sharedSha512Scheduler } from './scheduler.js';
export { type Sha512Chain, encodeChain, decodeChain } from './chain.js';
export { Sha512ChainMismatchError } from './errors.js';
export { Sha512ChainRecorder } from './recorder.js';
export { Sha512ChainVerifier } from './verifier.js';
export { nativeAddonStatus, sha512ChainImpl } from './native.js';
export { computeFileChain, verifyFileChain } from './file.js';
