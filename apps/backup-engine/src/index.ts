export { runCli, USAGE, CREDENTIAL_ENV_KEYS, type CliIo } from './cli.js';
