/**
 * The narrow entry point of a producer that records a chain while it writes a file (the image sink of
 * `@bis/file-sources` and its hash worker): the recorder and the chain encoding, without the file functions (which
 * load `@bis/block-mapping`).
 */
export { DEFAULT_CHAIN_SEGMENT, nativeSha512ChainAvailable } from './state.js';
export { type Sha512Chain, encodeChain, encodeChainParts, decodeChain } from './chain.js';
export { Sha512ChainRecorder } from './recorder.js';
