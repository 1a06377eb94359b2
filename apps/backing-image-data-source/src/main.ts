import { runDataSourceCli } from './cli.js';

runDataSourceCli(process.argv.slice(2)).then(
  (code) => {
    if (code !== undefined) process.exit(code);
  },
  (e: unknown) => {
    process.stderr.write(`backing-image-data-source: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exit(1);
  },
);
