#!/usr/bin/env node
// Builds the block_mapping N-API addon (see tools/scripts/build-native-addon.mjs for how). Without it the library
// falls back to its pure TypeScript `zero-scan` backend and says so once at run time.
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildNativeAddon } from '../../../tools/scripts/build-native-addon.mjs';

buildNativeAddon({
  nativeDir: dirname(fileURLToPath(import.meta.url)),
  failure: (why) =>
    `@bis/block-mapping: building the native SEEK_DATA/SEEK_HOLE/PUNCH_HOLE addon failed (${why}); ` +
    'the library will use its slower zero-scan backend.',
});
