export { runStandaloneCli, defaultBinaries, USAGE, type CliIo } from './cli.js';
