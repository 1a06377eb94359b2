export { runDataSourceCli } from './cli.js';
