import { runDataSourceCli } from './cli.js';
import { exitWithParent } from '@bis/runtime';

// Started by the standalone controller-manager: stop when it is gone (no orphan keeps the disk or its ports).
exitWithParent();

runDataSourceCli(process.argv.slice(2)).then(
  (code) => {
    if (code !== undefined) process.exit(code);
  },
  (e: unknown) => {
    process.stderr.write(`backing-image-data-source: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exit(1);
  },
);
