import type { FileSourceProvider } from './contract.js';
import { createDownloadClientFor } from './http-client.js';
import { assembleFileSources, type FileSourcesOptions } from './source-provider.js';

export { DEFAULT_STALL_TIMEOUT_MS, loadFileSources, type FileSourceKind, type FileSourcesOptions } from './source-provider.js';

/** Builds the {@link FileSourceProvider} a sync service launches sources through. */
export function createFileSources(options: FileSourcesOptions = {}): FileSourceProvider {
  const client = Promise.resolve(createDownloadClientFor(options));
  return assembleFileSources(options, () => client);
}
