import { describe, it, expect, jest, beforeAll, afterAll } from '@jest/globals';
import path from 'node:path';
import type * as BlockMapping from './index.js';
import type * as Native from './native.js';
import { allocatedBytes, createSparseFile, makeTempDir, noise, removeTempDir } from './test-support/sparse-files.js';

// This file loads the library with the native addon pointed at a path that does not exist, so every call takes the
// pure TypeScript / util-linux fallback. Jest gives each test file its own module registry, so other spec files
// still see the real addon.
const MiB = 1024 * 1024;
let lib: typeof BlockMapping;
let native: typeof Native;
let dir: string;
let emitWarning: jest.SpiedFunction<typeof process.emitWarning>;

beforeAll(async () => {
  emitWarning = jest.spyOn(process, 'emitWarning').mockImplementation(() => undefined);
  process.env.BIS_BLOCK_MAPPING_ADDON = path.join(path.sep, 'nonexistent', 'block_mapping.node');
  lib = await import('./index.js');
  native = await import('./native.js');
  dir = await makeTempDir();
});
afterAll(async () => {
  delete process.env.BIS_BLOCK_MAPPING_ADDON;
  emitWarning.mockRestore();
  await removeTempDir(dir);
});

describe('without the native addon', () => {
  it('falls back to zero-scan and says so once, without crashing', async () => {
    expect(lib.extentBackend()).toBe('zero-scan');
    expect(lib.extentBackend()).toBe('zero-scan');
    expect(native.nativeAddonStatus()).toMatch(/nonexistent/);
    await lib.getFileLayout(path.join(dir, '..'), {}).catch(() => undefined);
    const ours = emitWarning.mock.calls.filter((args: unknown[]) => JSON.stringify(args[1]).includes('BIS_BLOCK_MAPPING_FALLBACK'));
    expect(ours).toHaveLength(1);
    expect(String(ours[0][0])).toMatch(/native addon not available .* using the zero-scan backend/);
  });

  it('maps a sparse file with zero-scan and refuses an explicit seek-data request', async () => {
    const file = path.join(dir, 'sparse');
    await createSparseFile(file, 6 * MiB, [{ offset: 2 * MiB + 10, data: noise(100) }]);
    const layout = await lib.getFileLayout(file);
    expect(layout.backend).toBe('zero-scan');
    expect(layout.data).toEqual([{ offset: 2 * MiB, length: 4096 }]);
    expect(lib.mapBlocks(layout.data, layout.size)).toEqual([{ offset: 2 * MiB, size: 2 * MiB }]);
    await expect(lib.getFileLayout(file, { backend: 'seek-data' })).rejects.toThrow(
      /extent backend "seek-data" is not available: .*nonexistent/,
    );
  });

  it('punchHole deallocates through the fallocate tool', async () => {
    const file = path.join(dir, 'punch');
    await createSparseFile(file, 4 * MiB, [{ offset: 0, data: noise(4 * MiB) }]);
    const before = await allocatedBytes(file);
    await lib.punchHole(file, 0, 2 * MiB);
    expect(before - (await allocatedBytes(file))).toBe(2 * MiB);
    expect((await lib.getFileLayout(file)).data).toEqual([{ offset: 2 * MiB, length: 2 * MiB }]);
  });
});
