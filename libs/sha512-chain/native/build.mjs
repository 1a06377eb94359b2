#!/usr/bin/env node
// Builds the sha512_chain N-API addon (see tools/scripts/build-native-addon.mjs for how). It also needs
// <nodedir>/include/node/openssl/sha.h: it calls the OpenSSL SHA-512 that the node binary exports. Without it
// nativeSha512ChainAvailable() returns false and callers fall back to a sequential createHash('sha512').
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildNativeAddon } from '../../../tools/scripts/build-native-addon.mjs';

buildNativeAddon({
  nativeDir: dirname(fileURLToPath(import.meta.url)),
  failure: (why) =>
    `@bis/sha512-chain: building the native SHA-512 chain addon failed (${why}); ` +
    'nativeSha512ChainAvailable() will return false and callers fall back to a sequential SHA-512.',
});
